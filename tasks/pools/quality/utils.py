"""Dataset loader of the <pool>_<domain> lm-eval tasks (referenced as `!function utils.load_split`).

Reads <domain>.jsonl beside this file (written by experiments/mini/make_pools.py), so the tasks
resolve their data independently of the working directory and without the datasets cache or network.
"""

from __future__ import annotations

from pathlib import Path

import datasets

from base.eval.task_data import jsonl_split

HERE = Path(__file__).resolve().parent


def load_split(domain: str, **_: object) -> datasets.DatasetDict:
    """lm-eval passes the task's metadata and dataset_kwargs as keyword arguments; only `domain` matters."""
    path = HERE / f"{domain}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; run `python -m experiments.mini.make_pools --skip unit`")
    return jsonl_split(path)
