"""Issue 40: every committed results table has an engine column, and an analysis that pools or
compares rows of different decode engines says so or refuses (analysis/engines.py).

The committed tables: each carries `engine` with no empty value, the value its rule and its runs
give. `python -m analysis.engines stamp` appends the column and changes no other byte. Each writer
(analysis.ablation, quality, quality_diff, throughput, serving, stream, stream_order,
throughput_ablation, throughput_forms, prefill_buckets, ab_throughput, compare_runs, kernel_ab,
cross_grid, experiments.routing_stats) writes the column from the runs it reads, on small run
trees written here, and refuses runs of two engines where its table compares them."""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import engines as E

ROOT = Path(__file__).resolve().parents[1]


def _refused(capsys, fn, text="decode engines"):
    with pytest.raises(SystemExit) as e:
        fn()
    assert e.value.code == 2 and text in capsys.readouterr().err


# ---- the committed tables ------------------------------------------------------------------------

def test_every_committed_table_has_an_engine_column_without_an_empty_value():
    tables = E.committed_tables(ROOT)
    assert len(tables) > 300 and "results/cross_grid.csv" in tables and "results/quality_mini.csv" in tables
    assert not any(t.startswith(("results/archive/", "results/records/", "results/replication")) for t in tables)
    assert E.lacking(ROOT) == []


@pytest.mark.slow
def test_each_committed_tables_engine_is_what_its_rule_and_its_runs_give():
    wrong = []
    for rel in E.committed_tables(ROOT):
        t = E._frame(E._split((ROOT / rel).read_text())[1])
        engine = E.table_engine(ROOT, rel)
        want = E.PER_ROW_RULES[rel](t.drop(columns="engine"), ROOT) if engine == E.PER_ROW else [engine] * len(t)
        if list(t["engine"]) != list(want):
            wrong.append(rel)
    assert wrong == []


def test_the_rules_name_the_static_grids_the_gpu_areas_and_the_tables_of_no_engine():
    assert E.rule_engine("results/quality_seeds_mini_olmoe_paired.csv") == "s1-generate-cpu"
    assert E.rule_engine("results/quality_mini_diff.csv") == "s1-generate-cpu"
    assert E.rule_engine("results/quality_mini_predictor_r2.csv") == "none (fit)"
    assert E.rule_engine("results/routing/olmoe_top4_control/routing_stats.csv") == "none (teacher-forced forward)"
    assert E.rule_engine("results/roofline/grid_2026-12-04c/select/bench_select.csv") == "none (kernel benchmark)"
    assert E.rule_engine("results/roofline/grid_2026-12-02e/logs/gpu_state.csv") == "none (nvidia-smi log)"
    assert E.rule_engine("results/serve/grid_2026-12-04b/summary.csv") == "t1-cuda"
    assert E.rule_engine("results/cross_grid.csv") == E.PER_ROW
    assert E.rule_engine("results/somewhere_new/table.csv") is None
    assert not E.stamped_here("results/replication_paired.csv") and not E.stamped_here("results/archive/x.csv")


# ---- stamping --------------------------------------------------------------------------------------

def test_stamping_appends_the_column_and_keeps_every_other_byte():
    text = "# made by a command\nlayer,r2,note\n0,0.9193947315216064,\n1,1e-05,\"a, b\"\n"
    assert E.stamp_text(text, "none (fit)") == (
        "# made by a command\nlayer,r2,note,engine\n0,0.9193947315216064,,none (fit)\n1,1e-05,\"a, b\",none (fit)\n")
    assert E.stamp_text("a\n1\n2\n", ["x", "y, z"]) == 'a,engine\n1,x\n2,"y, z"\n'
    assert E.stamp_text("\n", "t1-cuda") == "engine\n"  # pandas' empty table: no rows, no columns
    with pytest.raises(E.StampError, match="line break"):
        E.stamp_text('a\n"x\ny"\n', "t1-cuda")
    with pytest.raises(E.StampError, match="3 engines for 2 rows"):
        E.stamp_text("a\n1\n2\n", ["x", "y", "z"])


