"""Issue 41's pre-registered calls (docs/preregistration_heldout.md) from the held-out grid's runs.

    python -m experiments.heldout.grid_calls outputs results/heldout/grid

Reads every finished run under <root>/heldout_grid_<model>/ (`bash experiments/heldout/grid.sh
<model>`). A model whose dense accuracy is below 0.30 is reported and left out of the families.
The three families, each paired on the same prompts with the exact McNemar test and Holm's
correction over the family (alpha 0.05; "higher"/"lower" only where the Holm-adjusted p < 0.05):
  calibrated   base(shrink=auto) minus each other deployable rule, every budget of every model
  recommended  base_anchor(k0=1) minus each other deployable rule, likewise
  diagnostic   base minus router_sq online, per model and budget, beside the diagnostic's
               mean-agreement difference (base's run's report.json `diagnostic`): validated if their
               signs agree in every cell where the online test makes a call; the Spearman correlation
               of online accuracy and diagnostic agreement over every cell's deployable rules beside it
Writes <dest>_<family>.csv, <dest>_models.csv (each pre-registered model: family, experts, top-k,
dense accuracy, whether it ran and is in the families), <dest>.md (the three tables, the decisions, the models left out and any
model or budget not run yet: the families are then partial, and the .md says so). Reads outputs/ only.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

from analysis import stats as S
from analysis.engines import one_engine, with_engine
from analysis.load import fail
from analysis.paired import load_samples, paired
from experiments.heldout.calls import run_row

MODELS = ("olmoe64_s1", "olmoe64_s2", "olmoe32_s1", "olmoe128_s1", "qwen32_s1", "qwen64_s1", "qwen128_s1")
CALIBRATED = "base(shrink=auto)"
RECOMMENDED = "base_anchor(k0=1)"
DEPLOYABLE = ("base", "router_sq", RECOMMENDED, "top1_union", "calib_energy", CALIBRATED)
MIN_DENSE = 0.30


def runs(root: Path) -> pd.DataFrame:
    return pd.DataFrame([run_row(report) for report in sorted(root.glob("heldout_grid_*/*/report.json"))])


def grid_runs(root: Path) -> pd.DataFrame:
    """`runs(root)`, refused (exit 2) where there are none or they come from several engines."""
    all_runs = runs(root)
    if all_runs.empty:
        fail(f"{root} holds no finished runs of the held-out grid (outputs/heldout_grid_<model>/)")
    one_engine(all_runs, "the grid's runs")
    return all_runs


def _family(runs_: pd.DataFrame, rule: str, name: str) -> pd.DataFrame:
    rows = []
    for (model, budget), g in runs_[runs_["budget"].notna()].groupby(["model", "budget"]):
        mine = g[g["variant"] == rule]
        if len(mine) != 1:
            continue
        a = load_samples(mine["dir"].iloc[0])
        for other in DEPLOYABLE:
            theirs = g[g["variant"] == other]
            if other == rule or len(theirs) != 1:
                continue
            c = paired(a, load_samples(theirs["dir"].iloc[0]))
            rows.append({"family": name, "model": model, "budget": int(budget), "rule": rule, "other": other,
                         "n": c["n"], "acc_rule": c["acc_a"], "acc_other": c["acc_b"], "diff": c["diff"],
                         "rule_only": c["a_only"], "other_only": c["b_only"], "p": c["mcnemar_p"]})
    return _holm(pd.DataFrame(rows))


def _holm(fam: pd.DataFrame) -> pd.DataFrame:
    if fam.empty:
        return fam
    fam["p_holm"] = S.holm(fam["p"].to_numpy())
    fam["call"] = ["higher" if p < S.ALPHA and d > 0 else "lower" if p < S.ALPHA and d < 0 else "inconclusive"
                   for d, p in zip(fam["diff"], fam["p_holm"])]
    return fam


def diagnostic_family(runs_: pd.DataFrame) -> tuple[pd.DataFrame, float, float]:
    """(base - router_sq online per cell with the diagnostic's difference, Spearman rho, its p)."""
    rows, pairs = [], []
    for (model, budget), g in runs_[runs_["budget"].notna()].groupby(["model", "budget"]):
        base, rsq = g[g["variant"] == "base"], g[g["variant"] == "router_sq"]
        agree = base["agreement"].iloc[0] if len(base) == 1 else {}
        for _, r in g.iterrows():  # every deployable rule the diagnostic scored at this budget
            if r["variant"] in agree:
                pairs.append((r["accuracy"], agree[r["variant"]]))
        if len(base) != 1 or len(rsq) != 1:
            continue
        c = paired(load_samples(base["dir"].iloc[0]), load_samples(rsq["dir"].iloc[0]))
        diag = agree.get("base", np.nan) - agree.get("router_sq", np.nan)
        rows.append({"family": "diagnostic", "model": model, "budget": int(budget), "n": c["n"],
                     "acc_base": c["acc_a"], "acc_router_sq": c["acc_b"], "diff": c["diff"],
                     "base_only": c["a_only"], "router_sq_only": c["b_only"], "p": c["mcnemar_p"],
                     "diagnostic_diff": diag})
    fam = _holm(pd.DataFrame(rows))
    if not fam.empty:
        fam["signs_agree"] = [np.sign(d) == np.sign(g) if call != "inconclusive" else None
                              for d, g, call in zip(fam["diff"], fam["diagnostic_diff"], fam["call"])]
    rho, p = (sps.spearmanr([a for a, _ in pairs], [b for _, b in pairs]) if len(pairs) > 2 else (np.nan, np.nan))
    return fam, float(rho), float(p)


def models_table(all_runs: pd.DataFrame, left_out: list[str]) -> pd.DataFrame:
    """One row per pre-registered model: what it is and whether the families hold it (status: in,
    left out (dense below MIN_DENSE), not run)."""
    rows = []
    for m in (*MODELS, *sorted(set(all_runs["model"]) - set(MODELS))):
        g = all_runs[all_runs["model"] == m]
        dense = g[g["variant"] == "dense"]
        rows.append({"model": m, "family": g["family"].iloc[0] if len(g) else None,
                     "experts": g["experts"].iloc[0] if len(g) else None, "top_k": g["top_k"].iloc[0] if len(g) else None,
                     "dense_accuracy": float(dense["accuracy"].iloc[0]) if len(dense) else np.nan,
                     "budgets": int(g["budget"].dropna().nunique()),
                     "status": "not run" if g.empty else "left out" if m in left_out else "in"})
    return pd.DataFrame(rows)


def decisions(cal: pd.DataFrame, rec: pd.DataFrame, diag: pd.DataFrame) -> list[str]:
    out = []
    if cal.empty:
        out.append("calibrated BASE: no comparisons yet")
    else:
        lost = cal[cal["call"] == "lower"]
        out.append("calibrated BASE: called lower in no comparison: it becomes the default (if the family is whole)"
                   if lost.empty else f"calibrated BASE: called lower in {len(lost)} comparisons: it does not become "
                   "the default")
    if rec.empty:
        out.append("base_anchor(k0=1): no comparisons yet")
    else:
        lost = rec[rec["call"] == "lower"]
        where = "; ".join(f"{r.model} M={r.budget} against {r.other}" for r in lost.itertuples())
        out.append("base_anchor(k0=1): called lower in no comparison: it stays recommended for serving"
                   if lost.empty else f"base_anchor(k0=1): called lower at {where}")
    if diag.empty:
        out.append("diagnostic: no cells yet")
    else:
        agree = [bool(a) for a in diag.loc[diag["call"] != "inconclusive", "signs_agree"]]  # numpy bools summed as
        ok = all(agree) if agree else None  # objects would be or-ed, not counted
        out.append("diagnostic: no cell's online difference is called, so its sign cannot be checked" if ok is None
                   else f"diagnostic: {'validated' if ok else 'not validated'} ({sum(agree)} "
                   f"of {len(agree)} called cells agree in sign)")
    return out


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        fail("usage: python -m experiments.heldout.grid_calls outputs results/heldout/grid")
    root, dest = Path(argv[0]), Path(argv[1])
    all_runs = grid_runs(root)
    dense = all_runs[all_runs["variant"] == "dense"].set_index("model")["accuracy"]
    left_out = sorted(m for m, a in dense.items() if a < MIN_DENSE)
    kept = all_runs[~all_runs["model"].isin(left_out)]
    cal = _family(kept, CALIBRATED, "calibrated")
    rec = _family(kept, RECOMMENDED, "recommended")
    diag, rho, rho_p = diagnostic_family(kept)
    dest.parent.mkdir(parents=True, exist_ok=True)
    engine = all_runs["engine"].iloc[0]
    for name, t in (("calibrated", cal), ("recommended", rec), ("diagnostic", diag)):
        with_engine(t, engine).to_csv(dest.parent / f"{dest.name}_{name}.csv", index=False, float_format="%.6g")
    missing = [m for m in MODELS if m not in set(all_runs["model"])]
    with_engine(models_table(all_runs, left_out), engine).to_csv(dest.parent / f"{dest.name}_models.csv", index=False,
                                                                 float_format="%.6g")
    budgets = kept[kept["budget"].notna()].groupby("model")["budget"].nunique()
    partial = missing or any(budgets.get(m, 0) < 3 for m in set(kept["model"]))
    made = (f"Made by `python -m experiments.heldout.grid_calls {argv[0]} {argv[1]}` from the runs of "
            f"`bash experiments/heldout/grid.sh <model>` (engine `{all_runs['engine'].iloc[0]}`; "
            "docs/preregistration_heldout.md: exact McNemar, Holm over each family).\n")
    spearman = (f"- Spearman over every cell's deployable rules, online accuracy against diagnostic agreement: "
                f"rho = {rho:.3f} (p = {rho_p:.3g}; descriptive)\n")
    text = [made,
            f"**{'Partial: ' if partial else ''}models run**: "
            + ", ".join(f"{m} (dense {dense.get(m, float('nan')):.3f})" for m in sorted(set(all_runs["model"])))
            + (f"; not run yet: {', '.join(missing)}" if missing else "")
            + (f"; left out (dense below {MIN_DENSE}): {', '.join(left_out)}" if left_out else "") + ".\n",
            "Decisions" + (" (on a partial family: not the pre-registered call)" if partial else "") + ":\n",
            *[f"- {d}" for d in decisions(cal, rec, diag)], spearman]
    for name, t in (("Calibrated BASE", cal), ("base_anchor(k0=1)", rec), ("Diagnostic", diag)):
        text += [f"\n## {name}\n", t.drop(columns=["family"]).to_markdown(index=False, floatfmt=".4f")
                 if not t.empty else "(none yet)", ""]
    (dest.parent / f"{dest.name}.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main(sys.argv[1:])
