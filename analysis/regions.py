"""The compiled-regions ablation (`throughput.regions`): each run's replayed step per variant and
its kernels per decoder layer, and the step with the layer regions against the module regions.

    python -m analysis.regions results/roofline/grid_2026-12-02e/ablation/runs results/roofline/grid_2026-12-02e/ablation/summary

Reads run folders (outputs/ or results/ only). The runs are separate processes on one machine,
so the comparison pairs runs, not interleaved passes: `ratio` is a variant's median ms with
`modules` over its median ms with `layer`, the range over every (modules run, layer run) pair.
Writes <out>.csv (one row per run and variant) and <out>.md.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd


def run_rows(runs: Path) -> pd.DataFrame:
    """One row per (run, variant) of graph-replayed steps, with kernels per layer from the profile."""
    rows = []
    for csv in sorted(runs.glob("*/throughput.csv")):
        df = pd.read_csv(csv)
        df = df[df["mode"] == "graph"]
        prof = pd.DataFrame(json.loads((csv.parent / "report.json").read_text()).get("profile") or [])
        # the profile's "total" class: every kernel of the step over the decoder layers
        total = prof[prof["class"] == "total"] if not prof.empty else prof
        per_layer = total.set_index("variant")["kernels_per_layer"] if not total.empty else pd.Series(dtype=float)
        for _, r in df.iterrows():
            rows.append({"run": csv.parent.name, "regions": r.get("regions", "layer"), "batch_size": r["batch_size"],
                         "variant": r["variant"], "ms_per_step": r["ms_per_step"], "ms_min": r["ms_min"],
                         "ms_max": r["ms_max"], "repeats": r["repeats"],
                         "kernels_per_layer": per_layer.get(r["variant"], float("nan"))})
    return pd.DataFrame(rows)


def ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Per (batch, variant): median ms of each kind, and modules / layer over every pair of runs."""
    out = []
    for (bs, variant), g in df.groupby(["batch_size", "variant"]):
        mod, lay = g[g.regions == "modules"], g[g.regions == "layer"]
        if mod.empty or lay.empty:
            continue
        pairs = [m / q for m in mod.ms_per_step for q in lay.ms_per_step]
        out.append({"batch_size": bs, "variant": variant, "runs": f"{len(mod)} + {len(lay)}",
                    "modules_ms": mod.ms_per_step.median(), "layer_ms": lay.ms_per_step.median(),
                    "ratio": float(pd.Series(pairs).median()), "ratio_min": min(pairs), "ratio_max": max(pairs),
                    "modules_kernels_per_layer": mod.kernels_per_layer.median(),
                    "layer_kernels_per_layer": lay.kernels_per_layer.median()})
    return pd.DataFrame(out)


def main(runs: str, out: str) -> None:
    df = run_rows(Path(runs))
    if df.empty:
        raise SystemExit(f"no run folders with throughput.csv under {runs}")
    out_p = Path(out)
    out_p.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out_p.with_suffix(".csv"), index=False)
    text = ["Each run (median of its interleaved passes [min, max], ms per replayed step)\n",
            df.round(4).to_markdown(index=False),
            "\n\nModule regions over layer regions (ratio > 1: the layer regions are faster), over every pair of runs\n",
            ratios(df).round(4).to_markdown(index=False), "\n"]
    out_p.with_suffix(".md").write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main(*sys.argv[1:3])
