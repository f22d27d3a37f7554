"""base/run/dense_reuse.py: dense ignores the budget, so in a sweep over budgets a dense evaluation
takes a finished dense sibling's outputs (same config but for budget) instead of decoding again;
any other difference, a budgeted rule, force=true or a damaged sibling decodes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import run
from base.run import outputs, pipeline
from base.run.pipeline import run as run_pipeline

FAST = ["model=tiny_qwen3", "task=smoke", "logger=none", "diagnose.enabled=false"]


def _run(compose, out: Path, *overrides: str, extra_files: dict[str, str] | None = None) -> dict | None:
    cfg = compose([*FAST, *overrides])
    return run_pipeline(run.build_config(cfg, out), OmegaConf.to_yaml(cfg, resolve=True), extra_files)


def _decodes(monkeypatch) -> list[str]:
    """Counts the stage runs (decodes) from here on."""
    seen: list[str] = []
    real = pipeline._run_stage

    def counted(cfg, *args, **kwargs):
        seen.append(cfg.method.name)
        return real(cfg, *args, **kwargs)

    monkeypatch.setattr(pipeline, "_run_stage", counted)
    return seen


def test_a_dense_sweep_point_at_another_budget_takes_the_finished_ones_outputs(compose, tmp_path, monkeypatch):
    exp = tmp_path / "exp"
    _run(compose, exp / "budget=2,method=dense", "method=dense", "budget=2", f"artifacts_dir={tmp_path}/a")
    decodes = _decodes(monkeypatch)
    report = _run(compose, exp / "budget=4,method=dense", "method=dense", "budget=4", f"artifacts_dir={tmp_path}/a")
    assert decodes == []
    first, second = exp / "budget=2,method=dense", exp / "budget=4,method=dense"
    assert report["reused_from"] == first.name
    assert (second / "samples.jsonl").read_bytes() == (first / "samples.jsonl").read_bytes()
    recorded = (second / "config.yaml").read_text()
    assert "budget: 4" in recorded and json.loads((second / "report.json").read_text())["config_hash"] == \
        outputs.config_hash(recorded)
    assert not outputs.damaged(second)
    # now finished itself: a rerun skips it as any finished run
    assert _run(compose, second, "method=dense", "budget=4", f"artifacts_dir={tmp_path}/a") is None and decodes == []


@pytest.mark.slow  # the fast tier keeps the sweep's test
@pytest.mark.parametrize("other", [["method=dense", "budget=4", "seed=1"], ["method=router_sum", "budget=2"],
                                   ["method=dense", "budget=4", "force=true"]])
def test_a_run_that_differs_in_more_than_dense_s_budget_decodes(compose, tmp_path, monkeypatch, other):
    exp = tmp_path / "exp"
    _run(compose, exp / "first", "method=dense", "budget=2", f"artifacts_dir={tmp_path}/a")
    decodes = _decodes(monkeypatch)
    report = _run(compose, exp / "second", *other, f"artifacts_dir={tmp_path}/a")
    assert len(decodes) == 1 and "reused_from" not in report


@pytest.mark.slow
def test_a_damaged_sibling_is_not_copied(compose, tmp_path, monkeypatch):
    exp = tmp_path / "exp"
    _run(compose, exp / "first", "method=dense", "budget=2", f"artifacts_dir={tmp_path}/a")
    samples = exp / "first" / "samples.jsonl"
    samples.write_text("".join(samples.read_text().splitlines(keepends=True)[:-1]))  # truncated
    decodes = _decodes(monkeypatch)
    report = _run(compose, exp / "second", "method=dense", "budget=4", f"artifacts_dir={tmp_path}/a")
    assert decodes == ["dense"] and "reused_from" not in report


@pytest.mark.slow
def test_analysis_counts_dense_s_copies_once_without_calling_them_a_repeat(compose, tmp_path, capsys):
    """A copy is one measurement with its source, whichever sorts first (budget=10 before budget=4);
    dense decoded twice is a repeated measurement, counted once with a warning."""
    from analysis.compare import compare
    from analysis.load import RunSet

    exp = tmp_path / "exp"
    for budget in (4, 10):
        _run(compose, exp / f"budget={budget},method=dense", "method=dense", f"budget={budget}",
             f"artifacts_dir={tmp_path}/a")
    assert "reused_from" in json.loads((exp / "budget=10,method=dense" / "report.json").read_text())
    capsys.readouterr()
    assert len(RunSet(tmp_path).evaluations) == 1 and len(compare(str(exp))) == 1
    assert "same measurement" not in capsys.readouterr().err
    _run(compose, exp / "again", "method=dense", "budget=4", "force=true", f"artifacts_dir={tmp_path}/a")
    assert len(RunSet(tmp_path).evaluations) == 1 and len(compare(str(exp))) == 1
    assert "same measurement" in capsys.readouterr().err


@pytest.mark.slow
def test_copies_name_the_run_that_decoded_and_hold_their_own_hydra_files(compose, tmp_path, monkeypatch):
    """A third budget copies the run that decoded, not a copy (reused_from names it), and a copy holds
    the Hydra files its own start passed (run.py's extra_files), not the sibling's."""
    exp, a = tmp_path / "exp", f"artifacts_dir={tmp_path}/a"
    _run(compose, exp / "b8", "method=dense", "budget=8", a)
    _run(compose, exp / "b16", "method=dense", "budget=16", a)
    decodes = _decodes(monkeypatch)
    report = _run(compose, exp / "b12", "method=dense", "budget=12", a, extra_files={".hydra/overrides.yaml": "- budget=12\n"})
    assert decodes == [] and report["reused_from"] == "b8"
    assert (exp / "b12" / ".hydra" / "overrides.yaml").read_text() == "- budget=12\n"


@pytest.mark.slow
def test_a_sibling_decoded_by_other_code_is_not_copied(compose, tmp_path, monkeypatch):
    """A config does not show every engine change (the prefill compiled since 110fd43): a sibling
    decoded at another commit decodes again."""
    exp, a = tmp_path / "exp", f"artifacts_dir={tmp_path}/a"
    _run(compose, exp / "b2", "method=dense", "budget=2", a)
    path = exp / "b2" / "report.json"
    report = json.loads(path.read_text())
    report["provenance"]["commit"] = "0000000"
    path.write_text(json.dumps(report))
    decodes = _decodes(monkeypatch)
    assert "reused_from" not in _run(compose, exp / "b4", "method=dense", "budget=4", a) and decodes == ["dense"]


def test_a_paired_comparison_of_a_run_and_its_copy_says_it_compares_a_run_with_itself(tmp_path):
    from analysis.paired import copy_note

    for name, report in (("b2", {}), ("b4", {"reused_from": "b2"}), ("b8", {"reused_from": "b2"}), ("other", {})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps(report))
    assert "one decode (b2's outputs" in copy_note(tmp_path / "b2", tmp_path / "b4")
    assert copy_note(tmp_path / "b4", tmp_path / "b8") is not None  # two copies of one run
    assert copy_note(tmp_path / "b2", tmp_path / "other") is None


@pytest.mark.slow  # the fast tier keeps dense's sweep test
def test_oea_reads_no_budget_so_its_sweep_points_decode_once(compose, tmp_path, monkeypatch):
    """oea keeps every token's top-k0 whatever the budget: its second budget is a copy; a change of
    k0 decodes."""
    exp, a = tmp_path / "exp", f"artifacts_dir={tmp_path}/a"
    _run(compose, exp / "budget=2,method=oea", "method=oea", "method.k0=1", "budget=2", a)
    decodes = _decodes(monkeypatch)
    report = _run(compose, exp / "budget=8,method=oea", "method=oea", "method.k0=1", "budget=8", a)
    assert decodes == [] and report["reused_from"] == "budget=2,method=oea"
    _run(compose, exp / "k0=2", "method=oea", "method.k0=2", "budget=8", a)
    assert decodes == ["oea"]
