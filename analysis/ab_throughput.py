"""Did a change move decode speed? Throughput runs of two checkouts, against each other and the committed grid.

    python -m analysis.ab_throughput RUN_DIR... --reference results/throughput/runs/<run> --out results/refactor_guard/h200

Each RUN_DIR is a run folder of `experiments/gpu/ab_throughput.sh` named <i>_<label> (label `old`
or `new`), holding throughput.csv (or, where only the report came back, report.json, whose
`throughput` rows are the same table). Per grid cell (batch size, variant, budget; graph replays):
the reference's ms per step, every run's, the median and range per label, and new against old
and against the reference as a relative change. Writes <out>.csv and <out>.md; the .csv's last
column, `engine`, is the decode engine of every run compared (analysis/engines.py: runs and reference
of two engines are refused, exit 2).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from analysis.engines import one_engine, run_engine, with_engine
from analysis.throughput import expert_bandwidth

KEYS = ["batch_size", "variant", "budget"]


def timed(df: pd.DataFrame) -> pd.DataFrame:
    """The timed rows: graph replays (on a CPU, where there are none, the eager steps)."""
    mode = "graph" if (df["mode"] == "graph").any() else "eager"
    return df[df["mode"] == mode].copy()


def load(run: Path) -> pd.DataFrame:
    csv, report = run / "throughput.csv", run / "report.json"
    rep = json.loads(report.read_text()) if report.is_file() else {}
    df = timed(pd.read_csv(csv) if csv.is_file() else pd.DataFrame(rep["throughput"]))
    order, label = run.name.split("_", 1)
    df = df.assign(run=int(order), label=label, engine=run_engine(run)).merge(
        expert_of_copy(rep), on=KEYS, how="left")
    return df[[*KEYS, "run", "label", "ms_per_step", "tokens_per_s", "expert_of_copy", "engine"]]


def expert_of_copy(rep: dict) -> pd.DataFrame:
    """The expert FFN's weight bytes per profiled step over copy bandwidth, by cell, where the run
    (its report.json) profiled and recorded copy bandwidth (a kernel change's A/B shows whether it
    moved the stream)."""
    if not (rep.get("profile") and rep.get("expert_bytes") and rep.get("copy_gbps")):
        return pd.DataFrame(columns=[*KEYS, "expert_of_copy"])
    prof = expert_bandwidth(pd.DataFrame(rep["profile"]), rep)
    return prof[prof["class"] == "expert FFN"][[*KEYS, "expert_of_copy"]]


def compare(runs: list[Path], reference: Path) -> pd.DataFrame:
    df = pd.concat([load(r) for r in runs])
    engine = one_engine(pd.concat([df[["engine"]], pd.DataFrame({"engine": [run_engine(reference)]})]),
                        "the A/B of these runs and the reference")
    ref = timed(pd.read_csv(reference / "throughput.csv")).set_index(KEYS)["ms_per_step"]
    rows = []
    for key, cell in df.groupby(KEYS, dropna=False):
        row = dict(zip(KEYS, key))
        row["reference_ms"] = ref.get(key)
        for label, part in cell.groupby("label"):
            ms = part.sort_values("run")["ms_per_step"]
            row[f"{label}_ms"] = " ".join(f"{m:.3f}" for m in ms)
            row[f"{label}_median"] = ms.median()
            row[f"{label}_spread"] = ms.max() - ms.min()
            if part["expert_of_copy"].notna().any():
                row[f"{label}_expert_of_copy"] = part["expert_of_copy"].median()
        if "new_median" in row and "old_median" in row:
            row["new_vs_old"] = row["new_median"] / row["old_median"] - 1
        if row["reference_ms"] is not None and "new_median" in row:
            row["new_vs_reference"] = row["new_median"] / row["reference_ms"] - 1
        rows.append(row)
    table = pd.DataFrame(rows).sort_values(["batch_size", "variant", "budget"]).reset_index(drop=True)
    return with_engine(table, engine)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--reference", type=Path,
                    default=Path("results/throughput/runs/model.routing=uniform,model=qwen3_30b"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    table = compare(args.runs, args.reference)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out.with_suffix(".csv"), index=False)
    shown = table.copy()
    for col in [c for c in shown.columns if c.startswith(("new_vs", ))]:
        shown[col] = shown[col].map(lambda v: f"{100 * v:+.1f} %" if pd.notna(v) else "")
    text = (f"ms per step (graph replays, median of the timed steps of each run); runs: "
            f"{', '.join(r.name for r in args.runs)}; reference: {args.reference}\n\n"
            + shown.round(3).to_markdown(index=False) + "\n")
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
