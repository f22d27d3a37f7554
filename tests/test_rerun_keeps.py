"""Issue 43: nothing a user ran is lost on rerun, and a damaged finished run is not skipped.

- the same command after a task file changed (its `limit`): the earlier result is kept beside
  the new one (`<run>~<its config hash>`), not replaced with a one-line note; changed back, the
  kept run is put back (the other kept in its turn), not computed again;
- a finished run whose samples.jsonl was truncated is run again, not skipped as finished; an
  intact one is skipped.
"""
from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

import run
from base.run.pipeline import run as run_pipeline


def _evaluate(compose, tmp_path, out, *overrides):
    cfg = compose(["model=tiny_qwen3", "task=smoke", "logger=none", "method=router_sum", "budget=3",
                   f"artifacts_dir={tmp_path}/artifacts", "diagnose.enabled=false", *overrides])
    return run_pipeline(run.build_config(cfg, out, "method=router_sum,budget=3", "method=router_sum,budget=3"),
                        OmegaConf.to_yaml(cfg, resolve=True))


@pytest.mark.slow
def test_a_rerun_after_the_task_changed_keeps_the_earlier_result(compose, tmp_path, capsys):
    out = tmp_path / "exp" / "budget=3,method=router_sum"
    first = _evaluate(compose, tmp_path, out, "task.limit=3")
    assert first is not None
    second = _evaluate(compose, tmp_path, out, "task.limit=4")  # the task file edited: another prompt pool
    assert second is not None and "kept as" in capsys.readouterr().out
    (kept,) = [p for p in out.parent.iterdir() if p.name.startswith(out.name + "~")]
    assert json.loads((kept / "report.json").read_text())["config_hash"] == first["config_hash"]
    assert json.loads((out / "report.json").read_text())["config_hash"] == second["config_hash"]
    assert len((kept / "samples.jsonl").read_text().splitlines()) == 3
    assert len((out / "samples.jsonl").read_text().splitlines()) == 4
    # the task file edited back: the kept run of that config is put back, not computed again, and the
    # run it replaces is kept in its turn
    capsys.readouterr()
    assert _evaluate(compose, tmp_path, out, "task.limit=3") is None
    assert "is put back instead of run again" in capsys.readouterr().out
    assert json.loads((out / "report.json").read_text())["config_hash"] == first["config_hash"]
    (kept,) = [p for p in out.parent.iterdir() if p.name.startswith(out.name + "~")]
    assert json.loads((kept / "report.json").read_text())["config_hash"] == second["config_hash"]
    assert _evaluate(compose, tmp_path, out, "task.limit=3", "force=true") is not None  # force computes it


@pytest.mark.slow
def test_a_truncated_finished_run_is_run_again_and_an_intact_one_skipped(compose, tmp_path, capsys):
    out = tmp_path / "exp" / "budget=3,method=router_sum"
    assert _evaluate(compose, tmp_path, out, "task.limit=3") is not None
    assert _evaluate(compose, tmp_path, out, "task.limit=3") is None  # intact: skipped
    samples = out / "samples.jsonl"
    samples.write_text("".join(samples.read_text().splitlines(keepends=True)[:2]))  # a truncated copy
    capsys.readouterr()
    again = _evaluate(compose, tmp_path, out, "task.limit=3")
    assert again is not None and "finished but damaged (samples.jsonl has 2 lines, its report says 3)" in \
        capsys.readouterr().out
    assert len(samples.read_text().splitlines()) == 3
    assert not [p for p in out.parent.iterdir() if p.name.startswith(out.name + "~")]  # a damaged run is not kept
