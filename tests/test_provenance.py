"""base/run/provenance.py's commit: git's HEAD, or the commit BASE_COMMIT names (a device machine's
copy of .git can be older than the working tree it runs, and its runs named the wrong commit); a
value that is no commit is refused at start, before anything is written."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import run
from base.config import ConfigError
from base.run.pipeline import run as run_pipeline
from base.run.provenance import commit

ROOT = Path(__file__).resolve().parents[1]


def test_the_commit_is_heads_unless_base_commit_names_one(monkeypatch):
    monkeypatch.delenv("BASE_COMMIT", raising=False)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    here = commit(ROOT)
    assert here["commit"] == head and isinstance(here["dirty"], bool) and "commit_from" not in here
    monkeypatch.setenv("BASE_COMMIT", "d85acdf")
    assert commit(ROOT) == {"commit": "d85acdf", "dirty": None, "commit_from": "BASE_COMMIT"}


@pytest.mark.parametrize("value", ["HEAD", "d85ac", "d85acdf!"])
def test_a_base_commit_that_is_no_commit_is_refused_at_start(compose, tmp_path, monkeypatch, value):
    monkeypatch.setenv("BASE_COMMIT", value)
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=f"BASE_COMMIT={value!r} is not a commit: give 7 to 40 hex digits"):
        cfg = compose(["model=tiny_qwen3", "task=smoke", "logger=none", f"artifacts_dir={tmp_path}/artifacts"])
        run_pipeline(run.build_config(cfg, out), OmegaConf.to_yaml(cfg))
    assert not out.exists() and not (tmp_path / "artifacts").exists()


def test_a_gpu_run_names_the_tuned_table_its_launches_read(tmp_path, monkeypatch):
    from kernels import tuned

    monkeypatch.setattr(tuned, "CONFIG_DIR", tmp_path)
    assert tuned.table_record("Some_GPU") == {"file": None}
    (tmp_path / "Some_GPU.json").write_text('{"a": {"use": true}, "b": {}}')
    first = tuned.table_record("Some_GPU")
    assert first["file"] == "kernels/configs/Some_GPU.json" and first["entries"] == 2
    (tmp_path / "Some_GPU.json").write_text('{"a": {"use": false}, "b": {}}')
    assert tuned.table_record("Some_GPU")["sha256"] != first["sha256"]  # another table, another record
    monkeypatch.setenv("BASE_KERNELS_NO_TUNED", "1")
    assert tuned.table_record("Some_GPU") == {"file": None, "disabled": True}
    from base.run.provenance import kernel_table

    assert kernel_table("cpu") is None  # only a GPU run reads a table


@pytest.mark.parametrize("compiled", [False, True])
def test_a_continuous_runs_engine_names_whether_its_prefill_was_compiled(compiled):
    """The continuous engine's packed prefills run through its compiled regions wherever it compiles
    them (a GPU): their kernels round differently from eager ones, so the engine's settings and
    fingerprint say so (+cprefill); on a CPU nothing compiles and the fingerprint is as before."""
    from types import SimpleNamespace

    from base.config import SchedulerConfig
    from base.run.provenance import engine_settings, fingerprint

    cfg = SimpleNamespace(scheduler=SchedulerConfig())
    engine = engine_settings(cfg, "cuda:0" if compiled else "cpu", "continuous", "device", compiled)
    assert engine["compile_prefill"] is compiled
    assert fingerprint(engine) == ("c3-packed+cprefill-cuda" if compiled else "c3-packed-cpu")


def test_an_engine_that_compiles_its_regions_runs_its_packed_prefill_through_them(monkeypatch):
    """What the evaluation records as compiled_prefill: the engine compiled its regions (a GPU; here
    asked for on the CPU) and its packed forward ran inside them (entered, not compiled here: the
    compiled forward's tokens are tests/test_mixed_steps.py's)."""
    from contextlib import nullcontext

    import torch

    from base.runtime.continuous import ContinuousEngine
    from tests.helpers import tiny_qwen3

    model = tiny_qwen3()
    for compile in (False, True):
        engine = ContinuousEngine(model, 2, 16, pad_id=0, buckets=(8, 16), compile=compile)
        entered, compiled = [], engine.regions is not None
        if compiled:
            monkeypatch.setattr(engine.regions, "enabled", lambda: (entered.append(1), nullcontext())[1])
        try:
            engine.reset()
            with torch.no_grad():
                engine.run_packed([], mixed=False, bucket=8)
        finally:
            engine.release()
        assert compiled == compile and bool(entered) == compile
