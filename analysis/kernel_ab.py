"""A kernel A/B from its timing table: each case's median over rounds, and one implementation over
another round by round.

    python -m analysis.kernel_ab results/roofline/grid_2026-12-04c/select/bench_select.csv
    python -m analysis.kernel_ab <bench_skinny.csv> --over cublas

Reads a CSV with one row per (case, implementation, round) and columns `impl`, `round` and `us`
(tools/bench_select.py and tools/bench_skinny.py write them); every other column but `timing`,
`engine` (a committed table's: analysis/engines.py; one per table, else exit 2) and bench_skinny's
MB names the case. Prints per case and implementation the median
µs with [min, max] over rounds, and per case each implementation's µs over the reference's in the
same round (`--over`; default `baseline`, else the first implementation listed), median and range,
with an exact two-sided Mann-Whitney test of its rounds' µs against the reference's, Holm-corrected
over every (case, implementation) of the table: `call` names the faster one where the corrected p is
below ALPHA (analysis/stats.py), else "inconclusive" (no equivalence test here, so never "tie").
The rounds of one run share its process (interleaved, order rotated), as analysis/abba.py's do.
A bench_select table with its three forms (`--forms route,after,empty`) also gets the selection
launch split by difference, per rule and token count, from the per-round medians: the launch floor
(the empty launch), the routing (route_select less select_reassign: the softmax, top-k and their
stores) and the rest (select_reassign less the floor: union, score, ranking, reassignment).
"""
from __future__ import annotations

import argparse
from math import comb
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import mannwhitneyu

from analysis.stats import ALPHA, holm

NOT_CASE = {"impl", "round", "us", "timing", "MB", "engine"}
# bench_skinny's launch parameters belong to its implementation (`impl` names them), not to the case
LAUNCH = {"block_n", "block_k", "num_stages", "num_warps", "split"}


def case_columns(t: pd.DataFrame) -> list[str]:
    skip = NOT_CASE | (LAUNCH if "block_n" in t.columns else set())
    return [c for c in t.columns if c not in skip]


def medians(t: pd.DataFrame) -> pd.DataFrame:
    """Per case and implementation: median, min and max µs over the rounds."""
    keys = case_columns(t) + ["impl"]
    return t.groupby(keys, sort=False, dropna=False)["us"].agg(median="median", lo="min", hi="max").reset_index()


def ratios(t: pd.DataFrame, over: str) -> pd.DataFrame:
    """Per case and implementation other than `over`: its µs over `over`'s in the same round,
    median and range over rounds."""
    keys = case_columns(t)
    ref = t[t["impl"] == over].set_index(keys + ["round"])["us"]
    rest = t[t["impl"] != over].copy()
    rest["ratio"] = [us / ref[tuple(k) + (r,)] for k, r, us in
                     zip(rest[keys].itertuples(index=False), rest["round"], rest["us"], strict=True)]
    return rest.groupby(keys + ["impl"], sort=False, dropna=False)["ratio"].agg(
        median="median", lo="min", hi="max").reset_index()


def tested(t: pd.DataFrame, over: str) -> pd.DataFrame:
    """`ratios` with, per row, the exact two-sided Mann-Whitney p of the implementation's rounds
    against `over`'s, its Holm correction over the table's rows, and the call (see the module doc)."""
    keys = case_columns(t)
    out = ratios(t, over)
    us = t.groupby(keys + ["impl"], sort=False, dropna=False)["us"].apply(lambda x: x.to_numpy(float))
    ps = []
    for row in out.itertuples(index=False):
        case = tuple(getattr(row, k) for k in keys)
        ps.append(mannwhitneyu(us[case + (row.impl,)], us[case + (over,)], alternative="two-sided",
                               method="exact").pvalue)
    out["p"] = ps
    out["p_holm"] = holm(np.asarray(ps, float))
    out["call"] = [(f"{impl} faster" if med < 1 else f"{over} faster") if p < ALPHA else "inconclusive"
                   for impl, med, p in zip(out["impl"], out["median"], out["p_holm"], strict=True)]
    return out


