"""Dataset loader of the mini_<domain> lm-eval tasks (referenced as `!function utils.load_split`).

Reads <domain>.jsonl beside this file, so the tasks resolve their data independently of the
working directory (Hydra may change it) and without the datasets cache or network.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets

HERE = Path(__file__).resolve().parent


def load_split(domain: str, **_: object) -> datasets.DatasetDict:
    """lm-eval passes the task's metadata and dataset_kwargs as keyword arguments; only `domain` matters."""
    path = HERE / f"{domain}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; run `python -m experiments.mini.make_tasks`")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line]
    if not rows:
        raise ValueError(f"{path} holds no examples")
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
