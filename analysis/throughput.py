"""End-to-end throughput tables from the runs of an experiment folder (reads outputs/ only).

    python -m analysis.throughput outputs/throughput results/throughput

Writes <out>.csv (every row of every run, with model and routing) and <out>.md: per model, routing
and batch size, dense tokens/s and the speed-up of each method over it (same process), and where
the step's time goes (non-expert ms, MoE share; by kernel class and, from each run's
profile_kernels.csv, by kernel: <out>_kernels.csv, its largest in the .md), and the expert FFN's
weight bytes against copy bandwidth, with a warning for a run far below it (a slow kernel, whose
speed-ups do not measure the selection). Every table ends in the
column `engine`, the decode engine of the runs (analysis/engines.py); a folder of two is refused (exit 2),
as is one where two run folders time the same cell (a rerun beside its first run, or the same cell
under two kernel tables): put each in its own folder (analysis.targets takes their median instead).
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pandas as pd

from analysis.engines import one_engine, run_engine, with_engine
from analysis.load import one_run_per_cell


def profile_rows(exp_dir: Path) -> pd.DataFrame:
    """Every profile row of every run (long form: one row per variant and kernel class, with ms and
    kernels per step and per decoder layer). The expert FFN's rows of a run that recorded its
    expert size (report.json's expert_bytes) also carry the bytes its kept experts' weights take
    per step (MoE layers x kept x expert bytes: each read once), the TB/s that makes in the
    profiled kernel time, and (copy_gbps recorded, CUDA runs) that as a share of copy bandwidth."""
    frames = []
    for report in sorted(exp_dir.glob("*/report.json")):
        rep = json.loads(report.read_text())
        if rep.get("profile"):
            df = pd.DataFrame(rep["profile"])
            df.insert(0, "routing", rep.get("routing", "uniform"))
            df.insert(0, "model", rep["model"])
            if rep.get("expert_bytes"):
                df = expert_bandwidth(df, rep)
            frames.append(with_engine(df, run_engine(report.parent)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def expert_bandwidth(df: pd.DataFrame, rep: dict) -> pd.DataFrame:
    """A run's profile rows with the expert FFN's weight bytes per step, TB/s, and share of copy."""
    def budget(x) -> float | None:
        return None if x is None or pd.isna(x) else float(x)

    kept = {(r["batch_size"], r["variant"], budget(r.get("budget"))): r["kept_mean"] for r in rep.get("throughput", [])
            if r.get("kept_mean") is not None}  # the eager reference row (GPU runs) copies its graph row's
    ffn = df["class"] == "expert FFN"
    gb = [rep["moe_layers"] * kept.get((b, v, budget(m)), float("nan")) * rep["expert_bytes"] / 1e9 if f
          else float("nan") for b, v, m, f in zip(df["batch_size"], df["variant"], df["budget"], ffn)]
    df = df.assign(expert_gb_per_step=gb)
    df["expert_tb_per_s"] = df["expert_gb_per_step"] / df["ms_per_step"]
    if rep.get("copy_gbps"):
        df["expert_of_copy"] = 1e3 * df["expert_tb_per_s"] / rep["copy_gbps"]
    return df


# Below this share of copy bandwidth an expert FFN is a kernel problem, not a property of the
# method: on an H100 the Triton expert kernels streamed at 0.77-0.98 of copy on three model shapes
# (Qwen3-30B-A3B, OLMoE, DeepSeek-V2-Lite), and gpt-oss's, with its interleaved gate_up loaded two
# elements apart, at 0.17-0.18 (results/roofline/grid_2026-12-05c/throughput_*.md; 0.91 once it
# loaded one contiguous tile: grid_2026-12-05d/ab_gptoss)
SLOW_EXPERTS_OF_COPY = 0.5


def expert_bandwidth_table(rows: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """From `profile_rows`: the expert FFN's weight bytes per step, their TB/s in the profiled kernel
    time and the share of copy bandwidth (CUDA runs), per run and variant; and a warning for each
    row under SLOW_EXPERTS_OF_COPY, whose speed-ups then measure the expert kernel rather than the
    selection."""
    if rows.empty or "expert_of_copy" not in rows:
        return pd.DataFrame(), []
    ffn = rows[rows["class"] == "expert FFN"]
    cols = ["model", "routing", "batch_size", "variant", "budget", "ms_per_step", "expert_gb_per_step",
            "expert_tb_per_s", "expert_of_copy"]
    table = ffn[cols].round(3)
    warnings = [f"**The expert FFN of `{r.model}` ({r.routing}, batch {r.batch_size}, {r.variant}) streams at "
                f"{r.expert_of_copy:.2f} of copy bandwidth**: under {SLOW_EXPERTS_OF_COPY}, its step times and "
                f"speed-ups measure a slow expert kernel, not the selection."
                for r in table.itertuples() if r.expert_of_copy < SLOW_EXPERTS_OF_COPY]
    return table, warnings


CLASSES = ("attention + norms", "attention", "norms", "router/selection", "expert FFN", "shared experts", "dense MLP", "LM head",
           "embedding", "other", "unlinked", "total")


def collect_profiles(df: pd.DataFrame, values: str = "ms_per_step") -> pd.DataFrame:
    """From `profile_rows`: ms (or, values="kernels_per_layer", kernels per decoder layer) per step
    by kernel class (eager steps, kernel time only), one column per class."""
    if df.empty or values not in df:
        return pd.DataFrame()
    wide = df.pivot_table(index=["model", "routing", "batch_size", "variant", "graph_ms_per_step"],
                          columns="class", values=values).round(2)
    return wide[[c for c in CLASSES if c in wide.columns]].reset_index()


def kernel_rows(exp_dir: Path) -> pd.DataFrame:
    """Every kernel of every profiled step (each run's profile_kernels.csv), with its time per
    launch: us_per_launch = ms per step / launches per step (launches of one name share a time)."""
    frames = []
    for report in sorted(exp_dir.glob("*/report.json")):
        csv = report.parent / "profile_kernels.csv"
        if not csv.exists():
            continue
        rep = json.loads(report.read_text())
        df = pd.read_csv(csv)
        df.insert(0, "routing", rep.get("routing", "uniform"))
        df.insert(0, "model", rep["model"])
        frames.append(df.assign(engine=run_engine(report.parent)))
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    df["us_per_launch"] = 1e3 * df["ms_per_step"] / df["kernels_per_step"]
    return with_engine(df, df["engine"])


def top_kernels(df: pd.DataFrame, variants: tuple[str, ...] = ("dense", "base"), n: int = 12) -> pd.DataFrame:
    """The `n` kernels with the most time per step of each (model, routing, batch, variant) among
    `variants`: ms per step, launches per layer, µs per launch."""
    if df.empty:
        return df
    keep = df[df["variant"].isin(variants)]
    keep = keep.sort_values("ms_per_step", ascending=False).groupby(
        ["model", "routing", "batch_size", "variant"], sort=True).head(n)
    cols = ["model", "routing", "batch_size", "variant", "class", "kernel", "ms_per_step", "kernels_per_layer",
            "us_per_launch"]
    out = keep.sort_values(["model", "routing", "batch_size", "variant", "ms_per_step"],
                           ascending=[True, True, True, True, False])[cols]
    return out.assign(kernel=out["kernel"].str.slice(0, 60)).round(3)


def collect(exp_dir: Path, one_run_per_cell: bool = True) -> pd.DataFrame:
    """Every graph- and eager-timed row of the runs under `exp_dir`, with model, routing, GPU and
    engine. one_run_per_cell: refuse two run folders timing one cell (this module's tables set one
    run's rows side by side); analysis.targets takes the median over such runs instead."""
    frames = []
    for report in sorted(exp_dir.glob("*/report.json")):
        rep = json.loads(report.read_text())
        if "throughput" not in rep:
            continue
        df = pd.DataFrame(rep["throughput"])
        df.insert(0, "routing", rep.get("routing", "uniform"))
        df.insert(0, "model", rep["model"])
        df["gpu"] = rep.get("gpu", rep.get("device"))
        df["timing_note"] = rep.get("timing_note")  # a CPU run's: base/run/pipeline.py cpu_timing_note
        frames.append(df.assign(engine=run_engine(report.parent), _run=report.parent.name))
    if not frames:
        raise SystemExit(f"error: no throughput runs under {exp_dir}")
    df = pd.concat(frames, ignore_index=True)
    if one_run_per_cell:
        _one_run_per_cell(df)
    df = df.drop(columns="_run")
    for col in ("non_expert_ms", "moe_share"):  # CPU runs have no non-expert timing
        if col not in df:
            df[col] = float("nan")
    # the tables set runs side by side (and the README's headline across models): one engine's
    return with_engine(df, one_engine(df, f"the throughput table of {exp_dir}"))


def _one_run_per_cell(df: pd.DataFrame) -> None:
    """Refuse two run folders timing the same cell: the tables would set one beside the other as
    if they were one run's (a rerun beside its first run, a cell re-timed under another kernel table)."""
    def cell(r: pd.Series) -> str:
        budget = "no budget" if pd.isna(r["budget"]) else f"M={int(r['budget'])}"
        return f"{r['model']} {r['routing']} batch {r['batch_size']} {r['variant']} {budget} {r['mode']}"

    one_run_per_cell(df, ["model", "routing", "batch_size", "variant", "budget", "mode"], "timed", cell,
                     "put each run in its own folder")


def speedup_table(df: pd.DataFrame) -> pd.DataFrame:
    g = df[df["mode"] == "graph"].copy()
    g["col"] = g.apply(lambda r: r["variant"] if pd.isna(r["budget"]) else f"{r['variant']}@{int(r['budget'])}", axis=1)
    dense = g[g["variant"] == "dense"].set_index(["model", "routing", "batch_size"])
    wide = g.pivot_table(index=["model", "routing", "batch_size"], columns="col", values="speedup_vs_dense")
    wide = wide.drop(columns=["dense"], errors="ignore").round(2)
    wide.insert(0, "dense union", dense["union_mean"].round(1))
    wide.insert(0, "dense tok/s", dense["tokens_per_s"].round(0))
    wide.insert(0, "dense ms", dense["ms_per_step"].round(2))
    return wide.reset_index()


def headline_table(df: pd.DataFrame, batch: int = 16) -> pd.DataFrame:
    """results/README.md's table: one row per (model, routing) at one batch size."""
    g = df[(df["mode"] == "graph") & (df["batch_size"] == batch)]
    out = []
    for (model, routing), one in g.groupby(["model", "routing"]):
        def at(variant: str, budget: float | None = None, col: str = "speedup_vs_dense", one=one) -> float:
            sel = one[(one["variant"] == variant) & (one["budget"].isna() if budget is None else one["budget"] == budget)]
            value = sel[col].iloc[0] if len(sel) else None
            return float("nan") if value is None else float(value)  # a grid without dense has no speed-ups

        out.append({
            "model": model, "routing": routing, "dense union": at("dense", col="union_mean"),
            "dense ms/step": at("dense", col="ms_per_step"), "dense tok/s": at("dense", col="tokens_per_s"),
            "non-expert ms": at("dense", col="non_expert_ms"), "MoE share (dense)": at("dense", col="moe_share"),
            "base M=16 tok/s": at("base", 16, "tokens_per_s"), "base M=16": at("base", 16),
            "base M=10": at("base", 10), "base M=8": at("base", 8), "router_sum M=16": at("router_sum", 16),
            "oea k0=1": at("oea(k0=1)"), "oea k0=1 kept": at("oea(k0=1)", col="kept_mean"),
            "base_anchor M=16": at("base_anchor(k0=1)", 16), "top1_union M=16": at("top1_union", 16),
        })
    return pd.DataFrame(out).round(2)


def _runs(r: pd.Series) -> list[float]:
    """A row's timed passes in round order (one pass when the run had no repeats)."""
    runs = r.get("ms_runs")
    if isinstance(runs, str) and runs:
        return [float(x) for x in runs.split(";")]
    return [float(r["ms_per_step"])]


def overhead_table(df: pd.DataFrame) -> pd.DataFrame:
    """Selection overhead: each budgeted selector's step against `fixed` (same budget, same number
    of kept experts, no scoring) in the same run, overhead = (ms - fixed ms) / fixed ms, per round
    of the interleaved repeats (passes pair up by round): the median over rounds and its range.
    Also the longest warm-up of the batch size (region compilation, when new, and the capture)."""
    g = df[df["mode"] == "graph"]
    fixed = g[g["variant"] == "fixed"].set_index(["model", "routing", "batch_size", "budget"])
    if fixed.empty:
        return pd.DataFrame()
    rows = []
    for _, r in g[g["budget"].notna() & (g["variant"] != "fixed")].iterrows():
        key = (r["model"], r["routing"], r["batch_size"], r["budget"])
        if key not in fixed.index:
            continue
        f = fixed.loc[key]
        pairs = list(zip(_runs(r), _runs(f)))
        over = [(a - b) / b for a, b in pairs]
        rows.append({"model": r["model"], "routing": r["routing"], "batch_size": r["batch_size"],
                     "budget": int(r["budget"]), "variant": r["variant"], "ms": round(r["ms_per_step"], 3),
                     "fixed ms": round(f["ms_per_step"], 3), "overhead": round(statistics.median(over), 4),
                     "min": round(min(over), 4), "max": round(max(over), 4), "rounds": len(pairs)})
    out = pd.DataFrame(rows)
    if "warmup_s" in g and not out.empty:
        warm = g.groupby(["model", "routing", "batch_size"])["warmup_s"].max().round(1).rename("max warm-up s")
        out = out.merge(warm.reset_index(), on=["model", "routing", "batch_size"], how="left")
    return out


def breakdown_table(df: pd.DataFrame) -> pd.DataFrame:
    g = df[(df["mode"] == "graph") & df["non_expert_ms"].notna()]
    cols = ["model", "routing", "batch_size", "variant", "budget", "ms_per_step", "non_expert_ms", "moe_share",
            "kept_mean", "tokens_per_s"]
    return g[cols].round(3)


USAGE = "usage: python -m analysis.throughput <folder of throughput runs> <out: path prefix of the .md and .csv>"


def main(exp_dir: str, out: str) -> None:
    df = collect(Path(exp_dir))
    out_p = Path(out)
    out_p.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out_p.with_suffix(".csv"), index=False)
    eager = df[df["mode"] == "eager"][["model", "routing", "batch_size", "variant", "budget", "ms_per_step",
                                       "tokens_per_s"]]
    text = [f"Decode engine: `{df['engine'].iloc[0]}` (analysis/engines.py).\n",
            *[f"**Note:** {n}.\n" for n in df["timing_note"].dropna().unique()]]
    sections = [("Batch 16 (speed-ups: tokens/s over dense, same process, CUDA-graph replay)", headline_table(df)),
                ("Speed-up over dense (tokens/s ratio, same process, CUDA-graph replay)",
                 speedup_table(df) if (df["mode"] == "graph").any() else pd.DataFrame()),
                ("Where the step goes (experts skipped -> non-expert ms)", breakdown_table(df)),
                ("Selection overhead against `fixed` (same budget, no scoring): (ms - fixed ms) / fixed ms, median over "
                 "rounds [min, max]", overhead_table(df)),
                ("Eager decoding (same engine, no graph, no compiled regions), once per run", eager.round(2))]
    for i, (title, table) in enumerate((t, d) for t, d in sections if not d.empty):  # a CPU run has no graph rows
        text += [("" if i == 0 else "\n") + title + "\n", table.to_markdown(index=False)]
    text[-1] += "\n"
    rows = profile_rows(Path(exp_dir))
    prof = collect_profiles(rows)
    if not prof.empty:
        text += ["\nWhere an eager step's kernel time goes (ms per step; graph_ms_per_step: the replayed step)\n",
                 prof.to_markdown(index=False), "\n"]
    bw, slow = expert_bandwidth_table(rows)
    if not bw.empty:
        text += [("\nThe expert FFN's weights per step against copy bandwidth (eager profile: kept experts x MoE layers "
                 "x expert bytes, each read once)\n"), bw.to_markdown(index=False), "\n", *[w + "\n" for w in slow]]
    kern = collect_profiles(rows, "kernels_per_layer")
    if not kern.empty:
        text += ["\nKernels per decoder layer and step, by class (total: all kernels of the step / layers)\n",
                 kern.to_markdown(index=False), "\n"]
        rows.round(4).to_csv(out_p.parent / (out_p.name + "_profile.csv"), index=False)
    kernels = kernel_rows(Path(exp_dir))
    if not kernels.empty:
        kernels.round(4).to_csv(out_p.parent / (out_p.name + "_kernels.csv"), index=False)
        text += [("\nThe largest kernels of an eager step, dense and base (ms per step; launches per decoder layer; "
                 "µs per launch; names cut at 60 characters, every kernel in the _kernels.csv)\n"),
                 top_kernels(kernels).to_markdown(index=False), "\n"]
    out_p.with_suffix(".md").write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(USAGE)
    main(*sys.argv[1:3])