def _throughput_run(d: Path, device="cuda:0", stage="throughput") -> Path:
    d.mkdir(parents=True)
    pd.DataFrame({"batch_size": [16], "ms_per_step": [5.0]}).to_csv(d / "throughput.csv", index=False)
    (d / "report.json").write_text(json.dumps({"stage": stage, "model": "m", "device": device}))
    return d


def test_stamp_follows_the_rules_checks_them_against_the_runs_and_skips_stamped_tables(tmp_path):
    res = tmp_path / "results"
    res.mkdir()
    (res / "rules_mini.csv").write_text("method,mean\nbase,0.5\n")
    (res / "rules_mini_predictor_r2.csv").write_text("layer,r2\n0,0.9\n")
    (res / "done.csv").write_text("a,engine\n1,c3-packed-cpu\n")
    _throughput_run(res / "throughput" / "runs" / "r1")
    _throughput_run(res / "newarea" / "runs" / "r2", device="cpu")
    done = E.stamp(tmp_path)
    assert done == {"results/newarea/runs/r2/throughput.csv": "t1-cpu",  # no rule: its run folder's
                    "results/rules_mini.csv": "s1-generate-cpu", "results/rules_mini_predictor_r2.csv": "none (fit)",
                    "results/throughput/runs/r1/throughput.csv": "t1-cuda"}
    assert (res / "rules_mini.csv").read_text() == "method,mean,engine\nbase,0.5,s1-generate-cpu\n"
    assert E.stamp(tmp_path) == {} and E.lacking(tmp_path) == []  # re-runnable: nothing left to stamp
    # a run the rule contradicts (a CPU timing run under results/throughput/) is an error, nothing written
    _throughput_run(res / "throughput" / "runs" / "r3", device="cpu")
    with pytest.raises(E.StampError, match="t1-cpu"):
        E.stamp(tmp_path)
    assert "engine" not in (res / "throughput" / "runs" / "r3" / "throughput.csv").read_text()
    (res / "orphan").mkdir()
    (res / "orphan" / "t.csv").write_text("a\n1\n")
    with pytest.raises(E.StampError, match="no rule"):
        E.stamp(tmp_path, ["results/orphan/t.csv"])
    (res / "gap.csv").write_text("a,engine\n1,\n")
    with pytest.raises(E.StampError, match="empty values"):
        E.stamp(tmp_path, ["results/gap.csv"])


def test_the_stamp_command_refuses_a_file_that_is_not_a_results_table(capsys):
    assert E.main(["stamp", str(ROOT / "README.md")]) == 2
    assert "not a table that carries the column" in capsys.readouterr().err


# ---- the writers: the quality grids --------------------------------------------------------------

@pytest.mark.slow
def test_the_ablation_tables_carry_the_runs_engine_and_a_folder_of_two_is_refused(tmp_path):
    from analysis.ablation import main as ablation_main
    from tests.outputs_fixture import fidelity_run

    rng = np.random.default_rng(0)
    correct = (rng.random(40) < 0.7).astype(int)
    for method in ("base", "router_sum"):
        fidelity_run(tmp_path / "grid", method, 6, 0, correct, rng.gamma(2.0, 0.05, 40), [0.9] * 10, [0.1] * 10,
                     engine="c3-packed-cpu")
    ablation_main(str(tmp_path / "grid"), str(tmp_path / "res" / "grid"))
    for name in ("grid.csv", "grid_paired.csv"):
        t = pd.read_csv(tmp_path / "res" / name)
        assert t.columns[-1] == "engine" and set(t["engine"]) == {"c3-packed-cpu"}
    assert "Decode engine: `c3-packed-cpu`" in (tmp_path / "res" / "grid.md").read_text()
    fidelity_run(tmp_path / "grid", "router_sq", 6, 0, correct, rng.gamma(2.0, 0.05, 40), [0.9] * 10, [0.1] * 10,
                 engine="s1-generate-cpu")
    with pytest.raises(SystemExit, match="engine=s1-generate-cpu"):
        ablation_main(str(tmp_path / "grid"), str(tmp_path / "res" / "grid"))


