"""Issue 41, item 1: each rule against `base` on the held-out model, from the runs of
conf/experiment/heldout_mechanism.yaml (its header lists them). Exploratory: one model, one budget,
one batching seed; not the pre-registered family (docs/preregistration_heldout.md).

    python -m experiments.heldout.calls outputs/heldout_mechanism results/heldout/mechanism_calls

Per batching (one engine each), every budgeted rule against base on the same 1,600 prompts: exact
McNemar, Holm over that batching's comparisons (analysis/stats.py), and dense's accuracy for scale.
Writes <dest>.csv and <dest>.md; reads outputs/ only.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from analysis import stats as S
from analysis.engines import one_engine, run_engine
from analysis.load import fail, variant_label
from analysis.paired import load_samples, paired


def _runs(root: Path) -> pd.DataFrame:
    return pd.DataFrame([run_row(report) for report in sorted(root.glob("*/report.json"))])


def run_row(report: Path) -> dict:
    """One evaluate run of experiments/heldout/ (its report.json): what the calls read of it."""
    r = json.loads(report.read_text())
    cfg = yaml.safe_load((report.parent / "config.yaml").read_text())
    return {"dir": report.parent, "model": r["model"], "family": cfg.get("model", {}).get("family"),
            "experts": r.get("num_experts"), "top_k": r.get("top_k"), "batching": cfg.get("eval", {}).get("batching"),
            "variant": variant_label(r["method"], cfg.get("method", {})), "budget": r["budget"],
            "engine": run_engine(report.parent), "accuracy": r["summary"]["accuracy"],
            "shrink": ";".join(f"M={m}: alpha={v['alpha']:g}" for m, v in r.get("artifacts", {}).get("shrink", {}).items()),
            "agreement": (r.get("diagnostic") or {}).get("mean_agreement") or {}}


def calls(root: Path) -> pd.DataFrame:
    runs = _runs(root)
    if runs.empty:
        fail(f"{root} holds no finished runs")
    if runs["model"].nunique() != 1:
        fail(f"{root} holds runs of several models ({', '.join(sorted(runs['model'].unique()))}): one model per table")
    out = []
    for batching, g in runs.groupby("batching"):
        one_engine(g, f"the {batching} runs")  # several engines measure different steps
        base = g[g["variant"] == "base"]
        dense = g[g["variant"] == "dense"]
        if len(base) != 1:
            fail(f"the {batching} runs need exactly one plain base run, found {len(base)}")
        b = load_samples(base["dir"].iloc[0])
        rows = []
        for _, r in g[~g["variant"].isin(["base", "dense"])].iterrows():
            c = paired(load_samples(r["dir"]), b)
            rows.append({"batching": batching, "rule": r["variant"], "budget": int(r["budget"]), "n": c["n"],
                         "acc_rule": c["acc_a"], "acc_base": c["acc_b"],
                         "acc_dense": float(dense["accuracy"].iloc[0]) if len(dense) else np.nan,
                         "diff": c["diff"], "ci_low": c["ci_low"], "ci_high": c["ci_high"],
                         "rule_only": c["a_only"], "base_only": c["b_only"], "p": c["mcnemar_p"],
                         "shrink": r["shrink"], "engine": r["engine"]})
        fam = pd.DataFrame(rows)
        fam["p_holm"] = S.holm(fam["p"].to_numpy())
        fam["call"] = [{"higher": "rule higher", "lower": "base higher"}.get(S.call(d, p, 1.0), "inconclusive")
                       for d, p in zip(fam["diff"], fam["p_holm"])]
        out.append(fam)
    cols = ["batching", "rule", "budget", "n", "acc_rule", "acc_base", "acc_dense", "diff", "ci_low", "ci_high",
            "rule_only", "base_only", "p", "p_holm", "call", "shrink", "engine"]
    return pd.concat(out, ignore_index=True)[cols]


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        fail("usage: python -m experiments.heldout.calls outputs/heldout_mechanism results/heldout/mechanism_calls")
    root, dest = Path(argv[0]), Path(argv[1])
    table = calls(root)
    dest.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(dest.with_suffix(".csv"), index=False, float_format="%.6g")
    md = table.drop(columns=["shrink"]).to_markdown(index=False, floatfmt=".4f")
    dest.with_suffix(".md").write_text(
        f"Made by `python -m experiments.heldout.calls {argv[0]} {argv[1]}` (exploratory: one model, one budget, "
        "one batching seed; exact McNemar, Holm within each batching).\n\n" + md + "\n")
    print(md)


if __name__ == "__main__":
    main(sys.argv[1:])
