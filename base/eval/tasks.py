"""lm-eval's task index, built once per process and only as large as a run needs.

Indexing lm-eval's built-in tasks reads some 28,000 YAML files (about 10 s on a laptop core); the
project's own tasks (tasks/mini, tasks/smoke, tasks/paper_standin) index in milliseconds. A run
whose tasks all live in its include path gets that small index; any other name (an lm-eval task,
or a typo that wants its close matches) gets the full one. Preflight and evaluation share it.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=8)
def _manager(include_path: str | None, defaults: bool, stamp: tuple):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path, include_defaults=defaults)


def _stamp(include_path: str | None) -> tuple:
    """The include path's task files and their times: an edited or added task is indexed again."""
    if include_path is None or not Path(include_path).is_dir():
        return ()
    return tuple(sorted((str(p), p.stat().st_mtime_ns) for p in Path(include_path).rglob("*.y*ml")))


def task_manager(include_path: str | None, names: tuple[str, ...]):
    """A TaskManager that knows every name in `names` if lm-eval or the include path does."""
    stamp = _stamp(include_path)
    if include_path is not None:
        local = _manager(include_path, False, stamp)
        if all(n in local.all_tasks for n in names):
            return local
    return _manager(include_path, True, stamp)
