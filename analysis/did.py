"""Static against continuous batching as a paired difference in differences (issue 27): per rule
and budget, (rule - base) under continuous batching minus (rule - base) under static batches, over
the same prompts. It tests sentences such as "at full batches base's lead over router_sum grows".

    python -m analysis.did results/quality_seeds_mini results/quality_seeds_mini_continuous \
        results/quality_seeds_mini_did [results/quality_seeds_mini_batching]
    python -m analysis.did --records results/records/<static> results/records/<continuous> results/<dest>

Per prompt, with r and b the rule's and base's 0/1 outcomes under static (s) and continuous (c)
batching, d = (r_c - b_c) - (r_s - b_s), and the difference in differences is mean(d).

From records (`--records`, analysis/records.py): the sign-flip permutation test over prompts and
the interval that inverts it (stats.sign_flip).

From the committed tables alone (no per-prompt records): the estimate is exact (four accuracies),
but the variance of d depends on how the four outcomes go together on a prompt, which the tables
give only through their 2x2 margins: rule against base under each batching (the paired tables'
discordant counts) and, where a `_batching` table exists, each of rule and base under the two
batchings. `bounds` finds the largest and smallest variance any joint distribution with those
margins allows (two linear programmes over the 16 outcome cells); the call uses the largest (a
conservative z test, its 95 % interval beside it), and p_min, the p at the smallest variance, says
whether any arrangement of the prompts could make the difference significant. Holm over the rows of
a table; no accuracy tie is called (stats.TIE_METRICS). Writes <dest>.csv and <dest>.md.
"""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import optimize, stats

from analysis import records as R
from analysis import stats as S

OUTCOMES = ("rule_s", "base_s", "rule_c", "base_c")  # the bits of a cell, in this order
CELLS = np.array(list(itertools.product((0, 1), repeat=4)))  # (16, 4): every outcome; column i is OUTCOMES[i]
D2 = ((CELLS[:, 2] - CELLS[:, 3]) - (CELLS[:, 0] - CELLS[:, 1])).astype(float) ** 2


def table_2x2(n: int, right_a: int, right_b: int, a_only: int, b_only: int) -> np.ndarray:
    """Counts [[both wrong, b only], [a only, both right]] (index [a][b]) from the discordant counts
    and each side's prompts right; refuses counts that do not fit together."""
    both = right_a - a_only
    t = np.array([[n - both - a_only - b_only, b_only], [a_only, both]])
    if (t < 0).any() or both + b_only != right_b:
        raise ValueError(f"inconsistent counts: n={n}, right {right_a}/{right_b}, discordant {a_only}/{b_only}")
    return t


