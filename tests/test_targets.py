"""analysis/targets.py: issue 42's targets read from throughput run reports (small fixtures)."""
from __future__ import annotations

import json

import pytest

from analysis import targets


def _row(variant: str, ms: float, batch: int = 16, budget: float | None = 16.0, dense_ms: float = 12.0,
         kept: float = 16.0) -> dict:
    return {"batch_size": batch, "method": variant, "budget": budget, "variant": variant, "mode": "graph",
            "ms_per_step": ms, "tokens_per_s": 1e3 * batch / ms, "speedup_vs_dense": dense_ms / ms,
            "union_mean": 80.0, "kept_mean": kept}


def _runs(tmp_path, gpu: str, base_ms: float, copy_gbps: float | None = 4000.0):
    uniform = [_row("dense", 12.0, budget=None, kept=80.0), _row("base", base_ms), _row("router_sq", base_ms * 1.05),
               _row("oea(k0=1)", base_ms * 0.99, budget=None)]
    profile = [{"batch_size": 16, "variant": "base", "budget": 16.0, "class": c, "ms_per_step": ms,
                "kernels_per_step": n, "kernels_per_layer": n / 48, "graph_ms_per_step": base_ms}
               for c, ms, n in (("router/selection", 0.30, 96), ("expert FFN", 2.0, 144), ("total", 4.0, 432))]
    report = {"model": "qwen3_30b", "routing": "uniform", "moe_layers": 48, "gpu": gpu, "throughput": uniform,
              "profile": profile, "expert_bytes": 9_437_184,
              "provenance": {"commit": "abc1234", "fingerprint": "t1-cuda"}}
    if copy_gbps:
        report["copy_gbps"] = copy_gbps
    (tmp_path / "runs" / "u").mkdir(parents=True)
    (tmp_path / "runs" / "u" / "report.json").write_text(json.dumps(report))
    skewed = {**report, "routing": "skewed", "throughput": [_row("dense", 8.0, budget=None), _row("base", 4.0, dense_ms=8.0)],
              "profile": []}
    (tmp_path / "runs" / "s").mkdir()
    (tmp_path / "runs" / "s" / "report.json").write_text(json.dumps(skewed))
    return tmp_path / "runs"


def _by_target(md_rows) -> dict[str, dict]:
    return {r["target"]: r for r in md_rows.to_dict("records")}


def test_each_target_is_read_from_the_runs_and_judged_against_its_bound(tmp_path):
    runs = _runs(tmp_path, "NVIDIA H200", base_ms=4.0)
    df = targets.collect(runs)
    t = _by_target(targets.table(df, targets.profile_rows(runs), "NVIDIA H200", None))
    assert t[targets.TARGETS["base_ms"].name]["met"] == "yes"  # 4.0 <= 4.2
    assert t[targets.TARGETS["base_x"].name]["measured"] == "3.00×" and t[targets.TARGETS["base_x"].name]["met"] == "yes"
    assert t[targets.TARGETS["skewed_x"].name]["met"] == "yes"  # 8 / 4 = 2.0 >= 1.9
    assert t[targets.TARGETS["b64_x"].name]["met"] == "—"  # no batch-64 run
    assert t[targets.TARGETS["dense_ms"].name]["met"] == "no"  # 12.0 > 11.5
    assert t[targets.TARGETS["kernels"].name]["measured"] == "9.00" and t[targets.TARGETS["kernels"].name]["met"] == "yes"
    assert t[targets.TARGETS["router_ms"].name]["met"] == "yes"  # 0.30 <= 0.35
    # 48 layers x 16 kept x 9.44 MB = 7.25 GB in 2.0 ms: 3.62 TB/s, 0.906 of 4,000 GB/s
    ffn = t[targets.TARGETS["ffn_copy"].name]
    assert ffn["measured"] == "0.91" and ffn["met"] == "yes"
    assert t[targets.TARGETS["near_router_sq"].name]["met"] == "no"  # 5 % slower than base
    assert t[targets.TARGETS["near_oea(k0=1)"].name]["met"] == "yes"
    assert t[targets.TARGETS["near_base_anchor(k0=1)"].name]["met"] == "—"


