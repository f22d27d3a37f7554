"""Dataset loader of the <pool>_<domain> lm-eval tasks (referenced as `!function utils.load_split`):
<domain>.jsonl beside this file (written by experiments/mini/make_pools.py), read by
base.eval.task_data.domain_split."""

from __future__ import annotations

from pathlib import Path

from base.eval.task_data import domain_split


def load_split(domain: str, **_: object):
    """lm-eval passes the task's metadata and dataset_kwargs as keyword arguments; only `domain` matters."""
    return domain_split(Path(__file__).resolve().parent, domain, "python -m experiments.mini.make_pools --skip unit")
