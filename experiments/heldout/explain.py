"""Issue 41 item 5 (descriptive, docs/preregistration_heldout.md): per held-out model, the measures
that might say when `base` beats `router_sq`, beside the online difference at each budget.

    python -m experiments.heldout.explain outputs results/heldout/grid_explain

Per model, from its calibration and predictor (the artifacts its `base` runs name in report.json):
  r2                 the predictor's held-out R², mean over MoE layers
  norm_spread        the spread of ||E_u(z)|| across experts: the standard deviation over experts of
                     the mean calibration log-norm, mean over layers
  weight_scale       the mean per-token sum of the top-k router weights (1 where renormalised)
  coverage           the fewest routed calibration tokens of an expert over its predictor's H weights
Per cell (model, budget): union_over_budget (the dense run's union / the budget), the online
`base` − `router_sq` accuracy difference (paired on the same prompts) and the diagnostic's
mean-agreement difference (the base run's report.json). The Spearman correlation of each measure
with the online difference over the cells is printed beside the table: descriptive, no test.
Shapes: L MoE layers, N calibration tokens, K top-k, E experts, H hidden. Reads outputs/ only.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file
from scipy import stats as sps

from analysis.engines import with_engine
from analysis.load import fail
from analysis.paired import load_samples, paired
from experiments.heldout.grid_calls import grid_runs

MEASURES = ("r2", "norm_spread", "weight_scale", "coverage", "union_over_budget", "diagnostic_diff")


def calibration_measures(calib: dict[str, torch.Tensor], num_experts: int, hidden: int) -> dict[str, float]:
    """norm_spread, weight_scale and coverage of one calibration (the tensors of calib.safetensors)."""
    layers = sorted({k.split(".")[0] for k in calib})
    spread, scale, fewest = [], [], []
    for layer in layers:
        idx_NK, w_NK, norms_NK = calib[f"{layer}.idx_NK"].long(), calib[f"{layer}.w_NK"].float(), calib[f"{layer}.norms_NK"].float()
        count_E = torch.bincount(idx_NK.flatten(), minlength=num_experts).float()
        logsum_E = torch.zeros(num_experts).index_add_(0, idx_NK.flatten(), norms_NK.clamp_min(1e-30).log().flatten())
        routed = count_E > 0
        spread.append(float((logsum_E[routed] / count_E[routed]).std()))
        scale.append(float(w_NK.sum(-1).mean()))
        fewest.append(float(count_E.min()))
    return {"norm_spread": float(np.mean(spread)), "weight_scale": float(np.mean(scale)),
            "coverage": min(fewest) / hidden}


def model_measures(all_runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for model, g in all_runs.groupby("model"):
        base = g[g["variant"] == "base"]
        if base.empty:
            continue
        report = json.loads((Path(base["dir"].iloc[0]) / "report.json").read_text())
        pred = Path(report["artifacts"]["predictor"])
        meta = json.loads(pred.with_suffix(".json").read_text())
        calib = load_file(str(pred.parent / "calib.safetensors"))
        rows.append({"model": model, "r2": float(np.mean(meta["r2"])),
                     **calibration_measures(calib, report["num_experts"], meta["model"]["hidden"])})
    return pd.DataFrame(rows)


def cells(all_runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    dense = all_runs[all_runs["variant"] == "dense"]
    for (model, budget), g in all_runs[all_runs["budget"].notna()].groupby(["model", "budget"]):
        base, rsq = g[g["variant"] == "base"], g[g["variant"] == "router_sq"]
        d = dense[dense["model"] == model]
        if len(base) != 1 or len(rsq) != 1 or len(d) != 1:
            continue
        union = json.loads((Path(d["dir"].iloc[0]) / "report.json").read_text())["summary"]["union_mean"]
        c = paired(load_samples(base["dir"].iloc[0]), load_samples(rsq["dir"].iloc[0]))
        agree = base["agreement"].iloc[0]
        rows.append({"model": model, "budget": int(budget), "union_over_budget": union / budget,
                     "online_diff": c["diff"], "diagnostic_diff": agree.get("base", np.nan) - agree.get("router_sq", np.nan)})
    return pd.DataFrame(rows)


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        fail("usage: python -m experiments.heldout.explain outputs results/heldout/grid_explain")
    root, dest = Path(argv[0]), Path(argv[1])
    all_runs = grid_runs(root)
    table = cells(all_runs).merge(model_measures(all_runs), on="model")
    if table.empty:
        fail("no model has its dense, base and router_sq runs yet")
    rho = {m: sps.spearmanr(table[m], table["online_diff"]) if table[m].nunique() > 1 and len(table) > 2 else None
           for m in MEASURES}
    made = (f"Made by `python -m experiments.heldout.explain {argv[0]} {argv[1]}` from the runs of engine "
            f"`{all_runs['engine'].iloc[0]}` (descriptive: no test; {table['model'].nunique()} models, {len(table)} cells).\n")
    lines = [made,
             "Spearman correlation of each measure with the online base − router_sq difference over the cells:\n"]
    lines += [f"- {m}: " + (f"rho = {r.statistic:.3f}" if r is not None else "constant or too few cells") for m, r in rho.items()]
    lines += ["", table.to_markdown(index=False, floatfmt=".4f")]
    dest.parent.mkdir(parents=True, exist_ok=True)
    with_engine(table, all_runs["engine"].iloc[0]).to_csv(dest.with_suffix(".csv"), index=False, float_format="%.6g")
    dest.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
