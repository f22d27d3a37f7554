"""Quality curves: accuracy vs budget per selector, from the runs of one experiment folder.

    python -m analysis.quality outputs/quality_mini results/quality_mini

Writes <dest>.csv (one row per run: variant, budget, accuracy, union, kept, weight retained and
per-task accuracy) and <dest>.md (accuracy pivot: variants x budgets), and prints the pivot.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from analysis.load import metrics_frame, runs_frame


def variant(row: pd.Series) -> str:
    if row["method"] == "oea":
        return f"oea(k0={int(row['k0'])})"
    if row["reassign"] == "drop":
        return f"{row['method']}+drop"
    return row["method"]


def quality_table(root: str) -> pd.DataFrame:
    runs = runs_frame(root)
    if runs.empty:
        raise SystemExit(f"no finished evaluate runs under {root}")
    runs["variant"] = runs.apply(variant, axis=1)
    per_task = metrics_frame(root)
    per_task = per_task[(per_task["kind"] == "result") & (per_task["metric"] == "exact_match")]
    wide = per_task.pivot_table(index="run", columns="task", values="value").add_prefix("acc_")
    cols = ["variant", "method", "reassign", "k0", "budget", "batch_size", "accuracy", "union_mean",
            "kept_mean", "weight_retained", "tokens_lost_frac"]
    table = runs[["run", *cols]].merge(wide, left_on="run", right_index=True, how="left").drop(columns="run")
    return table.sort_values(["variant", "budget"], na_position="first").reset_index(drop=True)


def pivot(table: pd.DataFrame) -> pd.DataFrame:
    budgeted = table[table["budget"].notna()]
    piv = budgeted.pivot_table(index="variant", columns="budget", values="accuracy")
    piv.columns = [f"M={int(c)}" for c in piv.columns]
    free = table[table["budget"].isna()].set_index("variant")[["accuracy", "kept_mean"]]
    free.columns = ["accuracy (no budget)", "kept (no budget)"]
    return piv.join(free, how="outer")


if __name__ == "__main__":
    root = sys.argv[1] if len(sys.argv) > 1 else "outputs/quality_mini"
    dest = Path(sys.argv[2] if len(sys.argv) > 2 else "results/quality_mini")
    table = quality_table(root)
    dest.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(dest.with_suffix(".csv"), index=False)
    piv = pivot(table).round(3)
    dest.with_suffix(".md").write_text(piv.astype(object).where(piv.notna(), "").to_markdown() + "\n")
    print(piv.to_string())
