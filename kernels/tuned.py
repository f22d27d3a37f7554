"""Tuned launch parameters, per GPU, beside the kernels: kernels/configs/<gpu>.json.

One JSON object per GPU name (spaces as '_'); `default.json` holds fallbacks. Keys:
    "H=<H>,I=<I>,T=<T>"         the expert FFN (kernels/experts.py, tools/tune_kernels.py)
    "select:E=<E_BLOCK>,T=<T>"  the selection kernel's num_warps, tokens per tile and form
                                (kernels/select.py, tools/tune_step_kernels.py)
    "route:E=<E_BLOCK>,T=<T>"   the same kernel's launch when nothing can be dropped (dense's
                                route); where a "select:" entry is tuned nearer T, that one serves
    "attention:G=<G>,D=<D>"     decode attention's slots per block, num_warps and programs
                                targeted (kernels/attention.py, tools/tune_step_kernels.py)
T is a token bucket: the next power of two, at most 128. A missing key falls back to the nearest
bucket of the same prefix (in doublings; of two as near, the smaller), then to the kernel's
built-in default. BASE_KERNELS_NO_TUNED=1 ignores every table (the built-in defaults everywhere:
for A/B timing).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from functools import cache
from pathlib import Path

import torch

from kernels._triton import next_pow2

CONFIG_DIR = Path(__file__).parent / "configs"


@cache  # asked per launch (the router's GEMM, the experts' configs): the name never changes
def device_name(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    return torch.cuda.get_device_name(device).replace(" ", "_")


@cache
def load_configs(name: str) -> dict:
    path = CONFIG_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def table_record(name: str) -> dict:
    """What a run's report names of the table its launches read (base/run/provenance.py): the file,
    a short hash of its bytes and its entry count; {"file": None} where this GPU has none, and
    `disabled` under BASE_KERNELS_NO_TUNED. Two runs with different hashes timed different launches."""
    if os.environ.get("BASE_KERNELS_NO_TUNED"):
        return {"file": None, "disabled": True}
    path = CONFIG_DIR / f"{name}.json"
    if not path.exists():
        return {"file": None}
    data = path.read_bytes()
    return {"file": f"kernels/configs/{path.name}", "sha256": hashlib.sha256(data).hexdigest()[:12],
            "entries": len(json.loads(data))}


MAX_BUCKET = 128  # the largest token bucket a table is keyed by: more tokens read its entry


def token_bucket(T: int) -> int:
    return min(next_pow2(T), MAX_BUCKET)


def nearest_entry(prefix: str, device: torch.device, T: int) -> tuple[float, dict]:
    """`prefix`'s entry that serves T tokens (T's bucket where tuned, else the nearest tuned one) and
    how many doublings its bucket is from T's: (inf, {}) when nothing is tuned for the prefix (or
    under BASE_KERNELS_NO_TUNED)."""
    if os.environ.get("BASE_KERNELS_NO_TUNED"):
        return math.inf, {}
    table = load_configs(device_name(device))
    key = nearest_key(table, prefix, T)
    if key is None:
        return math.inf, {}
    return abs(int(key.rsplit("T=", 1)[1]).bit_length() - token_bucket(T).bit_length()), dict(table[key])


def nearest_key(table: dict, prefix: str, T: int) -> str | None:
    """The key of `table` that serves T tokens for `prefix`: T's bucket where tuned, else the nearest
    tuned bucket in doublings, the smaller of two as near (None: none); also what tools/aot_check.py
    --tables compiles at each T."""
    head, bucket = f"{prefix},T=", token_bucket(T)
    if f"{head}{bucket}" in table:  # asked per launch: no scan of the table where T's own is tuned
        return f"{head}{bucket}"
    tuned = [int(k[len(head):]) for k in table if k.startswith(head)]
    if not tuned:
        return None
    # the tie rule is the bucket's own, not the file's key order: a hand-edited table reads as a sorted one
    return f"{head}{min(tuned, key=lambda b: (abs(b.bit_length() - bucket.bit_length()), b))}"


def tuned_entry(prefix: str, device: torch.device, T: int | None = None) -> dict:
    """The table's entry `prefix` (",T=<bucket>" appended when T is given; else the nearest
    bucket of that prefix), or {} when nothing is tuned for it."""
    if T is not None:  # per launch: nearest_entry checks the switch and loads the table once
        return nearest_entry(prefix, device, T)[1]
    if os.environ.get("BASE_KERNELS_NO_TUNED"):
        return {}
    return dict(load_configs(device_name(device)).get(prefix, {}))