def test_the_quality_table_carries_its_runs_engine(tmp_path):
    from analysis.quality import quality_table
    from tests.outputs_fixture import make_outputs

    t = quality_table(str(make_outputs(tmp_path) / "qs_fixture"))
    assert t.columns[-1] == "engine" and set(t["engine"]) == {"s1-generate-cpu"}  # static batches on the CPU


@pytest.mark.slow
def test_the_quality_diff_takes_its_sources_engine_and_refuses_two(tmp_path, capsys):
    from analysis.quality_diff import main

    rows = [{"variant": v, "budget": b, "accuracy": a} for v, b, a in
            (("base", 6, 0.8), ("router_sum", 6, 0.7), ("base", 8, 0.85), ("router_sum", 8, 0.8))]
    src = tmp_path / "quality_mini.csv"
    pd.DataFrame(rows).to_csv(src, index=False)  # written before the column: its grid's engine
    main(str(src), str(tmp_path / "diff"), 100)
    assert set(pd.read_csv(tmp_path / "diff.csv")["engine"]) == {"s1-generate-cpu"}
    pd.DataFrame(rows).assign(engine="c3-packed-cpu").to_csv(src, index=False)
    main(str(src), str(tmp_path / "diff"), 100)
    t = pd.read_csv(tmp_path / "diff.csv")
    assert t.columns[-1] == "engine" and set(t["engine"]) == {"c3-packed-cpu"}
    pd.DataFrame(rows).assign(engine=["c3-packed-cpu", "s1-generate-cpu"] * 2).to_csv(src, index=False)
    _refused(capsys, lambda: main(str(src), str(tmp_path / "diff"), 100))


@pytest.mark.slow
def test_the_cross_grid_table_names_each_comparisons_engine_and_refuses_a_table_of_two(tmp_path, capsys):
    from analysis import cross_grid as F
    from analysis.ablation import main as ablation_main
    from tests.outputs_fixture import fidelity_run

    rng = np.random.default_rng(1)
    correct = (rng.random(40) < 0.8).astype(int)
    for method in ("base", "router_sum"):
        fidelity_run(tmp_path / "grid", method, 6, 0, correct, rng.gamma(2.0, 0.05, 40), [0.9] * 10, [0.1] * 10,
                     engine="c3-packed-cpu")
    res = tmp_path / "results"
    ablation_main(str(tmp_path / "grid"), str(res / "grid"))
    # a table written before the column: its grid's engine (analysis/engines.py LEGACY_GRIDS)
    from analysis.quality_diff import quality_diffs

    quality_diffs(pd.DataFrame([{"variant": v, "budget": 6, "accuracy": a} for v, a in (("base", 0.8), ("r", 0.7))]),
                  n=100).to_csv(res / "quality_mini_diff.csv", index=False)
    assert F.write(res) == ["grid_paired", "quality_mini_diff"]
    t = pd.read_csv(res / "grid_paired.csv")
    assert t.columns[-1] == "engine" and "scope" in t  # the cross-grid columns added before it
    long = pd.read_csv(res / "cross_grid.csv")
    assert long.columns[-1] == "engine"
    assert dict(zip(long["table"], long["engine"])) == {"grid_paired": "c3-packed-cpu", "quality_mini_diff": "s1-generate-cpu"}
    assert "pools the comparisons of 2 decode engine(s)" in (res / "cross_grid.md").read_text()
    t.loc[0, "engine"] = "s1-generate-cpu"
    t.to_csv(res / "grid_paired.csv", index=False)
    _refused(capsys, lambda: F.apply(res))


# ---- the writers: timing runs ----------------------------------------------------------------------

