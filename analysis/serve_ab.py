"""Did a scheduler setting move serving? Serve runs of two settings, interleaved, against each other.

    python -m analysis.serve_ab results/serve/grid_2026-12-06c/runs/* --out results/serve/grid_2026-12-06c/ab

Each RUN is a finished run folder of `throughput.mode=serve` named <i>_<label> (i: its place in
the order the runs were made, e.g. 1_default 2_finer 3_default ...; two labels in all, the first
run's label is the baseline). Per cell (variant, budget, rate), for each label over every stream of
its runs (a stream: one repeat of one run): the median [min, max] of output tokens/s, the stream's
prefill time, TTFT p50 and the in-stream decode step; the other label's median over the baseline's
less 1; and an exact two-sided Mann-Whitney test of tokens/s between the labels' streams, Holm over
the cells (one family). A stream is the unit: streams of one run share its process and warm-up,
so the runs' order (interleaved or not) is in the table's caption, and a call needs the runs of each
label to alternate. Writes <out>.csv and <out>.md; the .csv's last column, `engine`, is the decode
engine of every run (runs of two engines are refused, exit 2).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import mannwhitneyu

from analysis.engines import engine_of, one_engine, with_engine
from analysis.load import _config, fail, finished, read_report
from analysis.stats import ALPHA, holm

CELL = ["variant", "budget", "rate"]
MEASURES = {"output_throughput": "tok_s", "prefill_s": "prefill_s", "ttft_ms_p50": "ttft_p50",
            "step_ms_median": "step_ms"}


def load(runs: list[Path]) -> pd.DataFrame:
    """Every stream of the runs, with its run's order, label and decode engine."""
    frames, places = [], {}
    for run in runs:
        order, label = place_of(run, places, "a run folder of the A/B", "1_default, 2_finer")
        if not finished(run, "serve.csv"):
            fail(f"{run} is not a finished run of throughput.mode=serve (no serve.csv, or no report.json: a killed "
                 "or unfinished run)")
        df = pd.read_csv(run / "serve.csv")
        frames.append(df.assign(run=order, label=label,
                                engine=engine_of(read_report(run / "report.json"), _config(run))))
    df = pd.concat(frames, ignore_index=True)
    two_labels_one_model(df, "serve")
    return df.assign(rate=df["rate"].astype(float))


def place_of(run: Path, places: dict[int, Path], what: str, example: str) -> tuple[int, str]:
    """(i, label) of a folder named <i>_<label>, recorded in `places`; exit 2 on another name or a place
    taken twice. `what` and `example` name such a folder in the message."""
    order, _, label = run.name.partition("_")
    if not (order.isdigit() and label):
        fail(f"{run}: {what} is named <i>_<label> (e.g. {example})")
    if int(order) in places:
        fail(f"{run} and {places[int(order)]} share one place in the order ({order})")
    places[int(order)] = run
    return int(order), label


def two_labels_one_model(df: pd.DataFrame, verb: str) -> None:
    """Exit 2 unless the runs have exactly two labels and one model (`verb`: what the runs do to it)."""
    labels = labels_of(df)
    if len(labels) != 2:
        fail(f"an A/B needs runs of exactly two labels; these have {labels}")
    if df["model"].nunique() > 1:
        fail(f"the runs {verb} different models: {sorted(df['model'].unique())}")


def labels_of(df: pd.DataFrame) -> list[str]:
    """The labels in the order their first runs were made: the baseline (a) first."""
    return list(dict.fromkeys(df.sort_values("run")["label"]))


def order_of(df: pd.DataFrame) -> str:
    """The runs' order as letters, the baseline a: 'a b a b a b'."""
    first = labels_of(df)[0]
    return " ".join("a" if label == first else "b" for label in df.drop_duplicates("run").sort_values("run")["label"])


