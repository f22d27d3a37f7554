"""Where a decode step's time would go with the built launch cuts, the expert FFN at its floor and
router + selection at target: readings from a grid's committed kernel profile.

    python -m analysis.step_budget results/roofline/grid_2026-12-02f/final [--variant base --batch 16]

Reads the grid's summary_profile.csv (per class; the "total" row's graph replay and kernel time)
and summary_kernels.csv (per kernel name). Prints, for the variant at the batch size and uniform
routing: the time between kernels in the replay per kernel ((graph - kernel time) / kernels); the
per-step time of each kernel a built cut removes (CUTS: matched by name) and their sum with one gap
each; the expert FFN's gate_up + down against their bytes at `--tbps` (the kept experts' weights,
every layer); router + selection against `--target-ms`; and the step with all three taken off.
The removed kernels are identified by name in an eager profile: what the cuts could save at most,
before what the fused kernels add. Readings, not measurements.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

# the kernels the built cuts remove, by a part of their profiled name (Qwen3-30B-A3B, layer_combo)
CUTS = {
    "output projection's split-K reduce (skinny)": "splitKreduce",
    "experts' reduce (reduce_in_down)": "_reduce_kernel",
}


def budget(grid: Path, variant: str, batch: int, tbps: float, layers: int, experts: float, H: int, I: int,
           target_ms: float) -> list[tuple[str, float]]:
    """(what, ms per step) rows; see the module doc."""
    prof = pd.read_csv(grid / "summary_profile.csv")
    kern = pd.read_csv(grid / "summary_kernels.csv")
    pick = lambda df: df[(df["routing"] == "uniform") & (df["batch_size"] == batch) & (df["variant"] == variant)]
    total = pick(prof)[pick(prof)["class"] == "total"]
    if total.empty:
        raise SystemExit(f"error: {grid}: no uniform-routing profile of {variant} at batch {batch}")
    total = total.iloc[0]
    gap_ms = (total["graph_ms_per_step"] - total["ms_per_step"]) / total["kernels_per_step"]
    k = pick(kern)
    k = k[k["class"] != "norms"]  # the final norm (once a step) shares the input norm's kernel name
    rows = [("graph replay", total["graph_ms_per_step"]), ("kernel time", total["ms_per_step"]),
            ("between kernels, per kernel", gap_ms)]
    cut = gaps = 0.0
    for what, name in CUTS.items():
        part = k[k["kernel"].str.contains(name, regex=False)]
        ms = float(part["ms_per_step"].sum())
        cut, gaps = cut + ms, gaps + gap_ms * float(part["kernels_per_step"].sum())
        rows.append((what, ms))
    rows += [("the cuts' kernels", cut), ("the cuts, with their gaps", cut + gaps)]
    cut += gaps
    ffn = float(k[k["kernel"].isin(["_gate_up_kernel", "_down_kernel"])]["ms_per_step"].sum())
    floor = layers * experts * 3 * H * I * 2 / (tbps * 1e12) * 1e3
    rows += [("expert gate_up + down", ffn), (f"their floor at {tbps} TB/s", floor)]
    select = float(k[k["class"] == "router/selection"]["ms_per_step"].sum())
    rows += [("router + selection", select), ("router + selection target", target_ms)]
    rows.append(("the step with all three", total["graph_ms_per_step"] - cut - (ffn - floor) - (select - target_ms)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("grid", type=Path)
    ap.add_argument("--variant", default="base")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tbps", type=float, default=4.2, help="the floor's bandwidth (issue 25: 4.2 TB/s)")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--experts", type=float, default=16,
                    help="kept experts per layer (base M=16; for dense its mean union, summary.md's `dense union`)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--target-ms", type=float, default=0.3, help="router + selection target per step")
    args = ap.parse_args()
    for what, ms in budget(args.grid, args.variant, args.batch, args.tbps, args.layers, args.experts, args.hidden,
                           args.intermediate, args.target_ms):
        print(f"{what:48} {ms:8.4f} ms" if "per kernel" not in what else f"{what:48} {1e3 * ms:8.3f} µs")


if __name__ == "__main__":
    main()
