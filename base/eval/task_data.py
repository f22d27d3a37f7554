"""Local data of the project's lm-eval tasks, found beside each task file (tasks/*/utils.py).

A task YAML says `custom_dataset: !function utils.load_split` with `dataset_kwargs: {file: x.jsonl}`;
lm-eval imports the utils.py beside it, which reads the JSONL beside itself. The data resolve from
any working directory, offline, without the datasets cache.
"""
from __future__ import annotations

import json
from pathlib import Path

import datasets


def jsonl_split(path: Path, split: str = "test") -> datasets.DatasetDict:
    """One split from a JSONL file, rows in file order."""
    if not path.exists():
        raise FileNotFoundError(f"task data {path} is missing")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"task data {path} holds no examples")
    return datasets.DatasetDict({split: datasets.Dataset.from_list(rows)})


def domain_split(folder: Path, domain: str, remake: str) -> datasets.DatasetDict:
    """The test split of one domain task: <domain>.jsonl in `folder` (the task's own), or a
    FileNotFoundError naming the command `remake` that writes it."""
    path = folder / f"{domain}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; run `{remake}`")
    return jsonl_split(path)