def compare(df: pd.DataFrame) -> pd.DataFrame:
    engine = one_engine(df, "the A/B of these serve runs")
    a, b = labels_of(df)
    rows = []
    for key, cell in df.groupby(CELL, dropna=False, sort=True):
        row = dict(zip(CELL, key))
        for label in (a, b):
            part = cell[cell["label"] == label]
            row[f"{label}_streams"] = len(part)
            for col, name in MEASURES.items():
                v = part[col].dropna()
                row[f"{label}_{name}"] = v.median() if len(v) else np.nan
                row[f"{label}_{name}_min"] = v.min() if len(v) else np.nan
                row[f"{label}_{name}_max"] = v.max() if len(v) else np.nan
        for name in MEASURES.values():
            row[f"{b}_over_{a}_{name}"] = row[f"{b}_{name}"] / row[f"{a}_{name}"] - 1
        xa, xb = (cell.loc[cell["label"] == lab, "output_throughput"].to_numpy(float) for lab in (a, b))
        row["p_tok_s"] = mannwhitneyu(xb, xa, alternative="two-sided", method="exact").pvalue \
            if len(xa) and len(xb) else np.nan
        rows.append(row)
    t = pd.DataFrame(rows)
    tested = t["p_tok_s"].notna().to_numpy()
    t["p_tok_s_holm"] = np.nan
    t.loc[tested, "p_tok_s_holm"] = holm(t.loc[tested, "p_tok_s"].to_numpy(float))
    t["call_tok_s"] = [(f"{b} higher" if d > 0 else f"{a} higher") if p < ALPHA else "inconclusive"
                       for d, p in zip(t[f"{b}_over_{a}_tok_s"], t["p_tok_s_holm"].fillna(1.0))]
    return with_engine(t, engine)


def markdown(t: pd.DataFrame, df: pd.DataFrame) -> str:
    a, b = labels_of(df)

    def cell(row, label, name, fmt):
        return (f"{row[f'{label}_{name}']:{fmt}} [{row[f'{label}_{name}_min']:{fmt}}, "
                f"{row[f'{label}_{name}_max']:{fmt}}]")

    lines = [(f"Runs in the order {order_of(df)} (a: `{a}`, b: `{b}`); per label, the median [min, max] over "
             f"its streams (repeats of its runs); `b over a`: the medians' ratio less 1; p: exact two-sided "
             f"Mann-Whitney of tokens/s over the streams, Holm over the {len(t)} cells. Engine: "
             f"`{t['engine'].iloc[0]}`. Made by `python -m analysis.serve_ab` (analysis/serve_ab.py)."), "",
             "| variant | budget | rate | measure | a | b | b over a | streams a / b | p (Holm) | call |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    formats = {"tok_s": ",.0f", "prefill_s": ".3f", "ttft_p50": ",.0f", "step_ms": ".2f"}
    for _, row in t.iterrows():
        budget = "-" if pd.isna(row["budget"]) else f"{int(row['budget'])}"
        rate = "burst" if pd.isna(row["rate"]) else f"{row['rate']:g}/s"
        for i, (name, fmt) in enumerate(formats.items()):
            tested = i == 0
            lines.append(f"| {row['variant']} | {budget} | {rate} | {name} | {cell(row, a, name, fmt)} | "
                         f"{cell(row, b, name, fmt)} | {100 * row[f'{b}_over_{a}_{name}']:+.1f} % | "
                         f"{row[f'{a}_streams']} / {row[f'{b}_streams']} | "
                         f"{row['p_tok_s_holm']:.4f} | {row['call_tok_s']} |" if tested else
                         f"| | | | {name} | {cell(row, a, name, fmt)} | {cell(row, b, name, fmt)} | "
                         f"{100 * row[f'{b}_over_{a}_{name}']:+.1f} % | | | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders named <i>_<label>")
    ap.add_argument("--out", type=Path, required=True, help="<out>.csv and <out>.md")
    args = ap.parse_args(argv)
    for run in args.runs:
        if not run.is_dir():
            fail(f"{run}: no such run folder")
    df = load(args.runs)
    table = compare(df)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out.with_suffix(".csv"), index=False)
    text = markdown(table, df)
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