def _timing_run(d: Path, device="cuda:0", model="m") -> None:
    rows = [{"batch_size": 16, "method": m, "budget": b, "variant": m, "mode": "graph", "ms_per_step": ms,
             "tokens_per_s": 16e3 / ms, "union_mean": 60.0, "kept_mean": b or 60.0, "non_expert_ms": 8.0,
             "moe_share": 0.5, "speedup_vs_dense": 20.0 / ms}
            for m, b, ms in (("dense", None, 20.0), ("base", 16, 10.0))]
    d.mkdir(parents=True)
    (d / "report.json").write_text(json.dumps({"stage": "throughput", "model": model, "device": device,
                                               "throughput": rows}))


def test_the_throughput_table_carries_its_runs_engine_and_refuses_two(tmp_path, capsys):
    from analysis import throughput

    _timing_run(tmp_path / "runs" / "a")
    _timing_run(tmp_path / "runs" / "b", model="m2")
    throughput.main(str(tmp_path / "runs"), str(tmp_path / "out" / "summary"))
    t = pd.read_csv(tmp_path / "out" / "summary.csv")
    assert t.columns[-1] == "engine" and set(t["engine"]) == {"t1-cuda"}
    _timing_run(tmp_path / "runs" / "c", device="cpu", model="m3")
    _refused(capsys, lambda: throughput.collect(tmp_path / "runs"))


def test_the_serving_tables_carry_the_runs_engine(tmp_path):
    from analysis import serving
    from tests.test_serving import _finished, _stream_row

    (tmp_path / "run").mkdir()
    rows = [_stream_row(v, b, None, 0, i, tok, 10.0, 1.0) for i, (v, b, tok) in
            enumerate((("dense", None, 100), ("base", 16, 150)))]
    pd.DataFrame(rows).to_csv(tmp_path / "run" / "serve.csv", index=False)
    _finished(tmp_path / "run")
    serving.main(str(tmp_path), str(tmp_path / "out" / "summary"))
    t = pd.read_csv(tmp_path / "out" / "summary.csv")
    assert t.columns[-1] == "engine" and set(t["engine"]) == {"t1-cuda"}
    assert "Decode engine: `t1-cuda`" in (tmp_path / "out" / "summary.md").read_text()


def test_the_stream_tables_carry_the_runs_engine_and_refuse_two(tmp_path, capsys):
    from analysis import stream, stream_order
    from tests.test_stream_analysis import _row

    for name, device in (("a", "cuda:0"), ("b", "cuda:0")):
        (tmp_path / "runs" / name).mkdir(parents=True)
        pd.DataFrame([_row("dense", None, 10.0, 6.0), _row("base", 16, 6.0, 3.0)]).to_csv(
            tmp_path / "runs" / name / "stream.csv", index=False)
        (tmp_path / "runs" / name / "report.json").write_text(json.dumps(
            {"stage": "throughput", "model": name, "routing": "uniform", "device": device}))
    stream.main(str(tmp_path / "runs"), str(tmp_path / "out" / "summary"))
    stream_order.main(str(tmp_path / "runs"), str(tmp_path / "out" / "order"))
    for name in ("summary.csv", "order.csv"):
        t = pd.read_csv(tmp_path / "out" / name)
        assert t.columns[-1] == "engine" and set(t["engine"]) == {"t1-cuda"}
    (tmp_path / "runs" / "b" / "report.json").write_text(json.dumps({"stage": "throughput", "model": "b",
                                                                     "routing": "uniform", "device": "cpu"}))
    _refused(capsys, lambda: stream.load(tmp_path / "runs"))


