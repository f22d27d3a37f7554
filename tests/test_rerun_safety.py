"""A finished result is never destroyed before its replacement is complete (base/run/outputs.py:
staging_dir, publish, recover): a rerun killed while it runs, or between the swap's renames, leaves
the previous result whole; settings that do not change results (artifacts_dir) rerun nothing."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

import run
from base.run import outputs
from base.run.pipeline import run as run_pipeline

ROOT = Path(__file__).resolve().parents[1]
FAST = ["model=tiny_qwen3", "task=smoke", "logger=none", "method=router_sum", "budget=3"]


def _finish(compose, out: Path, *overrides: str) -> dict | None:
    cfg = compose([*FAST, *overrides])
    return run_pipeline(run.build_config(cfg, out), OmegaConf.to_yaml(cfg, resolve=True))


def test_a_rerun_killed_midway_leaves_the_finished_result_whole(compose, tmp_path):
    out = tmp_path / "run"
    first = _finish(compose, out, "batch_size=8", f"artifacts_dir={tmp_path}/a")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    script = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
              "from hydra import compose, initialize_config_dir\nfrom omegaconf import OmegaConf\nimport run\n"
              "from base.run.pipeline import run as go\n"
              f"with initialize_config_dir(config_dir={str(ROOT / 'conf')!r}, version_base='1.3'):\n"
              f"    cfg = compose('config', overrides={[*FAST, 'batch_size=4', f'artifacts_dir={tmp_path}/a']!r})\n"
              f"go(run.build_config(cfg, __import__('pathlib').Path({str(out)!r})), OmegaConf.to_yaml(cfg, resolve=True))\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    deadline = time.time() + 120
    while time.time() < deadline and not list(tmp_path.glob(".run.partial-*/config.yaml")):
        time.sleep(0.05)
    assert list(tmp_path.glob(".run.partial-*/config.yaml")), "the rerun never started writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert after == before  # every file of the finished run as it was, config.yaml matching its report
    assert json.loads((out / "report.json").read_text())["config_hash"] == first["config_hash"]
    # the next run clears the killed rerun's folder and finishes in place
    second = _finish(compose, out, "batch_size=4", f"artifacts_dir={tmp_path}/a")
    assert second["batch_size"] == 4 and not list(tmp_path.glob(".run.partial-*"))
    assert json.loads((out / "report.json").read_text())["batch_size"] == 4


def test_a_kill_between_the_swaps_renames_is_recovered(tmp_path):
    out, stage = tmp_path / "run", tmp_path / ".run.partial-1"
    out.mkdir()
    (out / "report.json").write_text('{"old": true}')
    stage.mkdir()
    (stage / outputs.PENDING_REPORT).write_text('{"new": true}')
    out.rename(tmp_path / ".run.old-1")  # publish's first rename, then the process dies
    outputs.recover(out)
    assert json.loads((out / "report.json").read_text()) == {"old": True}
    assert not list(tmp_path.glob(".run.old-*"))


def test_a_new_artifacts_dir_does_not_make_a_finished_run_stale(compose, tmp_path, capsys):
    out = tmp_path / "run"
    _finish(compose, out, f"artifacts_dir={tmp_path}/a")
    report = (out / "report.json").read_bytes()
    assert _finish(compose, out, f"artifacts_dir={tmp_path}/elsewhere") is None
    assert "skipping" in capsys.readouterr().out and (out / "report.json").read_bytes() == report
