"""Paired comparison of two evaluate runs over the same prompts (reads their samples.jsonl).

    python -m analysis.paired outputs/<exp>/<run A> outputs/<exp>/<run B>

Per-request records are joined on (task, doc_id); the prompts must be the same (prompt hashes are
compared). Reported: accuracy of each run, the difference A - B with a paired bootstrap 95 %
interval (requests resampled together), the discordant counts (A right and B wrong, and the
reverse) and the exact McNemar p-value (two-sided binomial test on the discordant pairs). A
difference is called only when its interval excludes zero; otherwise it is a tie.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def load_samples(run_dir: str | Path) -> pd.DataFrame:
    path = Path(run_dir) / "samples.jsonl"
    if not path.exists():
        raise SystemExit(f"{path} is missing: the run predates per-request records; rerun it (force=true)")
    return pd.read_json(path, lines=True)


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value: binomial(n = discordant, 1/2) at least as extreme as seen."""
    n, k = a_only + b_only, min(a_only, b_only)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired(a: pd.DataFrame, b: pd.DataFrame, n_boot: int = 10_000, seed: int = 0) -> dict[str, float | int | str]:
    """Compare run A with run B on the requests both hold (correct: 1 right, 0 wrong)."""
    keys = ["task", "doc_id"]
    j = a[[*keys, "prompt_hash", "correct"]].merge(b[[*keys, "prompt_hash", "correct"]], on=keys,
                                                   suffixes=("_a", "_b"))
    if len(j) == 0:
        raise ValueError("the two runs share no (task, doc_id) requests")
    if (j["prompt_hash_a"] != j["prompt_hash_b"]).any():
        raise ValueError("the runs' prompts differ for the same (task, doc_id): not a paired comparison")
    ca, cb = j["correct_a"].to_numpy(float), j["correct_b"].to_numpy(float)
    d = ca - cb
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(d), size=(n_boot, len(d)))
    boot = d[idx].mean(axis=1)
    low, high = np.percentile(boot, [2.5, 97.5])
    a_only, b_only = int(((ca > 0.5) & (cb <= 0.5)).sum()), int(((cb > 0.5) & (ca <= 0.5)).sum())
    diff = float(d.mean())
    call = "tie" if low <= 0 <= high else ("A higher" if diff > 0 else "B higher")
    return {"n": len(d), "acc_a": float(ca.mean()), "acc_b": float(cb.mean()), "diff": diff,
            "ci_low": float(low), "ci_high": float(high), "a_only": a_only, "b_only": b_only,
            "mcnemar_p": mcnemar_exact(a_only, b_only), "call": call}


if __name__ == "__main__":
    res = paired(load_samples(sys.argv[1]), load_samples(sys.argv[2]))
    for k, v in res.items():
        print(f"{k:>10}: {v:.4f}" if isinstance(v, float) else f"{k:>10}: {v}")
