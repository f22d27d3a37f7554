"""Where did a change move the decode step? Two eager per-kernel profiles, kernel by kernel.

    python -m analysis.profile_diff A_kernels.csv B_kernels.csv --batch 16 --variant base --out <prefix>

A and B are per-kernel tables as analysis.throughput writes them (<out>_kernels.csv: one row per
(routing, batch size, variant, budget, kernel) with its class, ms a step, launches a step and a layer,
µs a launch), for example those of an a b b a's runs (experiments/gpu/commit_abba.sh). For one cell:
per (class, kernel) both sides' launches a layer, µs a launch and ms a step, and b - a in ms a step;
a kernel on one side only (a launch the change removed or added, or a generated kernel that Inductor
named anew) shows `-` on the other. Rows by |b - a|, largest first, then each class's total and the
step's. These are the profiler's eager launches, not the graph's replay: they say where the time
moved; whether the step moved is the A/B's test (analysis.abba).

A cell is (model, routing, batch size, variant, budget): rows of two models, routings or budgets
are never summed. Refuses (exit 2, naming the choices): a cell not in both tables, a table holding
several cells when --model, --routing, --batch, --variant or --budget is left out, tables of two
models or two decode engines.
Writes <prefix>.csv (the last column `engine`) and <prefix>.md.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.engines import one_engine, with_engine
from analysis.load import fail

KEY = ["class", "kernel"]
COLUMNS = ["model", "batch_size", "variant", "class", "kernel", "ms_per_step", "kernels_per_step", "kernels_per_layer"]


def read(path: Path) -> pd.DataFrame:
    if not path.is_file():
        fail(f"{path}: no such per-kernel table (analysis.throughput writes <out>_kernels.csv)")
    df = pd.read_csv(path)
    missing = [c for c in COLUMNS if c not in df]
    if missing:
        fail(f"{path}: not a per-kernel table (no {', '.join(missing)}; analysis.throughput writes <out>_kernels.csv)")
    return df


# what picks one cell of a table, and the option that names it (routing and budget: tables since those
# columns exist; a table without them holds one of each; a grid's shapes table holds several models)
CELL = {"model": "--model", "routing": "--routing", "batch_size": "--batch", "variant": "--variant", "budget": "--budget"}


def labels(df: pd.DataFrame) -> pd.DataFrame:
    """Each row's cell as the strings its options take (a budget of 16.0 is "16"; dense's none is "-")."""
    out = pd.DataFrame(index=df.index)
    for col in CELL:
        if col == "budget" and col in df:
            out[col] = [("-" if pd.isna(x) else format(float(x), "g")) for x in df[col]]
        elif col == "batch_size":
            out[col] = df[col].astype(int).astype(str)
        else:
            out[col] = df[col].astype(str) if col in df else "-"
    return out


def cell(df: pd.DataFrame, path: Path, want: dict[str, str | None]) -> pd.DataFrame:
    """The rows of one (model, routing, batch size, variant, budget), the only one left by the options given."""
    lab = labels(df)
    cells = sorted(set(map(tuple, lab.to_numpy())), key=str)
    keep = [c for c in cells if all(w is None or c[i] == w for i, w in enumerate(want.values()))]
    if len(keep) != 1:
        listed = ", ".join(" ".join(f"{CELL[k]} {v}" for k, v in zip(CELL, c) if v != "-") for c in cells)
        fail(f"{path}: {'no' if not keep else 'several'} cells match; it holds {listed}")
    return df[(lab.to_numpy() == keep[0]).all(axis=1)]


def diff(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """One row per (class, kernel) of either side, by |b - a| in ms a step, then the totals."""
    side = {}
    for name, df in (("a", a), ("b", b)):
        g = df.groupby(KEY, sort=False)[["kernels_per_layer", "ms_per_step", "kernels_per_step"]].sum()
        g["us_per_launch"] = 1000 * g["ms_per_step"] / g["kernels_per_step"]
        side[name] = g.drop(columns="kernels_per_step").add_prefix(f"{name}_")
    t = side["a"].join(side["b"], how="outer").reset_index()
    t["b_minus_a_ms"] = t["b_ms_per_step"].fillna(0.0) - t["a_ms_per_step"].fillna(0.0)
    t = t.iloc[np.argsort(-t["b_minus_a_ms"].abs().to_numpy(), kind="stable")].reset_index(drop=True)
    totals = []
    for cls, g in t.groupby("class", sort=True):
        totals.append(total(g, cls, "(class total)"))
    totals.append(total(t, "step", "(every kernel)"))
    return pd.concat([t, pd.DataFrame(totals)], ignore_index=True)


def total(g: pd.DataFrame, cls: str, label: str) -> dict:
    row = {"class": cls, "kernel": label}
    for s in ("a", "b"):
        row[f"{s}_kernels_per_layer"] = g[f"{s}_kernels_per_layer"].sum()
        row[f"{s}_ms_per_step"] = g[f"{s}_ms_per_step"].sum()
        row[f"{s}_us_per_launch"] = np.nan
    row["b_minus_a_ms"] = row["b_ms_per_step"] - row["a_ms_per_step"]
    return row


def markdown(t: pd.DataFrame, a_path: Path, b_path: Path, what: str, engine: str, rows: int) -> str:
    def num(x, fmt):
        return "-" if pd.isna(x) else format(x, fmt)

    kernels = t[~t["kernel"].astype(str).str.startswith("(")]
    shown = pd.concat([kernels.head(rows), t[t["kernel"].astype(str).str.startswith("(")]])
    left = len(kernels) - min(rows, len(kernels))
    lines = [(f"{what}: a `{a_path}`, b `{b_path}` (eager profiles; ms a step, launches a layer, µs a launch; the "
             f"{min(rows, len(kernels))} kernels that moved most, by |b - a|"
             f"{f' ({left} more in the .csv)' if left else ''}, then the totals). Decode engine: `{engine}`. Made by "
             f"`python -m analysis.profile_diff` (analysis/profile_diff.py)."), "",
             "| class | kernel | a launches/layer | b launches/layer | a µs/launch | b µs/launch | a ms | b ms | b - a ms |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for _, r in shown.iterrows():
        lines.append(f"| {r['class']} | {str(r['kernel'])[:60]} | {num(r['a_kernels_per_layer'], '.2f')} | "
                     f"{num(r['b_kernels_per_layer'], '.2f')} | {num(r['a_us_per_launch'], '.2f')} | "
                     f"{num(r['b_us_per_launch'], '.2f')} | {num(r['a_ms_per_step'], '.4f')} | "
                     f"{num(r['b_ms_per_step'], '.4f')} | {r['b_minus_a_ms']:+.4f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, help="the baseline's per-kernel table")
    ap.add_argument("b", type=Path, help="the change's per-kernel table")
    ap.add_argument("--model", default=None, help="the model, e.g. olmoe (needed where a table holds several)")
    ap.add_argument("--batch", type=int, default=None, help="the batch size (needed where a table holds several)")
    ap.add_argument("--variant", default=None, help="the variant, e.g. dense or base (needed where several)")
    ap.add_argument("--routing", default=None, help="the routing, e.g. uniform or skewed (needed where several)")
    ap.add_argument("--budget", type=int, default=None, help="the budget M (needed where a variant has several)")
    ap.add_argument("--rows", type=int, default=15, help="kernels in the .md, those that moved most (default 15)")
    ap.add_argument("--out", type=Path, required=True, help="<out>.csv and <out>.md")
    args = ap.parse_args(argv)
    if args.rows < 1:
        fail(f"--rows must be at least 1, got {args.rows}")
    a_all, b_all = read(args.a), read(args.b)
    want = {"model": args.model, "routing": args.routing, "batch_size": None if args.batch is None else str(args.batch),
            "variant": args.variant, "budget": None if args.budget is None else str(args.budget)}
    a, b = cell(a_all, args.a, want), cell(b_all, args.b, want)
    a_cell, b_cell = (tuple(labels(x).iloc[0]) for x in (a, b))
    if a_cell[0] != b_cell[0]:
        fail(f"the tables profile different models: {[a_cell[0], b_cell[0]]} (--model names one both hold)")
    if a_cell != b_cell:
        fail(f"the tables' cells differ: a {' '.join(a_cell[1:])}, b {' '.join(b_cell[1:])} (routing, batch, "
             f"variant, budget); name one with --routing, --batch, --variant and --budget")
    engine = one_engine(pd.concat([a, b]), "this profile comparison")
    t = with_engine(diff(a, b), engine)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    t.to_csv(args.out.with_suffix(".csv"), index=False)
    model, routing, batch, variant, budget = a_cell
    what = f"{model}, {'' if routing == '-' else routing + ' routing, '}batch {batch}, {variant}" + \
        ("" if budget == "-" else f" M={budget}")
    text = markdown(t, args.a, args.b, what, engine, args.rows)
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