def test_the_throughput_ablation_carries_each_runs_engine_and_pairs_one_engines_runs_only(tmp_path, capsys):
    from analysis import throughput_ablation
    from tests.test_throughput_ablation import _run

    _run(tmp_path / "a", "modules", {"dense": 12.0, "base": 6.0}, 17.5)
    _run(tmp_path / "b", "layer", {"dense": 10.0, "base": 5.0}, 15.5)
    for run, device in (("a", "cuda:0"), ("b", "cuda:0")):
        rep = json.loads((tmp_path / run / "report.json").read_text())
        (tmp_path / run / "report.json").write_text(json.dumps({**rep, "stage": "throughput", "device": device}))
    throughput_ablation.main(str(tmp_path), str(tmp_path / "out" / "summary"))
    t = pd.read_csv(tmp_path / "out" / "summary.csv")
    assert t.columns[-1] == "engine" and set(t["engine"]) == {"t1-cuda"}
    rep = json.loads((tmp_path / "b" / "report.json").read_text())
    (tmp_path / "b" / "report.json").write_text(json.dumps({**rep, "device": "cpu"}))
    _refused(capsys, lambda: throughput_ablation.main(str(tmp_path), str(tmp_path / "out" / "summary")))


def test_the_forms_table_carries_its_runs_engine(tmp_path):
    from analysis import throughput_forms

    run = tmp_path / "run"
    run.mkdir()
    pd.DataFrame([{"batch_size": 16, "variant": v, "budget": 16, "mode": "graph", "ms_runs": runs}
                  for v, runs in (("base", "5.0;5.2"), ("base+fused", "4.0;4.4"))]).to_csv(run / "throughput.csv",
                                                                                         index=False)
    (run / "report.json").write_text(json.dumps({"stage": "throughput", "device": "cuda:0"}))
    throughput_forms.main(str(run), str(tmp_path / "forms"))
    t = pd.read_csv(tmp_path / "forms.csv")
    assert t.columns[-1] == "engine" and set(t["engine"]) == {"t1-cuda"}


def _serve_folder(d: Path, device: str, prefill_s: float) -> Path:
    d.mkdir(parents=True)
    (d / "config.yaml").write_text("scheduler:\n  packing: packed\n  chunked: false\n  buckets: [64, 128]\n")
    pd.DataFrame([{"variant": "base", "repeat": 0, "prefills": 2, "prefill_s": prefill_s}]).to_csv(d / "serve.csv",
                                                                                                  index=False)
    with gzip.open(d / "requests.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps({"variant": "base", "repeat": 0, "round": r, "prompt_tokens": n}) + "\n"
                        for r, n in ((0, 100), (1, 50))))
    (d / "report.json").write_text(json.dumps({"stage": "throughput", "device": device}))
    return d


def test_the_prefill_fit_carries_its_runs_engine_and_pools_one_engines_runs_only(tmp_path, monkeypatch, capsys):
    from analysis import prefill_buckets

    assert set(prefill_buckets.streams(_serve_folder(tmp_path / "a", "cuda:0", 0.1))["engine"]) == {"t1-cuda"}
    _serve_folder(tmp_path / "b", "cpu", 0.3)
    monkeypatch.setattr(sys, "argv", ["prefill_buckets", str(tmp_path), "--buckets", "64,128"])
    _refused(capsys, prefill_buckets.main)


def _ab_run(d: Path, ms: float, device="cuda:0") -> Path:
    d.mkdir(parents=True)
    pd.DataFrame([{"batch_size": 16, "variant": "base", "budget": 16, "mode": "graph", "ms_per_step": ms,
                   "tokens_per_s": 16e3 / ms}]).to_csv(d / "throughput.csv", index=False)
    (d / "report.json").write_text(json.dumps({"stage": "throughput", "device": device}))
    return d


def test_the_ab_table_carries_the_engine_and_refuses_a_reference_of_another(tmp_path, capsys):
    from analysis.ab_throughput import compare

    runs = [_ab_run(tmp_path / "1_new", 5.0), _ab_run(tmp_path / "2_old", 5.1)]
    t = compare(runs, _ab_run(tmp_path / "ref", 5.05))
    assert t.columns[-1] == "engine" and set(t["engine"]) == {"t1-cuda"}
    _refused(capsys, lambda: compare(runs, _ab_run(tmp_path / "cpu_ref", 50.0, device="cpu")))


