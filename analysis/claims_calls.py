"""The phrases of the written readings that state calls across grids (issue 27), each rebuilt from
the committed tables it cites, for analysis/claims.py: `QUALITY_CHECKS` for results/quality/README.md
(the static quality grids, and how a difference is called: moved there from README.md by issue 44),
(name, source, phrase, render) as claims.Check takes them. The phrases about the continuous-batching,
admission and held-out grids left with their text when those grids were archived (results/archive/,
issue 44).

A call that fails the cross-grid correction (column `scope`, analysis/cross_grid.py) is marked
"exploratory" in the phrase; a phrase that names a call the tables no longer make, or omits the
mark, no longer renders to itself. Reads results/ only (pandas).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DASH = "–"


def _t(name: str) -> pd.DataFrame:
    return pd.read_csv(ROOT / "results" / f"{name}.csv")


def _ex(r: pd.Series) -> str:
    return ", exploratory" if r.get("scope") == "exploratory" else ""


def _budgets(bs: list[int]) -> str:
    bs = [str(int(b)) for b in bs]
    return "M=" + (", ".join(bs[:-1]) + " and " + bs[-1] if len(bs) > 1 else bs[0])


def _where(t: pd.DataFrame, method: str, call: str, metric: str = "accuracy") -> list[pd.Series]:
    m = t[(t["method"] == method) & (t["metric"] == metric) & (t["call"] == call)].sort_values("budget")
    return [r for _, r in m.iterrows()]


def _marked(rows: list[pd.Series]) -> str:
    """M=6, 8 and 12 (M=12 exploratory)."""
    ex = [int(r["budget"]) for r in rows if r.get("scope") == "exploratory"]
    text = _budgets([r["budget"] for r in rows])
    if ex:
        text += f" ({_budgets(ex)} exploratory)" if len(ex) < len(rows) else " (exploratory)"
    return text


# ---- results/quality/README.md: quality vs budget (quality_mini_diff) ----------------------------

def quality_diff_others() -> str:
    t = _t("quality_mini_diff").rename(columns={"variant": "method"})
    rules = ("router_sq", "calib_energy", "oracle", "base+drop")
    called = t[t["method"].isin(rules) & (t["call"] != "inconclusive")]
    every = "every call is inconclusive" if called.empty else f"{len(called)} calls are made"
    return f"against `router_sq`, `calib_energy`, the `oracle` and `drop` {every}"


# ---- results/quality/README.md: the ablation grids -----------------------------------------------

def ablation_accuracy() -> str:
    grids = {"mini": _t("ablation_mini_paired"), "mini_olmoe": _t("ablation_mini_olmoe_paired")}
    worse = {m: [int(r["budget"]) for r in _where(t, "router_sum", "lower")] for m, t in grids.items()}
    better = sum(len(t[(t["metric"] == "accuracy") & (t["call"] == "higher")]) for t in grids.values())
    others = sum(len(t[(t["metric"] == "accuracy") & (t["call"] == "lower") & (t["method"] != "router_sum")])
                 for t in grids.values())
    mdd = [float(t[(t["metric"] == "accuracy")]["mdd"].median()) for t in grids.values()]
    only = "only `router_sum` is" if not others else "`router_sum` and others are"
    return (f"{only} shown worse than `base` ({_budgets(worse['mini'])} on `mini`, {_budgets(worse['mini_olmoe'])} "
            f"on `mini_olmoe`); {'no rule' if not better else f'{better} rules'}, the `oracle` included, is shown "
            f"better. With about 1,050 prompts these grids detect accuracy differences of "
            f"{min(mdd) * 100:.1f}{DASH}{max(mdd) * 100:.1f} points at their strictest Holm level (the median "
            "minimal detectable difference), so every other accuracy comparison is inconclusive")


def ablation_kl() -> str:
    mini, olmoe = _t("ablation_mini_paired"), _t("ablation_mini_olmoe_paired")
    rs = [r for t in (mini, olmoe) for r in _where(t, "router_sum", "higher", "kl")]
    every = "at every budget on both models" if len(rs) == 4 else f"at {len(rs)} of 4 points"
    return (f"`router_sum` is worse than `base` {every} and the `oracle` better at "
            f"{_marked(_where(mini, 'oracle', 'lower', 'kl'))} on `mini` and at "
            f"{_marked(_where(olmoe, 'oracle', 'lower', 'kl'))} on `mini_olmoe`")


# ---- results/quality/README.md: the static quality grids ----------------------------------------

def static_accuracy() -> str:
    mini, olmoe = _t("quality_seeds_mini_paired"), _t("quality_seeds_mini_olmoe_paired")
    four = ("top1_union", "router_sq", "calib_energy", "oracle")
    made = mini[(mini["metric"] == "accuracy") & mini["method"].isin(four) & (mini["call"] != "inconclusive")]
    above = [f"`{m}` at " + " and ".join(f"M={int(r['budget'])} ({r['diff']:+.3f}{_ex(r)})" for r in rows)
             for m in ("top1_union", "oracle") if (rows := _where(olmoe, m, "higher"))]
    return (f"against `top1_union`, `router_sq`, `calib_energy` and the `oracle` "
            f"{'every call on `mini` is inconclusive' if made.empty else f'{len(made)} calls on `mini` are made'}. "
            f"On `mini_olmoe` these are above `base`: {'; '.join(above) or 'none'}")


# ---- results/quality/README.md: the old mini_olmoe transcripts ---------------------------------

def olmoe_transcripts() -> str:
    f = pd.read_csv(ROOT / "results" / "cross_grid.csv")
    f = f[f["table"] == "quality_mini_olmoe_paired.md"].set_index("method")
    vs_rs = [f.loc[f"budget={m},method=base vs budget={m},method=router_sum"] for m in (6, 8, 12)]
    sq = f.loc["budget=6,method=base vs budget=6,method=router_sq"]
    oea2 = f.loc["budget=null,method=dense vs budget=null,method.k0=2,method=oea"]
    oea1 = f.loc["budget=null,method.k0=1,method=oea vs budget=6,method=base"]
    above = [m for m, r in zip((6, 8, 12), vs_rs) if r["call"] == "higher"]
    other = [m for m, r in zip((6, 8, 12), vs_rs) if r["call"] != "higher"]
    ok = all(r["scope"] == "confirmed" for r in vs_rs if r["call"] == "higher")
    none = all(r["call"] == "inconclusive" for r in (sq, oea2, oea1))
    diffs = ", ".join(f"M={m} {r['diff']:+.3f}" for m, r in zip((6, 8, 12), vs_rs))
    return (f"base is above router_sum at M={' and '.join(map(str, above))} "
            f"({'confirmed by' if ok else 'not all passing'} the cross-grid correction)"
            + (f" and inconclusive at M={' and '.join(map(str, other))}" if other else "")
            + f" ({diffs}; exact McNemar, Holm over the transcript's 9 comparisons)"
            + ("; it is not shown different from router_sq at M=6, `oea` k0=2 (7.2 experts) from dense, nor base at "
               "M=6 (0.656) from `oea` k0=1 (0.662, 4.0 experts)" if none else "; other calls changed"))


# ---- results/quality/README.md: how a difference is called (README.md's until issue 44) ----------

def how_called() -> str:
    f = pd.read_csv(ROOT / "results" / "cross_grid.csv")
    fam = f[f["excluded"].isna() | (f["excluded"] == "")]
    fam = fam[fam["p"].notna()]
    called = fam[fam["call"].isin(["higher", "lower", "tie"])]
    return (f"Across grids, every call is corrected again: Benjamini{DASH}Hochberg over all {len(fam)} committed "
            f"comparisons and Holm over the {int(fam['p_headline'].notna().sum())} the headline bullets report "
            f"(`python -m analysis.cross_grid`, `results/cross_grid.md`); {int((called['scope'] == 'exploratory').sum())} "
            f"of the {len(called)} calls fail it and are marked exploratory wherever they are shown")


def _p(name: str, source: str, phrase: str, render) -> tuple:
    """One checked phrase: (bullet, the committed files it cites, the text as the file has it, its renderer)."""
    return name, source, phrase, render


QS = "results/quality_seeds_mini{,_olmoe}"
# (bullet, source, phrase as the file has it, render): checked against results/quality/README.md
QUALITY_CHECKS = [
    _p("Quality vs budget", "results/quality_mini_diff.csv",
     "against `router_sq`, `calib_energy`, the `oracle` and `drop` every call is inconclusive", quality_diff_others),
    _p("Ablation: what the two grids support", "results/ablation_mini{,_olmoe}_paired.csv",
     "only `router_sum` is shown worse than `base` (M=6 and 8 on `mini`, M=6 on `mini_olmoe`); no rule, the `oracle` "
     "included, is shown better. With about 1,050 prompts these grids detect accuracy differences of 2.0–2.8 points "
     "at their strictest Holm level (the median minimal detectable difference), so every other accuracy comparison "
     "is inconclusive", ablation_accuracy),
    _p("Ablation: what the two grids support", "results/ablation_mini{,_olmoe}_paired.csv",
     "`router_sum` is worse than `base` at every budget on both models and the `oracle` better at M=6 on `mini` and "
     "at M=6 and 9 on `mini_olmoe`", ablation_kl),
    _p("Static grids: what they support", f"{QS}_paired.csv",
     "against `top1_union`, `router_sq`, `calib_energy` and the `oracle` every call on `mini` is inconclusive. On "
     "`mini_olmoe` these are above `base`: `top1_union` at M=6 (+0.022); `oracle` at M=6 (+0.018) and M=9 (+0.013)",
     static_accuracy),
    _p("Routing realism", "results/cross_grid.csv (results/quality_mini_olmoe_paired.md)",
     "base is above router_sum at M=6 and 8 (confirmed by the cross-grid correction) and inconclusive at M=12 (M=6 "
     "+0.034, M=8 +0.019, M=12 +0.009; exact McNemar, Holm over the transcript's 9 comparisons); it is not shown "
     "different from router_sq at M=6, `oea` k0=2 (7.2 experts) from dense, nor base at M=6 (0.656) from `oea` k0=1 "
     "(0.662, 4.0 experts)", olmoe_transcripts),
    _p("How a difference is called", "results/cross_grid.csv",
     "Across grids, every call is corrected again: Benjamini–Hochberg over all 593 committed comparisons and Holm "
     "over the 42 the headline bullets report (`python -m analysis.cross_grid`, `results/cross_grid.md`); 1 of the 414 "
     "calls fail it and are marked exploratory wherever they are shown", how_called),
]
