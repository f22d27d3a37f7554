"""Files that readers never see half-written, and a lock for work several processes share.

Every file goes to a per-process temporary name, `.<name>.tmp<pid>`, and is renamed into place;
`file_lock` queues the jobs of a sweep that need the same artifact (base/run/artifacts.py), and
`clear_temp` removes what a killed writer left. One permission policy for every file written:
read-write for its owner, readable by all (0666 less the umask; 0644 with the usual 022), so a
cache shared by a group reads alike whether it holds tensors or JSON.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

TEMP_PATTERNS = (".*.tmp*", ".tmp*")  # ours, and the temporary names of libraries that write beside a file


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_bytes(data)
    except OSError as err:  # a full disk or a file size limit: no half-written temporary left, the file named
        tmp.unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror, str(path)) from err
    os.chmod(tmp, 0o666 & ~_umask())
    tmp.replace(path)


def atomic_write_text(path: Path, text: str) -> None:
    _write_bytes(path, text.encode())


def atomic_save_tensors(tensors: dict, path: Path, metadata: dict[str, str] | None = None) -> None:
    """safetensors through our own temporary name and a rename (never a half-written file). The
    file is serialised in memory first: safetensors' save_file writes through a temporary file of
    its own, named `.tmp<random>` and created 0600, that a killed save leaves behind."""
    from safetensors.torch import save

    _write_bytes(path, save(tensors, metadata=metadata))


def clear_temp(directory: Path) -> None:
    """Temporary files of writers killed mid-write. Call it holding the directory's lock (every
    writer there holds it, so under it no temporary file is live)."""
    for pattern in TEMP_PATTERNS:
        for tmp in directory.glob(pattern):
            if tmp.is_file():
                tmp.unlink(missing_ok=True)


def new_lock(path: Path) -> FileLock:
    """A lock file at path, created with the permission policy above."""
    return FileLock(path, mode=0o666 & ~_umask())


@contextmanager
def file_lock(directory: Path, name: str = ".lock") -> Iterator[None]:
    """An exclusive lock on <directory>/<name> for the with-block (other processes computing the
    same artifact wait, then find it done). filelock's Unix lock is flock(2): the kernel drops it
    when its holder dies, so a killed job never leaves the others waiting."""
    directory.mkdir(parents=True, exist_ok=True)
    with new_lock(directory / name):
        yield


def clear_temp_if_idle(directory: Path, name: str = ".lock") -> None:
    """clear_temp for a reader that found its artifact complete: a killed rerun may have left a
    temporary file beside it. Only when no writer holds the lock (a live writer's file stays)."""
    if not directory.is_dir() or not any(p for pat in TEMP_PATTERNS for p in directory.glob(pat)):
        return
    lock = new_lock(directory / name)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        return
    try:
        clear_temp(directory)
    finally:
        lock.release()
