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
