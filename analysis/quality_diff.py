"""Differences in accuracy between base and every other variant at each budget, with 95 % intervals.

    python -m analysis.quality_diff results/quality_mini.csv results/quality_mini_diff

The committed quality runs keep no per-prompt records, so no paired test is possible from them:
the interval here is the unpaired normal one, diff +- 1.96 * sqrt(p1 (1 - p1) / n + p2 (1 - p2) / n)
over the n prompts of each run. For runs over the same prompts whose outcomes are positively
correlated it is wider than the paired interval, so its test of "no difference" is conservative.
Calls as everywhere (analysis/stats.py): Holm over the table's comparisons, higher/lower where the
corrected z-test rejects, else inconclusive (an accuracy tie is not a call: stats.TIE_METRICS; the
equivalence p against the 1-point margin is reported). The table ends in the column `engine`: the
source table's (a source of two engines is refused, exit 2; one without the column: its grid's,
analysis/engines.py LEGACY_GRIDS).
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from analysis import stats as S
from analysis.engines import grid_engine, one_engine, with_engine
from analysis.load import command_line, fail

Z95 = 1.959964


def diff_row(p_ref: float, p_other: float, n: int) -> dict[str, float | str]:
    """One comparison alone (its own family); quality_diffs corrects a table of them together."""
    d = p_ref - p_other
    se = math.sqrt(p_ref * (1 - p_ref) / n + p_other * (1 - p_other) / n)
    p, p_tost = S.p_normal(d, se), S.tost_normal(d, se, S.MARGINS["accuracy"])
    return {"diff": d, "low": d - Z95 * se, "high": d + Z95 * se, "se": se, "p": p, "p_tost": p_tost,
            "call": S.call(d, p, p_tost, "accuracy")}


def quality_diffs(df: pd.DataFrame, ref: str = "base", n: int = 1600) -> pd.DataFrame:
    """One row per (other variant, budget): ref's accuracy minus the other's, interval and call."""
    budgeted = df[df["budget"].notna()]
    ref_acc = budgeted[budgeted["variant"] == ref].set_index("budget")["accuracy"]
    rows = []
    for (variant, budget), acc in budgeted.groupby(["variant", "budget"])["accuracy"].first().items():
        if variant == ref or budget not in ref_acc.index:
            continue
        rows.append({"variant": variant, "budget": int(budget), f"{ref}": ref_acc[budget], "other": acc,
                     **diff_row(float(ref_acc[budget]), float(acc), n)})
    table = pd.DataFrame(rows).sort_values(["variant", "budget"]).reset_index(drop=True)
    return S.grid_calls(table.drop(columns="call"))


def markdown(table: pd.DataFrame, n: int = 1600) -> str:
    """The table's .md: intervals and calls by variant and budget (a call failing the cross-grid
    correction of analysis/cross_grid.py marked exploratory, where the table has its scope column)."""
    scope = table["scope"].fillna("") if "scope" in table else pd.Series("", index=table.index)
    calls = table.assign(call=[c + (" (exploratory)" if s == "exploratory" else "") for c, s in zip(table["call"], scope)])
    diffs = table.assign(cell=table.apply(lambda r: f"{r['diff']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}]", axis=1))
    return (f"Made by `python -m analysis.quality_diff results/quality_mini.csv results/quality_mini_diff`, then "
            f"`python -m analysis.cross_grid`.\n\nbase minus each variant, accuracy, 95 % unpaired interval (n = {n} "
            f"prompts per run); calls Holm-corrected over {len(table)} comparisons (higher, lower or inconclusive: no "
            f"accuracy tie is called, stats.TIE_METRICS); exploratory: the call fails the cross-grid correction "
            f"(results/cross_grid.md)\n\n"
            + diffs.pivot(index="variant", columns="budget", values="cell").to_markdown() + "\n\n"
            + calls.pivot(index="variant", columns="budget", values="call").to_markdown() + "\n")


def source_engine(df: pd.DataFrame, src: str) -> str:
    """The decode engine of the source table's runs (its `engine` column, else its grid's)."""
    if "engine" in df:
        return one_engine(df, f"the comparisons of {src}")
    return grid_engine(Path(src).stem) or "unknown"


def main(src: str, dest: str, n: int = 1600) -> None:
    df = pd.read_csv(src)
    table = with_engine(quality_diffs(df, n=n), source_engine(df, src))
    out = Path(dest)
    table.to_csv(out.with_suffix(".csv"), index=False)
    text = markdown(table, n)
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    args = command_line(__doc__, 2, 3)
    if not Path(args[0]).is_file():
        fail(f"{args[0]}: not a file; the source is a quality table (.csv), e.g. results/quality_mini.csv")
    if args[2:] and not args[2].isdigit():
        fail(f"n={args[2]!r}: the prompts per run, a positive whole number")
    main(args[0], args[1], *(int(a) for a in args[2:3]))