def test_milliseconds_on_another_gpu_are_marked_and_no_copy_bandwidth_is_not_measured(tmp_path):
    runs = _runs(tmp_path, "NVIDIA H100 80GB HBM3", base_ms=4.0, copy_gbps=None)
    t = _by_target(targets.table(targets.collect(runs), targets.profile_rows(runs), "NVIDIA H100 80GB HBM3", None))
    assert t[targets.TARGETS["base_ms"].name]["met"] == "yes (other GPU: set for an H200)"
    assert t[targets.TARGETS["base_x"].name]["met"] == "yes"  # a ratio: no mark
    assert t[targets.TARGETS["ffn_copy"].name]["measured"] == "not measured"


def test_the_gpu_test_row_counts_failures_from_the_junit_xml(tmp_path, capsys):
    runs = _runs(tmp_path, "NVIDIA H200", base_ms=4.0)
    xml = tmp_path / "gpu_tests.xml"
    xml.write_text('<testsuites><testsuite tests="5" failures="1" errors="0" skipped="2"></testsuite></testsuites>')
    targets.main([str(runs), "--gpu-tests", str(xml)])
    out = capsys.readouterr().out
    assert "2 passed, 1 failed, 2 skipped" in out
    assert "abc1234" in out and "t1-cuda" in out  # the engine and commit that made the runs


@pytest.mark.parametrize("bad", ["runs_missing", "xml_missing"])
def test_a_missing_input_fails_with_a_message(tmp_path, bad):
    runs = _runs(tmp_path, "NVIDIA H200", base_ms=4.0)
    args = [str(tmp_path / "nope")] if bad == "runs_missing" else [str(runs), "--gpu-tests", str(tmp_path / "no.xml")]
    with pytest.raises(SystemExit, match="error: .*(folder of throughput runs|JUnit XML)"):
        targets.main(args)


def test_several_folders_make_one_table_and_runs_of_one_cell_give_their_median(tmp_path, capsys):
    """The skewed run in a second folder fills its target; a third run of the uniform cell beside the
    first (another folder) is not refused, as the throughput tables refuse it: its ratio and the
    first's give their median."""
    runs = _runs(tmp_path, "NVIDIA H200", base_ms=4.0)
    more = tmp_path / "more"
    (runs / "s").rename(tmp_path / "s_moved")
    more.mkdir()
    (tmp_path / "s_moved").rename(more / "s")
    again = json.loads((runs / "u" / "report.json").read_text())
    again["throughput"] = [_row("dense", 12.0, budget=None, kept=80.0), _row("base", 6.0)]
    (more / "u2").mkdir()
    (more / "u2" / "report.json").write_text(json.dumps(again))
    targets.main([str(runs), str(more)])
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert f"`{runs}`, `{more}`" in out
    assert "2.00×" in rows[targets.TARGETS["skewed_x"].name]  # from the second folder
    assert "2.50×" in rows[targets.TARGETS["base_x"].name]  # median of 12/4 = 3.00 and 12/6 = 2.00


def test_runs_of_two_commits_or_gpus_for_one_configuration_are_refused(tmp_path, capsys):
    """A second uniform batch-16 run from another commit (or another GPU) would be pooled into the
    targets' median: refused, naming the configuration and each commit and GPU; a second folder
    holding only another configuration is fine."""
    runs = _runs(tmp_path, "NVIDIA H200", base_ms=4.0)
    report = json.loads((runs / "u" / "report.json").read_text())
    for name, change in (("commit", {"provenance": {"commit": "def5678", "fingerprint": "t1-cuda"}}),
                         ("gpu", {"gpu": "NVIDIA H100 80GB HBM3"})):
        other = tmp_path / f"other_{name}"
        (other / "u").mkdir(parents=True)
        (other / "u" / "report.json").write_text(json.dumps({**report, **change}))
        with pytest.raises(SystemExit, match="uniform batch 16: ") as e:
            targets.main([str(runs), str(other)])
        assert "abc1234 on NVIDIA H200" in str(e.value)
        assert ("def5678 on NVIDIA H200" if name == "commit" else "abc1234 on NVIDIA H100") in str(e.value)
        assert "skewed" not in str(e.value)  # one run of the skewed cell: fine
    assert "Issue 42" not in capsys.readouterr().out  # nothing printed before the refusal
