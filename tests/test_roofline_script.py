"""experiments/gpu/roofline.sh refuses a misspelt part, micro-benchmark or grid spec before it writes
anything: unchecked, an unknown part ran nothing and a bad spec failed only after the parts before
it had spent the device call."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def tree(tmp_path):
    for rel in ("experiments/gpu/roofline.sh", "experiments/gpu/env.sh", "experiments/gpu/checks.sh", "conf/model/qwen3_30b.yaml",
                "conf/model/olmoe.yaml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    return tmp_path


def _run(tree, **env):
    out = tree / "out"
    bin_dir = tree / "bin"  # python3 and nvidia-smi stand-ins that do nothing: no run starts here
    bin_dir.mkdir(exist_ok=True)
    for tool in ("python3", "nvidia-smi"):
        (bin_dir / tool).write_text("#!/bin/bash\nexit 0\n")
        (bin_dir / tool).chmod(0o755)
    res = subprocess.run(["bash", str(tree / "experiments/gpu/roofline.sh")], capture_output=True, text=True,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(out), "ROOFLINE_LOG": str(tree / "log"),
                              **env}, timeout=60, check=False)
    return res, out


@pytest.mark.parametrize("env,message", [
    ({"PARTS": "grdi"}, "PARTS has 'grdi': the parts are tests kernels steptune exptune micro grid ab"),
    ({"PARTS": "micro", "MICRO": "skiny"}, "MICRO has 'skiny': the micro-benchmarks are select skinny attention experts"),
    ({"PARTS": "grid", "SPECS": "qwen3_30b:uniform qwen3:skewed"}, "no model 'qwen3' (conf/model/*.yaml: olmoe qwen3_30b"),
    ({"PARTS": "grid", "SPECS": "olmoe:skew"}, "routing 'skew' is not one of uniform skewed"),
    ({"PARTS": "grid", "SPECS": "olmoe:uniform:16"}, "batch sizes '16' are not a list like [16,64]"),
    ({"PARTS": "grid", "MODEL": "qwen3"}, "no model 'qwen3'"),
])
def test_a_misspelt_request_is_refused_before_anything_is_written(tree, env, message):
    res, out = _run(tree, **env)
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert not out.exists() and res.stdout == ""


def test_a_valid_request_gets_past_the_checks(tree):
    """Valid parts and specs pass: here the `ab` part then stops at its own missing AB_KEY."""
    res, out = _run(tree, PARTS="grid ab", SPECS="qwen3_30b:skewed:[16,64] olmoe:uniform", MICRO="attention experts")
    assert "roofline:" not in res.stderr and "PARTS=ab needs AB_KEY" in res.stderr, res.stderr
    assert out.exists()