def test_the_ab_table_reads_a_run_that_kept_only_its_report_and_shows_the_expert_streams_share_of_copy(tmp_path):
    from analysis.ab_throughput import compare

    def report_only(d: Path, ms: float, expert_ms: float) -> Path:
        d.mkdir(parents=True)
        row = {"batch_size": 16, "variant": "base", "budget": 16}
        (d / "report.json").write_text(json.dumps({
            "stage": "throughput", "device": "cuda:0", "moe_layers": 2, "expert_bytes": 1e9, "copy_gbps": 1000.0,
            "throughput": [{**row, "mode": "graph", "ms_per_step": ms, "tokens_per_s": 16e3 / ms, "kept_mean": 4.0}],
            "profile": [{**row, "class": "expert FFN", "ms_per_step": expert_ms},
                        {**row, "class": "total", "ms_per_step": ms}]}))
        return d

    # 2 layers x 4 kept x 1 GB = 8 GB a step: in 16 ms 0.5 TB/s, half of 1 TB/s copy; in 10 ms 0.8
    runs = [report_only(tmp_path / "1_old", 20.0, 16.0), report_only(tmp_path / "2_new", 12.0, 10.0)]
    t = compare(runs, _ab_run(tmp_path / "ref", 20.0)).iloc[0]
    assert (t["old_median"], t["new_median"]) == (20.0, 12.0)
    assert t["old_expert_of_copy"] == pytest.approx(0.5) and t["new_expert_of_copy"] == pytest.approx(0.8)
    assert t["new_vs_old"] == pytest.approx(-0.4)


def test_the_run_comparison_names_both_engines_where_they_differ(tmp_path):
    from analysis.compare_runs import compare

    for root, on in (("a", False), ("b", True)):
        d = tmp_path / root / "run"
        d.mkdir(parents=True)
        (d / "samples.jsonl").write_text(json.dumps({"task": "t", "doc_id": 0, "correct": 1.0}) + "\n")
        (d / "report.json").write_text(json.dumps({"stage": "evaluate", "device": "cpu", "eval": {"engine": on}}))
    t = compare(tmp_path / "a", tmp_path / "b")
    assert list(t["engine"]) == ["s1-generate-cpu vs s1-engine-cpu"] and t.columns[-1] == "engine"
    assert set(compare(tmp_path / "a", tmp_path / "a")["engine"]) == {"s1-generate-cpu"}


def test_a_kernel_tables_engine_is_no_case_and_two_are_refused(tmp_path):
    import subprocess

    from analysis.kernel_ab import case_columns

    rows = [{"rule": "base", "T": 16, "impl": impl, "round": r, "us": us, "timing": "graph",
             "engine": "none (kernel benchmark)"} for r in range(2) for impl, us in (("current", 5.0), ("baseline", 6.0))]
    assert "engine" not in case_columns(pd.DataFrame(rows))
    path = tmp_path / "t.csv"
    pd.DataFrame(rows).assign(engine=["a", "b"] * 2).to_csv(path, index=False)
    out = subprocess.run([sys.executable, "-m", "analysis.kernel_ab", str(path)], check=False, capture_output=True,
                         text=True, cwd=ROOT)
    assert out.returncode == 2 and "2 decode engines" in out.stderr


def test_the_routing_statistics_say_no_decode_engine_made_them(tmp_path):
    from experiments.routing_stats import write

    df = pd.DataFrame([{"model": "mini", "layer": "0", "experts": 32, "top_k": 4, "decode_tokens": 10,
                        "first_share": 0.5}, {"model": "mini", "layer": "mean", "experts": 32, "top_k": 4,
                                              "decode_tokens": 10, "first_share": 0.5}])
    write(df, tmp_path, "python -m experiments.routing_stats")
    t = pd.read_csv(tmp_path / "routing_stats.csv", comment="#")
    assert t.columns[-1] == "engine" and set(t["engine"]) == {"none (teacher-forced forward)"}
    assert (tmp_path / "routing_stats.csv").read_text().startswith("# python -m experiments.routing_stats\n")
