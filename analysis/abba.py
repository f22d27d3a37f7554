"""Did a change move the decode step? Throughput runs of two commits, in the order a b b a, against each other.

    python -m analysis.abba results/roofline/grid_2026-12-06d/runs/* --out results/roofline/grid_2026-12-06d/abba

Each RUN is a folder of experiments/gpu/commit_abba.sh named <i>_<label> (1_a 2_b 3_b 4_a: i its place in
the order the runs were made, the first run's label the baseline) holding one finished throughput run
(throughput.csv and report.json, in a subfolder of any depth), or one run stopped at its limit: its
staging folder's throughput_rows.jsonl, the cells it finished (base/run/run_folder.py; such a run has
no report.json, so its GPU and engine are not recorded: the caption names it). Per cell (batch size, variant,
budget; graph replays), for each label over every timed round of its runs (`ms_runs`: the run's
interleaved passes): the median [min, max] ms per step; b's median over a's less 1; and an exact
two-sided Mann-Whitney test between the labels' rounds, Holm over the cells (one family). A round
is the unit: rounds of one run share its process, its compilation and its warm-up, so the runs'
order is in the table's caption, and each label needs at least two runs, alternating with the
other's. Writes <out>.csv and <out>.md; the .csv's last column, `engine`, is the decode engine of
every run (runs of two engines are refused, exit 2: analysis/engines.py).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.stats import mannwhitneyu

from analysis.ab_throughput import timed
from analysis.engines import one_engine, run_engine, with_engine
from analysis.load import fail, read_jsonl, read_report
from analysis.serve_ab import labels_of, order_of, place_of, two_labels_one_model
from analysis.stats import ALPHA, holm

CELL = ["batch_size", "variant", "budget"]


def run_folder(side: Path) -> tuple[Path, bool]:
    """The one throughput run inside a side's folder, and whether it finished: a finished run
    (throughput.csv and report.json), else one stopped at its limit (.<name>.partial-<pid>/ with the
    cells it finished in throughput_rows.jsonl)."""
    found = sorted(p.parent for p in side.rglob("throughput.csv") if (p.parent / "report.json").is_file())
    stopped = sorted(p.parent for p in side.rglob("throughput_rows.jsonl") if ".partial-" in p.parent.name)
    if len(found) == 1:
        return found[0], True
    if not found and len(stopped) == 1:
        return stopped[0], False
    fail(f"{side}: holds {len(found)} finished throughput runs (throughput.csv and report.json) and {len(stopped)} "
         f"stopped ones with finished cells (.<name>.partial-<pid>/throughput_rows.jsonl); an A/B side holds exactly "
         f"one")


def read_run(run: Path, finished: bool) -> pd.DataFrame:
    """A run's timed rows with its model, GPU and engine (the latter two unrecorded for a stopped run)."""
    if finished:
        rep = read_report(run / "report.json")
        return timed(pd.read_csv(run / "throughput.csv")).assign(
            model=rep.get("model"), gpu=rep.get("gpu", rep.get("device")), engine=run_engine(run))
    rows = read_jsonl(run / "throughput_rows.jsonl")  # a damaged line: an error naming the file
    if rows.empty:
        fail(f"{run}: a stopped run with no finished cell")
    config = yaml.safe_load((run / "config.yaml").read_text()) if (run / "config.yaml").is_file() else {}
    return timed(rows).assign(model=((config or {}).get("model") or {}).get("name"), gpu=np.nan, engine=np.nan)


def load(sides: list[Path]) -> pd.DataFrame:
    """Every timed round of the runs, with its run's order, label and decode engine."""
    frames, places = [], {}
    for side in sides:
        order, label = place_of(side, places, "a side of the A/B", "1_a, 2_b")
        run, finished = run_folder(side)
        df = read_run(run, finished)
        rounds = df.assign(ms=df["ms_runs"].astype(str).str.split(";")).explode("ms")
        frames.append(rounds.assign(ms=rounds["ms"].astype(float), run=order, label=label, finished=finished,
                                    side=side.name))
    df = pd.concat(frames, ignore_index=True)
    two_labels_one_model(df, "time")
    runs = df.drop_duplicates("run").groupby("label")["run"].count()
    if (runs < 2).any():
        fail(f"each label needs at least two runs (a b b a), got {dict(runs)}")
    return df


