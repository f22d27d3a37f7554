"""Data of these tasks: the JSONL file a task names, read from beside this file (any working directory)."""
from __future__ import annotations

from pathlib import Path

from base.eval.task_data import jsonl_split

HERE = Path(__file__).resolve().parent


def load_split(file: str, **_: object):
    """lm-eval passes the task's metadata and dataset_kwargs as keyword arguments; `file` names the data."""
    return jsonl_split(HERE / file)
