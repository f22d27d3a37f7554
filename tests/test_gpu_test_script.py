"""experiments/gpu/gpu_test.sh (`make gpu-test`) refuses a bad request before it writes anything or
spends device time: a process count that is not a whole number >= 1, several processes without
pytest-xdist, a machine without CUDA."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# stands in for python3: no module imports (so neither xdist nor a CUDA device is there)
NO_IMPORTS = "#!/bin/bash\nexit 1\n"


@pytest.fixture
def tree(tmp_path):
    for rel in ("experiments/gpu/gpu_test.sh", "experiments/gpu/env.sh"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(NO_IMPORTS)
    (bin_dir / "python3").chmod(0o755)
    return tmp_path


def _run(tree, **env):
    out = tree / "out"
    res = subprocess.run(["bash", str(tree / "experiments/gpu/gpu_test.sh")], capture_output=True, text=True,
                         env={"PATH": f"{tree / 'bin'}:/usr/bin:/bin", "GPU_TEST_OUT": str(out), **env},
                         timeout=60, check=False)
    return res, out


@pytest.mark.parametrize("jobs", ["0", "four", "-2", "1.5"])
def test_a_process_count_that_is_not_a_whole_number_is_refused(tree, jobs):
    res, out = _run(tree, GPU_TEST_JOBS=jobs)
    assert res.returncode == 2 and f"GPU_TEST_JOBS='{jobs}'" in res.stderr and ">= 1" in res.stderr, res.stderr
    assert not out.exists()


def test_several_processes_without_xdist_are_refused(tree):
    res, out = _run(tree, GPU_TEST_JOBS="4")
    assert res.returncode == 2 and "needs pytest-xdist" in res.stderr, res.stderr
    assert not out.exists()


@pytest.mark.parametrize("jobs", [None, "1"])
def test_a_machine_without_cuda_is_refused_before_the_log_is_written(tree, jobs):
    res, out = _run(tree, **({} if jobs is None else {"GPU_TEST_JOBS": jobs}))
    assert res.returncode == 2 and "no CUDA device here" in res.stderr, res.stderr
    assert not out.exists()


def test_the_default_process_count_falls_back_to_one_without_xdist(tree):
    # the default (4) asked for no count in particular: without xdist it says so and goes on in one process
    # (here it then stops at the missing CUDA device); an explicit GPU_TEST_JOBS=4 is refused instead
    res, _ = _run(tree)
    assert "pytest-xdist is missing, so one pytest process" in res.stderr, res.stderr
    assert "needs pytest-xdist" not in res.stderr