def compare(df: pd.DataFrame) -> pd.DataFrame:
    engine = one_engine(df, "the A/B of these throughput runs")
    a, b = labels_of(df)
    rows = []
    for key, cell in df.groupby(CELL, dropna=False, sort=True):
        row = dict(zip(CELL, key, strict=True))
        xs = {label: cell.loc[cell["label"] == label, "ms"].to_numpy(float) for label in (a, b)}
        for label, x in xs.items():
            row[f"{label}_rounds"] = len(x)
            row[f"{label}_ms"], row[f"{label}_ms_min"], row[f"{label}_ms_max"] = (
                (np.median(x), x.min(), x.max()) if len(x) else (np.nan,) * 3)
        row[f"{b}_over_{a}"] = row[f"{b}_ms"] / row[f"{a}_ms"] - 1
        row["p"] = (mannwhitneyu(xs[b], xs[a], alternative="two-sided", method="exact").pvalue
                    if len(xs[a]) and len(xs[b]) else np.nan)
        rows.append(row)
    t = pd.DataFrame(rows)
    tested = t["p"].notna().to_numpy()
    t["p_holm"] = np.nan
    t.loc[tested, "p_holm"] = holm(t.loc[tested, "p"].to_numpy(float))
    t["call"] = ["one side only" if np.isnan(p) else (f"{b} faster" if d < 0 else f"{a} faster") if p < ALPHA
                 else "inconclusive" for d, p in zip(t[f"{b}_over_{a}"], t["p_holm"], strict=True)]
    return with_engine(t, engine)


def markdown(t: pd.DataFrame, df: pd.DataFrame) -> str:
    a, b = labels_of(df)

    def cell(row, label):
        if not row[f"{label}_rounds"]:
            return "-"
        return f"{row[f'{label}_ms']:.3f} [{row[f'{label}_ms_min']:.3f}, {row[f'{label}_ms_max']:.3f}]"

    def num(x, fmt):
        return "-" if pd.isna(x) else format(x, fmt)

    stopped = sorted(df.loc[~df["finished"].astype(bool), "side"].unique())
    note = (f" Stopped at their limit: {', '.join(stopped)} (the cells they finished; GPU and engine not recorded "
            f"for them)." if stopped else "")

    lines = [(f"Runs in the order {order_of(df)} (a: `{a}`, b: `{b}`); per label, ms per replayed step, the median [min, max] over the "
              f"timed rounds of its runs; `b over a`: the medians' ratio less 1; p: exact two-sided Mann-Whitney "
              f"over the rounds (rounds of one run share its process), Holm over the {int(t['p'].notna().sum())} "
              f"cells with rounds of both sides.{note} GPU: {', '.join(sorted(df['gpu'].dropna().unique()))}. "
              f"Engine: `{t['engine'].iloc[0]}`. Made by `python -m analysis.abba` (analysis/abba.py)."), "",
             "| batch | variant | budget | a | b | b over a | rounds a / b | p (Holm) | call |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for _, row in t.iterrows():
        budget = "-" if pd.isna(row["budget"]) else f"{int(row['budget'])}"
        lines.append(f"| {int(row['batch_size'])} | {row['variant']} | {budget} | {cell(row, a)} | {cell(row, b)} | "
                     f"{num(100 * row[f'{b}_over_{a}'], '+.2f')} % | {row[f'{a}_rounds']} / {row[f'{b}_rounds']} | "
                     f"{num(row['p_holm'], '.2g')} | {row['call']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="the sides' folders, named <i>_<label>")
    ap.add_argument("--out", type=Path, required=True, help="<out>.csv and <out>.md")
    args = ap.parse_args(argv)
    sides = [r for r in args.runs if r.is_dir()]  # the sides' logs (<i>_<label>.log) sit beside them
    if not sides:
        fail(f"no side folders among {[str(r) for r in args.runs]}")
    df = load(sides)
    table = compare(df)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out.with_suffix(".csv"), index=False)
    text = markdown(table, df)
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