def bounds(n: int, margins: dict[tuple[str, str], np.ndarray]) -> tuple[float, float, float]:
    """(mean of d, smallest and largest population variance of d) over every joint distribution of the
    four outcomes whose 2x2 margins are `margins` ({(x, y): counts[x][y]} for x, y in OUTCOMES)."""
    a_eq, b_eq = [], []
    for (x, y), t in margins.items():
        i, j = OUTCOMES.index(x), OUTCOMES.index(y)
        for u, v in itertools.product((0, 1), repeat=2):
            a_eq.append(((CELLS[:, i] == u) & (CELLS[:, j] == v)).astype(float))
            b_eq.append(t[u][v] / n)
    a_eq, b_eq = np.array(a_eq), np.array(b_eq)
    right = {}
    for (x, y), t in margins.items():
        right.setdefault(x, t[1].sum() / n)
        right.setdefault(y, t[:, 1].sum() / n)
    mean = (right["rule_c"] - right["base_c"]) - (right["rule_s"] - right["base_s"])
    ends = []
    for sign in (1, -1):
        res = optimize.linprog(sign * D2, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs")
        if not res.success:
            raise ValueError(f"the margins admit no joint distribution: {res.message}")
        ends.append(sign * res.fun - mean ** 2)
    return float(mean), max(ends[0], 0.0), max(ends[1], 0.0)


def _counts(paired: pd.DataFrame, acc: dict, method: str, budget: int) -> tuple[int, int, int, int, int]:
    """(n, rule right, base right, rule only, base only) of one rule at one budget of a grid."""
    r = paired[(paired["method"] == method) & (paired["budget"] == budget) & (paired["metric"] == "accuracy")].iloc[0]
    n = int(r["n"])
    return (n, round(acc[(method, budget)] * n), round(acc[("base", budget)] * n), int(r["a_only"]),
            int(r["b_only"]))


def _accuracies(grid: Path) -> dict:
    t = pd.read_csv(grid.with_suffix(".csv"))
    t = t[(t["metric"] == "accuracy") & t["budget"].notna()]
    return {(m, int(b)): float(v) for m, b, v in zip(t["method"], t["budget"], t["mean"])}


def from_tables(static: str | Path, continuous: str | Path, batching: str | Path | None = None) -> pd.DataFrame:
    """The difference in differences of every rule and budget both grids compared with base."""
    static, continuous = Path(static), Path(continuous)
    ps, pc = (pd.read_csv(g.parent / f"{g.name}_paired.csv") for g in (static, continuous))
    acc_s, acc_c = _accuracies(static), _accuracies(continuous)
    shift = pd.read_csv(f"{batching}.csv") if batching else None
    rows = []
    keys = ps[ps["metric"] == "accuracy"][["method", "budget"]].drop_duplicates()
    for method, budget in keys.itertuples(index=False):
        budget = int(budget)
        if not ((pc["method"] == method) & (pc["budget"] == budget) & (pc["metric"] == "accuracy")).any():
            continue
        n, rs, bs, rs_only, bs_only = _counts(ps, acc_s, method, budget)
        n_c, rc, bc, rc_only, bc_only = _counts(pc, acc_c, method, budget)
        if n_c != n:
            raise SystemExit(f"error: {method} at M={budget}: {n} prompts static, {n_c} continuous")
        margins = {("rule_s", "base_s"): table_2x2(n, rs, bs, rs_only, bs_only),
                   ("rule_c", "base_c"): table_2x2(n, rc, bc, rc_only, bc_only)}
        if shift is not None:
            for who, right_c, right_s in (("rule", rc, rs), ("base", bc, bs)):
                m = "base" if who == "base" else method
                r = shift[(shift["method"] == m) & (shift["budget"] == budget)].iloc[0]
                margins[(f"{who}_c", f"{who}_s")] = table_2x2(n, right_c, right_s, int(r["a_only"]), int(r["b_only"]))
        mean, var_lo, var_hi = bounds(n, margins)
        se_hi, se_lo = np.sqrt(var_hi / (n - 1)), np.sqrt(var_lo / (n - 1))
        z = stats.norm.isf(S.ALPHA / 2)
        rows.append({"method": method, "budget": budget, "metric": "accuracy",
                     "static_diff": (rs - bs) / n, "continuous_diff": (rc - bc) / n,
                     "diff": mean, "low": mean - z * se_hi, "high": mean + z * se_hi, "p": S.p_normal(mean, se_hi),
                     "p_min": S.p_normal(mean, se_lo), "p_tost": S.tost_normal(mean, se_hi, S.MARGINS["accuracy"]),
                     "margin": S.MARGINS["accuracy"], "se": se_hi, "se_min": se_lo, "n": n,
                     "test": f"z test at the largest variance {len(margins)} committed 2x2 margins allow",
                     "unit": f"prompts ({n})"})
    if not rows:
        raise SystemExit(f"error: {static} and {continuous} compare no rule at the same budget")
    return S.grid_calls(pd.DataFrame(rows))


def from_records(static: str | Path, continuous: str | Path, ref: str = "base") -> pd.DataFrame:
    """The same from two grids' records files: per prompt d, the sign-flip test and its interval."""
    ps, pc = R.read(static)[0], R.read(continuous)[0]
    rows = []
    for budget in sorted(set(ps["budget"].dropna()) & set(pc["budget"].dropna())):
        per = {}
        for tag, frame in (("s", ps), ("c", pc)):
            at = frame[frame["budget"] == budget]
            per[tag] = at.pivot_table(index=R.PROMPT, columns="method", values="correct", aggfunc="mean")
        for method in sorted((set(per["s"].columns) & set(per["c"].columns)) - {ref}):
            j = pd.concat({k: per[k][[method, ref]] for k in ("s", "c")}, axis=1).dropna()
            if len(j) != len(per["s"]) or len(j) != len(per["c"]):
                raise SystemExit(f"error: {method} at M={budget}: the two grids scored different prompts")
            static_d, cont_d = j[("s", method)] - j[("s", ref)], j[("c", method)] - j[("c", ref)]
            d = (cont_d - static_d).to_numpy(float)
            p, low, high = S.sign_flip(d)
            se = float(d.std(ddof=1) / np.sqrt(len(d)))
            rows.append({"method": method, "budget": int(budget), "metric": "accuracy",
                         "static_diff": float(static_d.mean()), "continuous_diff": float(cont_d.mean()),
                         "diff": float(d.mean()), "low": low, "high": high, "p": p, "p_min": p,
                         "p_tost": S.tost_normal(float(d.mean()), se, S.MARGINS["accuracy"]),
                         "margin": S.MARGINS["accuracy"], "se": se, "se_min": se, "n": len(d),
                         "test": "sign-flip permutation over prompts; the interval inverts it", "unit": f"prompts ({len(d)})"})
    if not rows:
        raise SystemExit(f"error: {static} and {continuous} share no rule and budget")
    return S.grid_calls(pd.DataFrame(rows))


def markdown(t: pd.DataFrame, command: str) -> str:
    counts = t["call"].value_counts().reindex(["higher", "lower", "inconclusive"], fill_value=0)
    show = t.assign(static=[f"{v:+.3f}" for v in t["static_diff"]], continuous=[f"{v:+.3f}" for v in t["continuous_diff"]],
                    difference=[f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]" for d, lo, hi in zip(t["diff"], t["low"], t["high"])])
    cols = ["budget", "method", "static", "continuous", "difference", "p", "p_min", "p_holm", "call"]
    cols += [c for c in ("q", "scope") if c in t]
    return (f"Made by `{command}`.\n\n"
            "Accuracy, (rule - base) under continuous batching minus (rule - base) under static batches, the same "
            "prompts: a negative difference means the rule falls further behind base (or its lead shrinks) at full "
            f"batches. {t['test'].iloc[0]}; 95 % interval of that test; p_min: the p at the smallest variance the "
            f"margins allow; Holm over the {len(t)} rows at {S.ALPHA:g}; no accuracy tie is called. Calls: "
            f"{counts['higher']} higher, {counts['lower']} lower, {counts['inconclusive']} inconclusive.\n\n"
            + show[cols].to_markdown(index=False, floatfmt=".3g") + "\n")


def main(argv: list[str]) -> None:
    if argv[:1] == ["--records"]:
        static, continuous, dest = argv[1:4]
        t = from_records(static, continuous)
    else:
        static, continuous, dest, *rest = argv
        t = from_tables(static, continuous, rest[0] if rest else None)
    command = "python -m analysis.did " + " ".join(argv)
    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    t.to_csv(f"{dest}.csv", index=False)
    Path(f"{dest}.md").write_text(markdown(t, command))
    print(Path(f"{dest}.md").read_text())


if __name__ == "__main__":
    if len(sys.argv) < 4:
        raise SystemExit("usage: python -m analysis.did <static grid> <continuous grid> <dest> [<batching table>] | "
                         "--records <static records> <continuous records> <dest>")
    main(sys.argv[1:])
