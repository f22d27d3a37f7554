"""base/run/gpu_pool.py: one GPU per job for local parallel sweeps, checked with real processes
started at once (GPU ids are names here: nothing touches CUDA)."""
from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

WORKER = """
import os, sys, time
from pathlib import Path
from base.run.gpu_pool import job_gpu
locks, pool, hold, jobs = Path(sys.argv[1]), sys.argv[2].split(","), float(sys.argv[3]), int(sys.argv[4])
for j in range(jobs):
    with job_gpu(pool, locks) as gpu:
        t0 = time.time()
        time.sleep(hold)
        print(os.getpid(), gpu, os.environ["CUDA_VISIBLE_DEVICES"], t0, time.time(), flush=True)
"""


def _workers(tmp_path: Path, pool: str, plan: list[int], hold: float = 0.3) -> list[tuple]:
    """Start one process per entry of plan (its number of jobs) at once; rows (pid, gpu, visible, t0, t1)."""
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path / "locks"), pool, str(hold), str(n)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True) for n in plan]
    rows = []
    for p in procs:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0
        rows += [(int(a), b, c, float(d), float(e)) for a, b, c, d, e in (line.split() for line in out.splitlines())]
    return rows


def _never_two_at_once(rows: list[tuple]) -> None:
    by_gpu = defaultdict(list)
    for _, gpu, _, t0, t1 in rows:
        by_gpu[gpu].append((t0, t1))
    for spans in by_gpu.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in pairwise(spans)), spans


def test_workers_take_different_gpus_and_keep_them(tmp_path):
    rows = _workers(tmp_path, "g0,g1", [3, 3])
    assert len(rows) == 6
    gpus_of = defaultdict(set)
    for pid, gpu, visible, _, _ in rows:
        assert visible == gpu  # the job sees only its GPU
        gpus_of[pid].add(gpu)
    assert all(len(g) == 1 for g in gpus_of.values())  # CUDA fixes a process's GPU at first use
    assert set.union(*gpus_of.values()) == {"g0", "g1"}  # two workers, two GPUs: none shared
    _never_two_at_once(rows)


@pytest.mark.slow
def test_more_workers_than_gpus_share_without_overlap(tmp_path):
    rows = _workers(tmp_path, "g0,g1", [2, 2, 2], hold=0.2)
    assert len(rows) == 6 and {r[1] for r in rows} == {"g0", "g1"}
    _never_two_at_once(rows)


def test_no_gpus_changes_nothing(tmp_path, monkeypatch):
    from base.run.gpu_pool import job_gpu, visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []
    with job_gpu([], tmp_path) as gpu:
        assert gpu is None
    assert not (tmp_path / "gpu-None.job").exists()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5")
    assert visible_gpus() == ["3", "5"]


def test_local_gpus_without_a_gpu_says_it_runs_one_job_at_a_time(monkeypatch, capsys):
    from base.run import gpu_pool

    monkeypatch.setattr(gpu_pool, "_told_no_gpus", False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "g0,g1")
    assert gpu_pool.launcher_jobs() == 2 and capsys.readouterr().err == ""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_pool.launcher_jobs() == 1 and gpu_pool.launcher_jobs() == 1
    err = capsys.readouterr().err
    assert err.count("hydra/launcher=local_gpus: no GPU visible") == 1 and "hydra/launcher=joblib hydra.launcher.n_jobs=N" in err
