"""One GPU per job for local parallel sweeps (hydra/launcher=local_gpus or joblib).

    with job_gpu(visible_gpus(), lock_dir()) as gpu:   # gpu: "1", or None without GPUs
        ...                                             # this process sees only that GPU

Why locks and not `job number % GPUs`: joblib's workers are long-lived processes that take the
next job when they finish one, so jobs 0 and 2 of a two-GPU sweep can run at the same time; a
host-wide lock file per GPU makes "free" mean free, for every sweep on the host.

Why a process keeps its first GPU: CUDA reads CUDA_VISIBLE_DEVICES once, when the process first
touches the driver. A worker that ran a job on GPU 1 can only ever see GPU 1, so its later jobs
wait for that GPU's lock (held by another worker for at most one job) instead of taking another.
So that two workers do not end up sharing one GPU while another idles, a process also holds an
owner lock on its GPU for its whole life, and a new process picks an unowned GPU first (GPUs are
shared only when there are more workers than GPUs).

Locks: <lock_dir>/gpu-<id>.job (one job at a time) and gpu-<id>.owner (the processes bound to it).
"""
from __future__ import annotations

import fcntl
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_bound: str | None = None  # the GPU this process was given (CUDA fixed it at first use)
_owner_fd: int | None = None  # held until the process exits (the kernel then releases it)
_told_no_gpus = False


def visible_gpus() -> list[str]:
    """The GPU ids this process may hand out: CUDA_VISIBLE_DEVICES when set, else every GPU
    nvidia-smi lists; [] on a machine without GPUs. Never initialises CUDA."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def launcher_jobs() -> int:
    """hydra/launcher=local_gpus' worker count: one per visible GPU. Without any, one worker runs
    the jobs one at a time; said once, since a user who picked this launcher expects parallel jobs."""
    global _told_no_gpus
    gpus = visible_gpus()
    if not gpus and not _told_no_gpus:
        _told_no_gpus = True
        import sys

        print("[base] hydra/launcher=local_gpus: no GPU visible (CUDA_VISIBLE_DEVICES, nvidia-smi), so the jobs run "
              "one at a time; for parallel CPU jobs use hydra/launcher=joblib hydra.launcher.n_jobs=N "
              "(with OMP_NUM_THREADS set so that N jobs share the cores)", file=sys.stderr, flush=True)
    return max(1, len(gpus))


def lock_dir() -> Path:
    """Host-wide: two sweeps on one machine share out its GPUs too."""
    return Path(tempfile.gettempdir()) / f"base-moe-gpu-locks-{os.getuid()}"


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _cuda_started() -> bool:
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def _check_one_visible(gpu: str) -> None:
    """torch.cuda.is_available() at import time (in some library) starts the driver without
    torch counting CUDA as initialised; the driver then kept the old device list. Say so rather
    than run every job on the first GPU."""
    import sys

    torch = sys.modules.get("torch")  # not imported yet: nothing can have started CUDA through it
    if torch is not None and torch.cuda.is_available():
        torch.cuda.init()
        if torch.cuda.device_count() != 1:
            raise RuntimeError(f"this process still sees {torch.cuda.device_count()} GPUs after choosing GPU {gpu}: "
                               f"the CUDA driver started before the job chose its GPU")


def _bind(pool: list[str], locks: Path) -> str | None:
    """The GPU this process will use from now on: an unowned one if any, else any of the pool."""
    global _bound, _owner_fd
    if _bound is None and _cuda_started():
        raise RuntimeError("CUDA was initialised before the job chose its GPU; a local parallel job must pick "
                           "its GPU first (base/run/gpu_pool.py)")
    if _bound is None:
        for g in pool:
            fd = _try_lock(locks / f"gpu-{g}.owner")
            if fd is not None:
                _owner_fd, _bound = fd, g
                break
    return _bound


@contextmanager
def job_gpu(pool: list[str], locks: Path, poll_s: float = 0.2) -> Iterator[str | None]:
    """Hold one GPU of `pool` for the with-block and make it this process's only visible GPU.
    An empty pool yields None and changes nothing (CPU machines)."""
    global _bound
    if not pool:
        yield None
        return
    locks.mkdir(parents=True, exist_ok=True)
    first = _bound is None
    owned = _bind(pool, locks)
    wanted = [owned] if owned is not None else list(pool)  # None: more workers than GPUs, share one
    fd, gpu = None, None
    while fd is None:
        for g in wanted:
            fd = _try_lock(locks / f"gpu-{g}.job")
            if fd is not None:
                gpu = g
                break
        else:
            time.sleep(poll_s)
    if first:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
        _bound = gpu
        _check_one_visible(gpu)
    try:
        yield gpu
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
