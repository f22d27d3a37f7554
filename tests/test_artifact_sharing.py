"""Calibration and predictor shared by concurrent jobs (base/run/artifacts.py): processes started at
once compute each artifact once and the others reuse it; a writer killed mid-write leaves no
complete-looking file and no held lock, and the next job computes the artifact whole."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from base.files import new_lock

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_jobs_started_at_once_compute_each_artifact_once(tmp_path):
    cmd = [sys.executable, str(ROOT / "run.py"), f"outputs_dir={tmp_path}", f"artifacts_dir={tmp_path}/art",
           "logger=none", "model=tiny_qwen3", "task=smoke", "stage=fit"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([*cmd, f"exp_name=job{i}"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(3)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
        outs.append(out)
    log = "".join(outs)
    assert log.count("calibration computed") == 1 and log.count("predictor fitted") == 1
    reports = [json.loads(next((tmp_path / f"job{i}").glob("*/report.json")).read_text()) for i in range(3)]
    assert len({r["predictor"]["path"] for r in reports}) == 1
    assert len({json.dumps(r["predictor"]["r2"]) for r in reports}) == 1  # one fit, read by all
    art = tmp_path / "art"
    assert not [p for p in art.rglob("*") if ".tmp" in p.name]


KILLED_WRITER = """
import os, sys, time
from pathlib import Path
import torch
import base.files
from base.files import atomic_save_tensors, file_lock

def hang(path, mode):  # a writer killed after its temporary file is written, before the rename
    print("writing", flush=True)
    time.sleep(600)

base.files.os.chmod = hang
directory = Path(sys.argv[1])
with file_lock(directory):
    atomic_save_tensors({"x": torch.zeros(4)}, directory / "calib.safetensors")
"""


@pytest.mark.slow
def test_a_writer_killed_mid_write_leaves_nothing_half_written(compose, tmp_path):
    import run
    from base.hf.families import find_moe_layers
    from base.hf.loading import load_model, load_tokenizer
    from base.method.calibration import Calibration
    from base.run.artifacts import artifact_dir, ensure_calibration, model_identity

    rc = run.build_config(compose(["model=tiny_qwen3", "task=smoke", f"artifacts_dir={tmp_path}/art",
                                   "calibration.num_tokens=1024"]), tmp_path / "out")
    model = load_model(rc.model, ROOT, seed=0)
    layers = find_moe_layers(model)
    directory = artifact_dir(rc, model_identity(rc, layers))
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(directory)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "writing"
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    assert not (directory / "calib.safetensors").exists() and not (directory / "calib.json").exists()
    assert [p.name for p in directory.glob(".*.tmp*")]  # only its temporary file is left
    lock = new_lock(directory / ".lock")
    lock.acquire(blocking=False)  # free at once (filelock's Timeout otherwise): the kernel released the dead writer's lock
    lock.release()
    calib, where = ensure_calibration(rc, model, load_tokenizer(rc.model, ROOT), layers)
    assert where == directory and not list(directory.glob(".*.tmp*"))
    assert Calibration.load(directory).meta["num_layers"] == 2 == calib.meta["num_layers"]


def test_leftovers_of_killed_saves_are_removed_and_cache_files_share_one_mode(compose, tmp_path):
    """A rerun that finds its artifacts complete still removes temporary files a killed save left
    beside them: ours (.<name>.tmp<pid>) and a library's (safetensors' save_file: .tmp<random>).
    Tensors and JSON get the same mode (0666 less the umask)."""
    import run
    from base.hf.families import find_moe_layers
    from base.hf.loading import load_model, load_tokenizer
    from base.run.artifacts import ensure_predictor

    old_mask = os.umask(0o022)
    try:
        rc = run.build_config(compose(["model=tiny_qwen3", "task=smoke", f"artifacts_dir={tmp_path}/art",
                                       "calibration.num_tokens=1024"]), tmp_path / "out")
        model = load_model(rc.model, ROOT, seed=0)
        layers = find_moe_layers(model)
        tok = load_tokenizer(rc.model, ROOT)
        _, path = ensure_predictor(rc, model, tok, layers)
        directory = path.parent
        modes = {p.name: p.stat().st_mode & 0o777 for p in directory.iterdir() if p.name != ".lock"}
        assert any(n.endswith(".safetensors") for n in modes) and any(n.endswith(".json") for n in modes)
        assert set(modes.values()) == {0o644}, modes
        leaked = [directory / ".tmpk3j9x2", directory / f".{path.name}.tmp99999"]
        for f in leaked:
            f.write_bytes(b"\0" * 1024)
        ensure_predictor(rc, model, tok, layers)  # everything cached: the fast path
        assert not any(f.exists() for f in leaked)
    finally:
        os.umask(old_mask)
