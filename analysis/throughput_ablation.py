"""A throughput ablation across runs: each run's replayed step per variant and its kernels per
decoder layer, and the step without a feature against the step with it.

    python -m analysis.throughput_ablation <runs> <out> [regions|combo|pdl|compile]
    regions   throughput.regions: modules (off) against layer (on); the default
    combo     throughput.regions: layer (off) against layer_combo (on; since 2026-12-05 with the
              skinny projections where the GPU's tuned table names them)
    pdl       throughput.pdl: false (off) against true (on; each row records whether its launches
              used programmatic dependent launch); the switch was deleted on 2026-12-05 when it lost
              these A/Bs, and this reads its committed runs
    compile   throughput.compile: false (the eager step's graph) against true (the compiled layer
              halves; each graph row records it as `compiled`)
(throughput.regions was deleted too, when `layer` and `modules` had lost these A/Bs to
`layer_combo`: regions and combo read the committed runs, results/roofline/grid_2026-12-02{e,f}.)

Reads run folders (outputs/ or results/ only). The runs are separate processes on one machine,
so the comparison pairs runs, not interleaved passes: `ratio` is a variant's ms without the
feature over its ms with it (> 1: the feature is faster), the median and the range over every
(off run, on run) pair. Writes <out>.csv (one row per run and variant, with the decode engine of its
run, `engine`: analysis/engines.py) and <out>.md; runs of two engines are not paired (exit 2).
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis.engines import one_engine, run_engine
from analysis.load import command_line

# each ablation's column of throughput.csv (a throughput.* setting), and its (off, on) values
ABLATIONS = {"regions": ("regions", "modules", "layer"), "combo": ("regions", "layer", "layer_combo"),
             "pdl": ("pdl", False, True), "compile": ("compiled", False, True)}


def run_rows(runs: Path, by: str = "regions") -> pd.DataFrame:
    """One row per (run, variant) of graph-replayed steps, with kernels per layer from the profile;
    `setting`: the run's value of the ablation's column."""
    rows = []
    for csv in sorted(runs.rglob("throughput.csv")):  # runs/<run>/ or runs/<run>/throughput/<hydra folder>/
        df = pd.read_csv(csv)
        df = df[df["mode"] == "graph"]
        prof = pd.DataFrame(json.loads((csv.parent / "report.json").read_text()).get("profile") or [])
        # the profile's "total" class: every kernel of the step over the decoder layers
        total = prof[prof["class"] == "total"] if not prof.empty else prof
        per_layer = total.set_index("variant")["kernels_per_layer"] if not total.empty else pd.Series(dtype=float)
        column, _, on_value = ABLATIONS[by]
        engine = run_engine(csv.parent)
        if column not in df:  # a run made after the option was deleted ran the default form only
            raise SystemExit(f"error: {csv.parent} records no throughput.{column} (made after the option was deleted, "
                             f"or before it existed): it cannot be a side of the {by} ablation")
        for _, r in df.iterrows():
            setting = r[column]
            rows.append({"run": csv.parent.relative_to(runs).parts[0], "setting": setting,
                         "batch_size": r["batch_size"], "variant": r["variant"], "ms_per_step": r["ms_per_step"],
                         "ms_min": r["ms_min"], "ms_max": r["ms_max"], "repeats": r["repeats"],
                         "kernels_per_layer": per_layer.get(r["variant"], float("nan")), "engine": engine})
    return pd.DataFrame(rows)


def ratios(df: pd.DataFrame, by: str = "regions") -> pd.DataFrame:
    """Per (batch, variant): median ms off and on, and off / on over every pair of runs."""
    _, off_value, on_value = ABLATIONS[by]
    out = []
    for (bs, variant), g in df.groupby(["batch_size", "variant"]):
        setting = g["setting"].astype(str)
        off, on = g[setting == str(off_value)], g[setting == str(on_value)]
        if off.empty or on.empty:
            continue
        pairs = [a / b for a in off.ms_per_step for b in on.ms_per_step]
        out.append({"batch_size": bs, "variant": variant, "runs": f"{len(off)} + {len(on)}",
                    f"{off_value}_ms": off.ms_per_step.median(), f"{on_value}_ms": on.ms_per_step.median(),
                    "ratio": float(pd.Series(pairs).median()), "ratio_min": min(pairs), "ratio_max": max(pairs),
                    f"{off_value}_kernels_per_layer": off.kernels_per_layer.median(),
                    f"{on_value}_kernels_per_layer": on.kernels_per_layer.median()})
    return pd.DataFrame(out)


def main(runs: str, out: str, by: str = "regions") -> None:
    if by not in ABLATIONS:
        raise SystemExit(f"error: unknown ablation {by!r}; choose one of: {', '.join(ABLATIONS)}")
    df = run_rows(Path(runs), by)
    if df.empty:
        raise SystemExit(f"error: no run folders with throughput.csv under {runs}")
    engine = one_engine(df, f"the {by} ablation of {runs}")  # its ratios pair runs
    out_p = Path(out)
    out_p.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out_p.with_suffix(".csv"), index=False)
    column, off_value, on_value = ABLATIONS[by]
    text = ["Each run (median of its interleaved passes [min, max], ms per replayed step; `setting`: "
            f"throughput.{column}; decode engine `{engine}`, analysis/engines.py)\n", df.round(4).to_markdown(index=False),
            f"\n\n{by}: {off_value} over {on_value} (ratio > 1: {on_value} is faster), over every pair of runs\n",
            ratios(df, by).round(4).to_markdown(index=False), "\n"]
    out_p.with_suffix(".md").write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main(*command_line(__doc__, 2, 3))
