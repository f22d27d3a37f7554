"""Quality curves: accuracy vs budget per selector, from the runs of one experiment folder.

    python -m analysis.quality outputs/quality_mini results/quality_mini

Writes <dest>.csv (one row per run: variant, budget, batching seed, accuracy, union, kept, weight
retained, per-task accuracy and the decode engine, `engine`: analysis/engines.py) and <dest>.md (accuracy pivot: variants x budgets), and prints the
pivot. With several batching seeds per point (`make quality SEEDS=0,1,2`) a cell is the mean over
seeds with its range over the seeds, `mean [min, max]` (a spread, not an interval: the seeds share their prompts).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from analysis.engines import one_engine, with_engine
from analysis.load import fail, metrics_frame, runs_frame


def variant(row: pd.Series) -> str:
    if row["method"] == "oea":
        return f"oea(k0={int(row['k0'])})"
    if row["reassign"] == "drop":
        return f"{row['method']}+drop"
    return row["method"]


def quality_table(root: str) -> pd.DataFrame:
    runs = runs_frame(root)
    if runs.empty:
        fail(f"no finished evaluate runs under {root}")
    # one table is one model, prompt pool and engine: its rows are keyed by variant, budget and seed only
    runs["setting"] = runs["setting"].replace("", "the sweep's own")
    for col, what in (("model", "models"), ("tasks", "prompt pools"), ("setting", "configurations of one point")):
        if runs[col].nunique(dropna=False) > 1:
            fail(f"{root} holds runs of {runs[col].nunique(dropna=False)} {what} ({', '.join(map(str, runs[col].unique()))}); "
                 "make one table of each (one exp_name each)")
    engine = one_engine(runs, f"the quality table of {root}")
    runs["variant"] = runs.apply(variant, axis=1)
    cols = ["variant", "method", "reassign", "k0", "budget", "batch_size", "batch_seed", "accuracy", "union_mean",
            "kept_mean", "weight_retained", "tokens_lost_frac"]
    table = runs.reindex(columns=["run", *cols])
    per_task = metrics_frame(root)
    if len(per_task):  # runs recorded before metrics.csv have none
        per_task = per_task[(per_task["kind"] == "result") & (per_task["metric"] == "exact_match")]
        wide = per_task.pivot_table(index="run", columns="task", values="value").add_prefix("acc_")
        table = table.merge(wide, left_on="run", right_index=True, how="left")
    table = table.drop(columns="run").sort_values(["variant", "budget"], na_position="first").reset_index(drop=True)
    return with_engine(table, engine)


def seeds_per_point(table: pd.DataFrame) -> int:
    return int(table.groupby(["variant", "budget"], dropna=False)["accuracy"].count().max())


def interval_cell(values: pd.Series) -> str:
    """mean [min, max over batching seeds] of one point's runs (stats.seed_range)."""
    from analysis.stats import seed_range

    mean, low, high = seed_range(values.to_numpy(dtype=float))
    return f"{mean:.3f}" if pd.isna(low) else f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def pivot_seeds(table: pd.DataFrame) -> pd.DataFrame:
    """Like `pivot`, each cell the mean over batching seeds with their range."""
    budgeted = table[table["budget"].notna()]
    piv = budgeted.pivot_table(index="variant", columns="budget", values="accuracy", aggfunc=interval_cell)
    piv.columns = [f"M={int(c)}" for c in piv.columns]
    free = table[table["budget"].isna()].groupby("variant").agg(
        **{"accuracy (no budget)": ("accuracy", interval_cell), "kept (no budget)": ("kept_mean", "mean")})
    return piv.join(free.round(3), how="outer")


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
    piv = pivot_seeds(table) if seeds_per_point(table) > 1 else pivot(table).round(3)
    dest.with_suffix(".md").write_text(piv.astype(object).where(piv.notna(), "").to_markdown() + "\n\n"
                                       + f"Decode engine: `{table['engine'].iloc[0]}` (analysis/engines.py).\n")
    print(piv.to_string())