def smallest_p(t: pd.DataFrame, over: str) -> float:
    """The smallest exact two-sided Mann-Whitney p any row of `tested` can reach: 2 / C(n + m, n)
    for a row of n rounds against the reference's m (wholly separated rounds, no ties)."""
    keys = case_columns(t)
    counts = t.groupby(keys + ["impl"], sort=False, dropna=False)["us"].size()
    ref = {k[:-1]: n for k, n in counts.items() if k[-1] == over}
    return min((min(1.0, 2 / comb(n + ref[k[:-1]], n)) for k, n in counts.items() if k[-1] != over), default=1.0)


def stages(t: pd.DataFrame) -> pd.DataFrame:
    """bench_select's forms as differences (see the module doc), per implementation, rule and T;
    empty when the table lacks a form."""
    if "form" not in t.columns or not {"route_select", "select_reassign", "empty"} <= set(t["form"]):
        return pd.DataFrame()
    med = t.groupby(["impl", "form", "rule", "T"], sort=False)["us"].median()
    out = []
    for impl in dict.fromkeys(t["impl"]):
        floor = float(med[impl, "empty"].iloc[0])
        route, after = med[impl, "route_select"], med[impl, "select_reassign"]
        for (rule, T), us in route.items():
            if (rule, T) not in after.index:
                continue
            rest = float(after[rule, T])
            out.append({"impl": impl, "rule": rule, "T": T, "route_select_us": float(us), "floor_us": floor,
                        "routing_us": float(us) - rest, "rest_us": rest - floor})
    return pd.DataFrame(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", type=Path)
    ap.add_argument("--over", default=None, help="the reference implementation (default: baseline, else the first)")
    args = ap.parse_args()
    if not args.csv.is_file():
        raise SystemExit(f"error: {args.csv}: no such file")
    t = pd.read_csv(args.csv)
    missing = {"impl", "round", "us"} - set(t.columns)
    if missing:
        raise SystemExit(f"error: {args.csv} lacks the columns {sorted(missing)} (a tools/bench_* table has them)")
    from analysis.engines import one_engine

    engine = one_engine(t, f"the kernel A/B of {args.csv}") if "engine" in t else None
    impls = list(dict.fromkeys(t["impl"]))
    over = args.over or ("baseline" if "baseline" in impls else impls[0])
    if over not in impls:
        raise SystemExit(f"error: --over {over!r} is not an implementation of the table; choose one of: {', '.join(impls)}")
    pd.set_option("display.width", 200)
    print(f"µs per call: median [min, max] over {t['round'].nunique()} rounds"
          + (f" (engine: {engine})" if engine else "") + "\n")
    print(medians(t).round(3).to_string(index=False))
    if len(impls) > 1:
        tbl = tested(t, over).round({"median": 3, "lo": 3, "hi": 3})
        tbl["p"], tbl["p_holm"] = (tbl[c].map(lambda v: f"{v:.2g}") for c in ("p", "p_holm"))
        print(f"\nover {over} in the same round: median [min, max]; exact Mann-Whitney over rounds, Holm over"
              f" the {len(tbl)} rows (alpha {ALPHA})\n")
        print(tbl.to_string(index=False))
        floor = smallest_p(t, over)
        if floor * len(tbl) >= ALPHA:
            print(f"\nno call is possible here: with these rounds an exact two-sided Mann-Whitney p is at least "
                  f"{floor:.2g}, and Holm over {len(tbl)} rows needs one below {ALPHA / len(tbl):.2g} (7 rounds a side "
                  f"give {2 / comb(14, 7):.2g})")
    split = stages(t)
    if not split.empty:
        print("\nthe launch by difference (medians, µs): floor = the empty launch; routing = route_select - "
              "select_reassign; rest = select_reassign - floor\n")
        print(split.round(3).to_string(index=False))


if __name__ == "__main__":
    main()
