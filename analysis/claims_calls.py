"""The phrases of the written readings that state calls across grids (issue 27), each rebuilt from
the committed tables it cites, for analysis/claims.py: `README_CHECKS` for README.md and
`RESULTS_CHECKS` for results/README.md, (name, source, phrase, render) as claims.Check takes them.

A call that fails the cross-grid correction (column `scope`, analysis/cross_grid.py) is marked
"exploratory" in the phrase; a phrase that names a call the tables no longer make, or omits the
mark, no longer renders to itself. Reads results/ only (pandas).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis import stats as S

ROOT = Path(__file__).resolve().parents[1]
DASH = "–"


def _t(name: str) -> pd.DataFrame:
    return pd.read_csv(ROOT / "results" / f"{name}.csv")


def _row(t: pd.DataFrame, method: str, budget: int | None, metric: str = "accuracy") -> pd.Series:
    hit = t[(t["method"] == method) & (t["metric"] == metric)
            & (t["budget"].isna() if budget is None else t["budget"] == budget)]
    if len(hit) != 1:
        raise ValueError(f"{len(hit)} rows for {method} at {budget} ({metric})")
    return hit.iloc[0]


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


# ---- results/README.md: quality vs budget (quality_mini_diff) ------------------------------------

def quality_diff_others() -> str:
    t = _t("quality_mini_diff").rename(columns={"variant": "method"})
    rules = ("router_sq", "calib_energy", "oracle", "base+drop")
    called = t[t["method"].isin(rules) & (t["call"] != "inconclusive")]
    every = "every call is inconclusive" if called.empty else f"{len(called)} calls are made"
    return f"against `router_sq`, `calib_energy`, the `oracle` and `drop` {every}"


# ---- results/README.md: the ablation grids -------------------------------------------------------

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


# ---- results/README.md: the quality grids, static and continuous ---------------------------------

def static_accuracy() -> str:
    mini, olmoe = _t("quality_seeds_mini_paired"), _t("quality_seeds_mini_olmoe_paired")
    four = ("top1_union", "router_sq", "calib_energy", "oracle")
    made = mini[(mini["metric"] == "accuracy") & mini["method"].isin(four) & (mini["call"] != "inconclusive")]
    above = [f"`{m}` at " + " and ".join(f"M={int(r['budget'])} ({r['diff']:+.3f}{_ex(r)})" for r in rows)
             for m in ("top1_union", "oracle") if (rows := _where(olmoe, m, "higher"))]
    return (f"against `top1_union`, `router_sq`, `calib_energy` and the `oracle` "
            f"{'every call on `mini` is inconclusive' if made.empty else f'{len(made)} calls on `mini` are made'}. "
            f"On `mini_olmoe` these are above `base`: {'; '.join(above) or 'none'}")


def continuous_router_sum() -> str:
    mini, olmoe = _t("quality_seeds_mini_continuous_paired"), _t("quality_seeds_mini_olmoe_continuous_paired")
    did_mini, did_olmoe = _t("quality_seeds_mini_did"), _t("quality_seeds_mini_olmoe_did")
    grows = [(m, r) for m, t in (("mini", did_mini), ("mini_olmoe", did_olmoe))
             for _, r in t[(t["method"] == "router_sum") & (t["call"] == "lower")].iterrows()]
    m8 = _row(did_mini, "router_sum", 8)
    grow = "; ".join(f"on `{m}` at M={int(r['budget'])} ({r['diff']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}]{_ex(r)})"
                     for m, r in grows) or "nowhere"
    return (f"`base` is above `router_sum` at {_marked(_where(mini, 'router_sum', 'lower'))} on `mini` and at "
            f"{_marked(_where(olmoe, 'router_sum', 'lower'))} on `mini_olmoe`. Whether this lead grows at full batches "
            f"was tested as a paired difference in differences (below): it grows {grow}, and is not shown to grow at "
            f"any other budget (on `mini` at M=8: {m8['diff']:+.3f} [{m8['low']:+.3f}, {m8['high']:+.3f}])")


def continuous_others() -> str:
    olmoe = _t("quality_seeds_mini_olmoe_continuous_paired")
    ce = _row(olmoe, "calib_energy", 6)
    assert ce["call"] == "lower"
    return f"above `calib_energy` on `mini_olmoe` at M=6{' (exploratory)' if _ex(ce) else ''}"


def continuous_not_best() -> str:
    mini, olmoe = _t("quality_seeds_mini_continuous_paired"), _t("quality_seeds_mini_olmoe_continuous_paired")

    def at(t, method):
        rows = _where(t, method, "higher")
        return " and ".join(f"M={int(r['budget'])} ({r['diff']:+.3f}{_ex(r)})" for r in rows)

    return (f"`top1_union` is above it on `mini` at {at(mini, 'top1_union')} and on `mini_olmoe` at "
            f"{at(olmoe, 'top1_union')}, the `oracle` on `mini` at {at(mini, 'oracle')} and on `mini_olmoe` at "
            f"{at(olmoe, 'oracle')}")


def batching_shift() -> str:
    parts = {}
    for m in ("mini", "mini_olmoe"):
        t = _t(f"quality_seeds_{m}_batching")
        fam = t[t["call"] != S.EXCLUDED]
        budgeted = fam[fam["budget"].notna()]
        lower = budgeted[budgeted["call"] == "lower"]
        ex = int((lower["scope"] == "exploratory").sum())
        parts[m] = (len(fam), f"{len(lower)} of {len(budgeted)}" + (f" ({ex} exploratory)" if ex else ""),
                    int((budgeted["call"] == "higher").sum()))
    higher = sum(p[2] for p in parts.values())
    return (f"Holm over the {parts['mini'][0]} and {parts['mini_olmoe'][0]} points of each pair of grids, dense "
            f"left out as null by construction): accuracy is lower at {parts['mini'][1]} budgeted points on `mini` "
            f"and {parts['mini_olmoe'][1]} on `mini_olmoe`, higher at {higher or 'none'}")


def batching_base() -> str:
    mini, olmoe = _t("quality_seeds_mini_batching"), _t("quality_seeds_mini_olmoe_batching")
    m6, o6, m8 = _row(mini, "base", 6), _row(olmoe, "base", 6), _row(mini, "base", 8)
    assert {m6["call"], o6["call"], m8["call"]} == {"lower"}
    ex = lambda r: " (exploratory)" if _ex(r) else ""
    return (f"For `base` the fall is shown at the tightest budgets only (M=6: {m6['diff']:+.3f} on `mini`{ex(m6)}, "
            f"{o6['diff']:+.3f} on `mini_olmoe`{ex(o6)}; M=8 on `mini`: {m8['diff']:+.3f}{ex(m8)})")


def did_summary() -> str:
    lines = []
    for grid, label in (("quality_seeds_mini", "`mini`"), ("quality_seeds_mini_olmoe", "`mini_olmoe`"),
                        ("heldout_mini128", "`mini128`"), ("rules_mini", "the rules on `mini`"),
                        ("rules_mini_olmoe", "the rules on `mini_olmoe`")):
        t = _t(f"{grid}_did")
        shown = t[t["call"].isin(["higher", "lower"])].sort_values(["method", "budget"])
        cells = ", ".join(f"`{r['method']}` at M={int(r['budget'])} ({r['diff']:+.3f}{_ex(r)})"
                          for _, r in shown.iterrows())
        lines.append(f"{label}: {len(shown)} of {len(t)}" + (f" ({cells})" if cells else ""))
    return "; ".join(lines)


def heldout_shift() -> str:
    t = _t("heldout_mini128_batching")
    return f"continuous minus static (`heldout_mini128_batching.md`, Holm over {int((t['call'] != S.EXCLUDED).sum())} points)"


# ---- results/README.md: union-aware admission ----------------------------------------------------

def admission(model: str) -> str:
    t = _t(f"admission_{model}")
    r = _row(t.assign(metric="accuracy"), "base", int(t.loc[t["method"] == "base", "budget"].iloc[0]))
    return (f"base's accuracy {r['accuracy_fifo']:.3f} against {r['accuracy_union']:.3f}, {r['diff']:+.3f} "
            f"[{r['low']:+.3f}, {r['high']:+.3f}], {r['call']} (prompts and seeds crossed: standard error "
            f"{r['se']:.4f}, of which the seeds' {r['se_seed']:.4f} and the prompts' {r['se_prompt']:.4f}; p = "
            f"{r['p']:.2f}, equivalence p = {r['p_tost']:.2f})")


# ---- results/README.md: the rules grids and the old mini_olmoe transcripts -----------------------

def rules_top1_union() -> str:
    mini, olmoe = _t("quality_seeds_mini_continuous_paired"), _t("quality_seeds_mini_olmoe_continuous_paired")
    return (f"`top1_union` above `base` in the continuous quality grid ({_marked(_where(mini, 'top1_union', 'higher'))} "
            f"on `mini`, {_marked(_where(olmoe, 'top1_union', 'higher'))} on `mini_olmoe`)")


def olmoe_transcripts() -> str:
    f = pd.read_csv(ROOT / "results" / "cross_grid.csv")
    f = f[f["table"] == "quality_mini_olmoe_paired.md"].set_index("method")
    vs_rs = [f.loc[f"budget={m},method=base vs budget={m},method=router_sum"] for m in (6, 8, 12)]
    sq = f.loc["budget=6,method=base vs budget=6,method=router_sq"]
    oea2 = f.loc["budget=null,method=dense vs budget=null,method.k0=2,method=oea"]
    oea1 = f.loc["budget=null,method.k0=1,method=oea vs budget=6,method=base"]
    assert all(r["call"] == "higher" for r in vs_rs)
    ok = all(r["scope"] == "confirmed" for r in vs_rs)
    none = all(r["call"] == "inconclusive" for r in (sq, oea2, oea1))
    diffs = ", ".join(f"{r['diff']:+.3f}" for r in vs_rs)
    return (f"base is above router_sum at M=6, 8 and 12 ({diffs}; exact McNemar, "
            f"{'all three confirmed by' if ok else 'not all passing'} the cross-grid correction)"
            + ("; it is not shown different from router_sq at M=6, `oea` k0=2 (7.2 experts) from dense, nor base at "
               "M=6 (0.656) from `oea` k0=1 (0.662, 4.0 experts)" if none else "; other calls changed"))


# ---- README.md ----------------------------------------------------------------------------------

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
# (bullet, source, phrase as the file has it, render): checked against results/README.md
RESULTS_CHECKS = [
    _p("Quality vs budget", "results/quality_mini_diff.csv",
     "against `router_sq`, `calib_energy`, the `oracle` and `drop` every call is inconclusive", quality_diff_others),
    _p("Ablation: what the two grids support", "results/ablation_mini{,_olmoe}_paired.csv",
     "only `router_sum` is shown worse than `base` (M=6 and 8 on `mini`, M=6 on `mini_olmoe`); no rule, the `oracle` "
     "included, is shown better. With about 1,050 prompts these grids detect accuracy differences of 2.0–2.8 points "
     "at their strictest Holm level (the median minimal detectable difference), so every other accuracy comparison "
     "is inconclusive", ablation_accuracy),
    _p("Ablation: what the two grids support", "results/ablation_mini{,_olmoe}_paired.csv",
     "`router_sum` is worse than `base` at every budget on both models and the `oracle` better at M=6 (exploratory) "
     "on `mini` and at M=6 and 9 (M=9 exploratory) on `mini_olmoe`", ablation_kl),
    _p("Static grids: what they support", f"{QS}_paired.csv",
     "against `top1_union`, `router_sq`, `calib_energy` and the `oracle` every call on `mini` is inconclusive. On "
     "`mini_olmoe` these are above `base`: `top1_union` at M=6 (+0.022); `oracle` at M=6 (+0.018) and M=9 (+0.013)",
     static_accuracy),
    _p("Continuous grids: what they support", f"{QS}_continuous_paired.csv, {QS}_did.csv",
     "`base` is above `router_sum` at M=6, 8, 10 and 12 (M=12 exploratory) on `mini` and at M=6 and 9 on "
     "`mini_olmoe`. Whether this lead grows at full batches was tested as a paired difference in differences "
     "(below): it grows on `mini_olmoe` at M=9 (-0.046 [-0.071, -0.020]), and is not shown to grow at any other "
     "budget (on `mini` at M=8: -0.012 [-0.044, +0.019])", continuous_router_sum),
    _p("Continuous grids: what they support", "results/quality_seeds_mini_olmoe_continuous_paired.csv",
     "above `calib_energy` on `mini_olmoe` at M=6 (exploratory)", continuous_others),
    _p("Continuous grids: what they support", f"{QS}_continuous_paired.csv",
     "`top1_union` is above it on `mini` at M=8 (+0.028, exploratory) and on `mini_olmoe` at M=9 (+0.018, "
     "exploratory) and M=12 (+0.017), the `oracle` on `mini` at M=6 (+0.038) and on `mini_olmoe` at M=12 (+0.013, "
     "exploratory)", continuous_not_best),
    _p("What continuous batching does to each point", f"{QS}_batching.csv",
     "Holm over the 34 and 26 points of each pair of grids, dense left out as null by construction): accuracy is "
     "lower at 18 of 32 (1 exploratory) budgeted points on `mini` and 11 of 24 (2 exploratory) on `mini_olmoe`, "
     "higher at none", batching_shift),
    _p("What continuous batching does to each point", f"{QS}_batching.csv",
     "For `base` the fall is shown at the tightest budgets only (M=6: -0.071 on `mini`, -0.027 on `mini_olmoe` "
     "(exploratory); M=8 on `mini`: -0.031)", batching_base),
    _p("Difference in differences", "results/*_did.csv",
     "`mini`: 5 of 28 (`calib_freq` at M=10 (-0.085), `calib_freq` at M=12 (-0.081), `count` at M=8 (-0.076), "
     "`count` at M=10 (-0.082), `count` at M=12 (-0.059)); `mini_olmoe`: 3 of 21 (`count` at M=9 (-0.058), `count` "
     "at M=12 (-0.060), `router_sum` at M=9 (-0.046)); `mini128`: 0 of 10; the rules on `mini`: 0 of 12; the rules "
     "on `mini_olmoe`: 0 of 12", did_summary),
    _p("Held-out model", "results/heldout_mini128_batching.csv",
     "continuous minus static (`heldout_mini128_batching.md`, Holm over 12 points)", heldout_shift),
    _p("Union-aware admission", "results/admission_mini.csv",
     "base's accuracy 0.940 against 0.949, +0.009 [-0.000, +0.018], inconclusive (prompts and seeds crossed: "
     "standard error 0.0047, of which the seeds' 0.0006 and the prompts' 0.0047; p = 0.06, equivalence p = 0.41)",
     lambda: admission("mini")),
    _p("Union-aware admission", "results/admission_mini_olmoe.csv",
     "base's accuracy 0.612 against 0.612, +0.000 [-0.022, +0.022], inconclusive (prompts and seeds crossed: "
     "standard error 0.0072, of which the seeds' 0.0063 and the prompts' 0.0035; p = 1.00, equivalence p = 0.13)",
     lambda: admission("mini_olmoe")),
    _p("Rules under continuous batching", f"{QS}_continuous_paired.csv",
     "`top1_union` above `base` in the continuous quality grid (M=8 (exploratory) on `mini`, M=9 and 12 (M=9 "
     "exploratory) on `mini_olmoe`)", rules_top1_union),
    _p("Routing realism", "results/cross_grid.csv (results/quality_mini_olmoe_paired.md)",
     "base is above router_sum at M=6, 8 and 12 (+0.034, +0.019, +0.009; exact McNemar, all three confirmed by the "
     "cross-grid correction); it is not shown different from router_sq at M=6, `oea` k0=2 (7.2 experts) from dense, "
     "nor base at M=6 (0.656) from `oea` k0=1 (0.662, 4.0 experts)", olmoe_transcripts),
]
# checked against README.md
README_CHECKS = [
    _p("How a difference is called", "results/cross_grid.csv",
     "Across grids, every call is corrected again: Benjamini–Hochberg over all 711 committed comparisons and Holm "
     "over the 181 the headline bullets report (`python -m analysis.cross_grid`, `results/cross_grid.md`); 15 of the 399 "
     "calls fail it and are marked exploratory wherever they are shown", how_called),
]
