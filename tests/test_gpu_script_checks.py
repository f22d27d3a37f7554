"""The GPU scripts refuse a misspelt model, routing, batch list or time limit before they write
anything or start a run (experiments/gpu/checks.sh): unchecked, a bad value reached run.py only
when its turn came, after the runs before it had spent the device call, and a limit like `70s`
broke the scripts' arithmetic."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("serve_grid", "stream_grid", "throughput_grid", "multi_gpu", "roofline", "commit_abba")


@pytest.fixture
def tree(tmp_path):
    for rel in [f"experiments/gpu/{s}.sh" for s in SCRIPTS] + [
            "experiments/gpu/env.sh", "experiments/gpu/checks.sh", "conf/model/qwen3_30b.yaml",
            "conf/model/olmoe.yaml", "conf/model/gpt_oss_120b.yaml"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    (tmp_path / ".abba").mkdir()
    (tmp_path / ".abba/a.tgz").write_bytes(b"")
    bin_dir = tmp_path / "bin"  # stand-ins that do nothing: no run, test or GPU query starts here
    bin_dir.mkdir()
    for tool in ("python3", "nvidia-smi", "timeout"):
        (bin_dir / tool).write_text("#!/bin/bash\nexit 0\n")
        (bin_dir / tool).chmod(0o755)
    return tmp_path


def _run(tree, script, *args, **env):
    out = tree / "out"
    res = subprocess.run(["bash", f"experiments/gpu/{script}.sh", *args], cwd=tree, capture_output=True, text=True,
                         env={"PATH": f"{tree / 'bin'}:/usr/bin:/bin", "OUT": str(out), "ROOFLINE_LOG": str(tree / "log"),
                              "LOG": str(tree / "log"), "W": str(tree / "w"), **env}, timeout=60, check=False)
    return res, out


@pytest.mark.parametrize("script,args,env,message", [
    ("serve_grid", (), {"ROUTINGS": "uniform skwed"}, "serve-grid: ROUTINGS: routing 'skwed' is not one of uniform skewed"),
    ("serve_grid", (), {"UNIFORM_LIMIT": "330s"}, "serve-grid: UNIFORM_LIMIT='330s': a whole number of seconds >= 1"),
    ("serve_grid", (), {"DEADLINE": "0"}, "DEADLINE='0'"),
    ("stream_grid", ("uniform", "skewd"), {}, "stream-grid: the routings: routing 'skewd'"),
    ("stream_grid", (), {"RUN_LIMIT": "8m"}, "RUN_LIMIT='8m'"),
    ("throughput_grid", ("qwen3_30b", "olmo"), {}, "throughput-grid: the models: no model 'olmo' (conf/model/*.yaml: "),
    ("throughput_grid", (), {"GPU0": "qwen3_30b:uniform", "GPU1": "olmoe:skew"}, "routing 'skew' is not one of"),
    ("throughput_grid", (), {"GPU0": "qwen3_30b"}, "GPU0/GPU1 'qwen3_30b': a run is model:routing"),
    ("multi_gpu", (), {"MODEL": "gpt_oss_12b"}, "multi-gpu: MODEL: no model 'gpt_oss_12b'"),
    ("multi_gpu", (), {"BATCHES": "1,16"}, "multi-gpu: BATCHES: batch sizes '1,16' are not a list like [16,64]"),
    ("roofline", (), {"PARTS": "grid", "GRID_S": "100s"}, "roofline: GRID_S='100s'"),
    ("commit_abba", (), {"ABBA_A_COMMIT": "34120f8", "ABBA_S": "-5"}, "commit_abba: ABBA_S='-5'"),
    ("commit_abba", (), {}, "commit_abba: ABBA_A_COMMIT is not set"),
])
def test_a_bad_value_is_refused_before_anything_is_written(tree, script, args, env, message):
    res, out = _run(tree, script, *args, **env)
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert not out.exists() and not (tree / "log").exists() and not (tree / "w").exists()
    assert res.stdout == ""


@pytest.mark.parametrize("script,args,env", [
    ("serve_grid", (), {"ROUTINGS": "skewed", "UNIFORM_LIMIT": "300", "DEADLINE": "540"}),
    ("stream_grid", ("uniform skewed",), {"RUN_LIMIT": "480"}),
    ("throughput_grid", ("olmoe",), {"RUN_LIMIT": "540"}),
    ("multi_gpu", (), {"BATCHES": "[1,16]"}),
])
def test_valid_values_get_past_the_checks(tree, script, args, env):
    """The checks let a valid request through (the stand-ins then run nothing)."""
    res, out = _run(tree, script, *args, **env)
    assert not any(line.startswith(f"{script.replace('_', '-')}:") for line in res.stderr.splitlines()), res.stderr
    assert out.exists()
