"""What continuous batching does to accuracy: each point of a grid run under both batchings,
continuous minus static over the same prompts (issue 18's comparison, under issue 20's tests).

    python -m analysis.batching outputs/quality_seeds_mini outputs/quality_seeds_mini_continuous \
        results/quality_seeds_mini_batching

Points are matched by (method, budget) and must score the same prompts (prompt hashes compared).
Accuracy by the exact McNemar test with Tango's score interval (analysis/stats.py), every point of
the pair of grids one Holm family except dense, null by construction (NULL_BY_CONSTRUCTION: its row
is shown, not called); the call is "lower" where continuous batching scores lower, else
"inconclusive" (no accuracy tie: stats.TIE_METRICS). Writes <dest>.csv and <dest>.md. Reads
outputs/ and writes results/ only.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from analysis import records as R
from analysis import stats as S
from analysis.ablation import runs

# Rows whose difference is zero by construction, shown but left out of the family: a dense greedy
# decode does not depend on which requests share its step, so it cannot differ between batchings.
NULL_BY_CONSTRUCTION = {"dense": "null by construction: a dense decode does not depend on its batch mates"}


def shift_table(static: pd.DataFrame, continuous: pd.DataFrame) -> pd.DataFrame:
    """Continuous minus static per (method, budget) both grids ran (runs() of each folder)."""
    return shift_from_records(R.of_runs(static)[0], R.of_runs(continuous)[0])


def shift_from_records(static: pd.DataFrame, continuous: pd.DataFrame) -> pd.DataFrame:
    """Continuous minus static per (method, budget) both grids' prompt records hold, with the grid's calls."""
    if set(static["batching"]) != {"static"} or set(continuous["batching"]) != {"continuous"}:
        raise SystemExit("error: the first folder must hold static runs and the second continuous ones "
                         f"(got {sorted(set(static['batching']))} and {sorted(set(continuous['batching']))})")
    rows = []
    for (method, budget), gc in continuous.groupby(["method", "budget"], dropna=False):
        gs = R.at_point(static, method, budget, static["seed"].unique())
        if gs.empty:
            continue
        pc, ps = R.per_prompt(gc), R.per_prompt(gs)
        j = pc.add_suffix("_c").join(ps.add_suffix("_s"), how="inner")
        if len(j) != len(pc) or len(j) != len(ps) or (j["prompt_hash_c"] != j["prompt_hash_s"]).any():
            raise SystemExit(f"error: {method} at budget {budget}: the two batchings scored different prompts")
        c = S.paired_accuracy(j["correct_c"].to_numpy(float), j["correct_s"].to_numpy(float))
        rows.append({"method": method, "budget": budget, "metric": "accuracy", "static": ps["correct"].mean(),
                     "continuous": pc["correct"].mean(), "unit": f"prompts ({len(j)})", **c.row(),
                     "excluded": NULL_BY_CONSTRUCTION.get(method, "")})
    if not rows:
        raise SystemExit("error: no (method, budget) point was run under both batchings")
    return S.grid_calls(pd.DataFrame(rows))


def markdown(t: pd.DataFrame, static_dir: str, continuous_dir: str, dest: str) -> str:
    fam = t[t["call"] != S.EXCLUDED]
    counts = fam["call"].value_counts().reindex(["higher", "lower", "tie", "inconclusive"], fill_value=0)
    scope = t["scope"].fillna("") if "scope" in t else pd.Series("", index=t.index)
    show = t.assign(budget=t["budget"].astype("Int64").astype("string").fillna("none"),
                    difference=[f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]" for d, lo, hi in zip(t["diff"], t["low"], t["high"])],
                    discordant=[f"{a} / {b}" for a, b in zip(t["a_only"], t["b_only"])],
                    call=[c + (" (exploratory)" if s == "exploratory" else "") for c, s in zip(t["call"], scope)])
    cols = ["budget", "method", "static", "continuous", "difference", "discordant", "p", "p_holm",
            *[c for c in ("q", "p_headline") if c in t], "call"]
    excluded = ", ".join(sorted(set(t.loc[t["call"] == S.EXCLUDED, "method"])))
    return (f"Made by `python -m analysis.batching {static_dir} {continuous_dir} {dest}`"
            + (", then `python -m analysis.cross_grid`" if "q" in t else "") + ".\n\n"
            "Accuracy under continuous batching minus static batching, the same prompts and selector "
            "(discordant: prompts only continuous / only static got right); exact McNemar, Tango's "
            f"95 % score interval, Holm over the {len(fam)} points at {S.ALPHA:g}"
            + (f" ({excluded}: null by construction, shown, not called)" if excluded else "")
            + "; no accuracy tie is called (stats.TIE_METRICS)"
            + ("; q: Benjamini-Hochberg over every committed comparison, p_headline: Holm over the README's "
               "headline family, exploratory: the call fails them (results/cross_grid.md)" if "q" in t else "")
            + f". Calls: {counts['higher']} higher, {counts['lower']} lower, {counts['inconclusive']} inconclusive.\n\n"
            + show[cols].to_markdown(index=False, floatfmt=".3g") + "\n")


def main(static_dir: str, continuous_dir: str, dest: str) -> None:
    t = shift_table(runs(static_dir), runs(continuous_dir))
    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    t.to_csv(f"{dest}.csv", index=False)
    Path(f"{dest}.md").write_text(markdown(t, static_dir, continuous_dir, dest))
    print(Path(f"{dest}.md").read_text())


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("usage: python -m analysis.batching <static grid folder> <continuous grid folder> <dest>")
    main(*sys.argv[1:])
