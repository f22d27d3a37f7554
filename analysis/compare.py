"""Print one comparison table for an experiment folder: accuracy, union, kept experts, tokens/s.

    python -m analysis.compare outputs/demo
"""
from __future__ import annotations

import sys

import pandas as pd

from analysis.load import runs_frame, throughput_frame


def compare(root: str) -> pd.DataFrame:
    ev = runs_frame(root)
    tp = throughput_frame(root)
    if ev.empty:
        raise SystemExit(f"no finished evaluate runs under {root}")
    table = ev[["method", "budget", "batch_size", "accuracy", "union_mean", "kept_mean", "weight_retained"]].copy()
    table["budget"] = table["budget"].astype("Int64")
    if not tp.empty:
        tp = tp.copy()
        tp["budget"] = tp["budget"].astype("Int64")
        keep = tp[["method", "budget", "batch_size", "tokens_per_s"]]
        table = table.merge(keep, on=["method", "budget", "batch_size"], how="left")
    return table.sort_values(["method", "budget"], na_position="first").reset_index(drop=True)


if __name__ == "__main__":
    root = sys.argv[1] if len(sys.argv) > 1 else "outputs/demo"
    with pd.option_context("display.width", 120):
        print(compare(root).round(3).to_string(index=False))
