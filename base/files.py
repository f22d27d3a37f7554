"""Files that readers never see half-written, and a lock for work several processes share.

Every file goes to a per-process temporary name and is renamed into place; `file_lock` queues the
jobs of a sweep that need the same artifact (base/run/artifacts.py).
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


def atomic_save_tensors(tensors: dict, path: Path, metadata: dict[str, str] | None = None) -> None:
    """safetensors through a per-process temporary name and a rename (never a half-written file)."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    save_file(tensors, str(tmp), metadata=metadata)
    tmp.replace(path)


@contextmanager
def file_lock(directory: Path, name: str = ".lock") -> Iterator[None]:
    """An exclusive lock on <directory>/<name> for the with-block (other processes computing the
    same artifact wait, then find it done). The kernel drops it when its holder dies, so a killed
    job never leaves the others waiting."""
    import fcntl

    directory.mkdir(parents=True, exist_ok=True)
    with (directory / name).open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
