"""The report: every figure of analysis/figures.py as PNG + SVG and a report.md that embeds them
beside their tables. Reads results/ (committed) and outputs/ (when present); runs no model.

    make report                      # -> outputs/report/
    make report REFRESH=1            # results/ alone -> results/figures/ (the README's figures)
    make report LOG=wandb            # also one wandb summary run with the figures (offline)
    python -m analysis.report --out outputs/report [--results-only] [--exp ablation_mini] [--log wandb]
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import figures as F
from analysis import tables as T
from analysis.load import Data, load
from analysis.style import save


def _cell(mean, low, high, digits: int = 3) -> str:
    if mean is None or pd.isna(mean):
        return ""
    if low is None or pd.isna(low):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def markdown_table(df: pd.DataFrame, digits: int = 3) -> str:
    """`<m>`, `<m>_low`, `<m>_high` columns merged into `mean [low, high]` cells; NA shown empty."""
    if df.empty:
        return "_(no rows)_"
    out = pd.DataFrame(index=df.index)
    for c in df.columns:
        if c.endswith(("_low", "_high")) and c.rsplit("_", 1)[0] in df.columns:
            continue
        if f"{c}_low" in df.columns:
            out[c] = [_cell(m, lo, hi, digits) for m, lo, hi in zip(df[c], df[f"{c}_low"], df[f"{c}_high"])]
        elif pd.api.types.is_float_dtype(df[c]):
            out[c] = df[c].map(lambda v: "" if pd.isna(v) else f"{v:.{digits}f}")
        else:
            out[c] = df[c].astype(object).where(df[c].notna(), "")
    return out.to_markdown(index=False)


def _paired(data: Data, exp: str, source: str, variants: list[str]) -> pd.DataFrame:
    """Each variant minus base, paired: the committed *_paired.csv for committed data, else over
    the per-request records of outputs/ (accuracy only)."""
    if source == "results":
        p = data.results.paired
        if p.empty:
            return p
        return p[(p["exp"] == exp) & p["variant"].isin(variants)].reindex(
            columns=["variant", "budget", "metric", "diff", "low", "high", "call", "unit"])
    runs = data.outputs.runs
    runs = runs[(runs["exp"] == exp) & (runs["stage"] == "evaluate") & runs["variant"].isin([*variants, "base"])]
    samples = data.outputs.table("samples", runs)
    if samples.empty:
        return pd.DataFrame()
    out = T.paired_accuracy(samples, variants).drop(columns="exp")
    return out.assign(metric="accuracy", unit=[f"prompts ({n})" for n in out["prompts"]]).drop(columns="prompts")


def _paired_md(p: pd.DataFrame) -> str:
    if p.empty:
        return ""
    cells = [f"{r['diff']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}] {r['call']}" for _, r in p.iterrows()]
    wide = p.assign(cell=cells).pivot_table(index=["budget", "variant"], columns="metric", values="cell",
                                            aggfunc="first").reset_index()
    return ("\nMinus base at the same budget, paired, [95 % interval] and call (tie unless the interval excludes "
            "zero):\n\n" + wide.to_markdown(index=False) + "\n")


def build(data: Data, batch_size: int = 16, exps: list[str] | None = None) -> list[tuple[F.Plot, str]]:
    """Every figure with the markdown that follows it in report.md (its table, paired calls)."""
    points = T.quality_points(data)
    if exps:
        points = points[points["exp"].isin(exps)]
    speed = T.throughput_rows(data)
    info = T.exp_info(points).set_index("exp")
    out: list[tuple[F.Plot, str]] = []

    tr = T.tradeoff(points, speed, batch_size)
    avail = tr.groupby("model").agg(quality_points=("has_quality", "sum"), speed_points=("has_speed", "sum"),
                                    joined=("has_speed", lambda s: int((s & tr.loc[s.index, "has_quality"]).sum())))
    joined = tr[tr["has_quality"] & tr["has_speed"]]
    md = markdown_table(avail.reset_index())
    if len(joined):
        front = joined.groupby("model", group_keys=False).apply(
            lambda g: g[T.pareto(g["speedup"], g["accuracy"])])
        md += "\n\nPareto front:\n\n" + markdown_table(front.reindex(columns=[
            "model", "variant", "budget", "routing", "accuracy", "accuracy_low", "accuracy_high", "speedup"]))
    out.append((F.tradeoff_figure(tr, batch_size), md))

    for exp in info.index:
        w = T.wide(points[points["exp"] == exp])
        plot = F.kept_figure(w, exp)
        out.append((plot, markdown_table(plot.table)))

    out.append((F.union_figure(u := T.union_by_batch(data, speed)), markdown_table(
        u.pivot_table(index=["model", "routing"], columns="batch_size", values="union").round(1).reset_index()
        .rename(columns=lambda c: f"B={c}" if isinstance(c, (int, np.integer)) else c), digits=1)))

    fidelity = points[points["metric"].isin(["energy_retained", "kl"])]["exp"].unique()
    for exp in [e for e in info.index if e in fidelity]:
        w = T.wide(points[points["exp"] == exp])
        plot = F.rules_figure(w, exp)
        others = [v for v in w["variant"].unique() if v not in ("base", "dense")]
        out.append((plot, markdown_table(plot.table) + "\n" + _paired_md(_paired(data, exp, info.loc[exp, "source"],
                                                                                 others))))

    for exp in info.index:
        w = T.wide(points[points["exp"] == exp])
        if w["variant"].isin(T.REASSIGN[1:]).any():
            paired = _paired(data, exp, info.loc[exp, "source"], list(T.REASSIGN[1:]))
            plot = F.reassign_figure(w, exp, paired)
            out.append((plot, markdown_table(plot.table) + "\n" + _paired_md(paired)))
    if not any(p.name.startswith("fig5") for p, _ in out):
        out.append((F.reassign_figure(pd.DataFrame(), "", pd.DataFrame()), ""))

    r2 = T.predictor_r2(data)
    out.append((F.r2_figure(r2), markdown_table(r2.pivot_table(index="model", columns="layer", values="r2")
                                                .round(3).reset_index().rename(columns=lambda c: str(c)))
                if len(r2) else ""))
    heat = T.adaptive_kept(data)
    if exps:
        heat = heat[heat["exp"].isin(exps)]
    for exp in sorted(heat["exp"].unique()) or [""]:
        h = heat[heat["exp"] == exp]
        plot = F.heatmap_figure(h, exp)
        summary = h.groupby(["variant", "budget", "layer"], dropna=False)["kept"].mean().unstack("layer")
        out.append((plot, markdown_table(summary.round(2).reset_index().rename(columns=lambda c: f"layer {c}"
                                                                              if isinstance(c, (int, np.integer))
                                                                              else c), digits=2) if len(h) else ""))
    return out


def write(plots: list[tuple[F.Plot, str]], out: Path, header: str) -> Path:
    """PNG + SVG of every figure with data, and report.md; an empty figure is a line saying why."""
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("fig*.png"), *out.glob("fig*.svg")]:  # the folder mirrors this report, no stale figures
        old.unlink()
    text = [header]
    for plot, md in plots:
        number = plot.name.split("_", 1)[0].removeprefix("fig")  # fig6b_... -> 6b: the issue's numbering
        text.append(f"\n## Figure {number}: {plot.title}\n")
        if plot.empty:
            text.append(f"No figure: {plot.empty}.\n")
            continue
        save(plot.fig, out, plot.name)
        text += [f"![{plot.title}]({plot.name}.png)\n", f"*{plot.caption}*\n", md + "\n"]
    path = out / "report.md"
    path.write_text("\n".join(text))
    return path


def log_wandb(plots: list[tuple[F.Plot, str]], out: Path, name: str, wandb_dir: Path | None = None) -> None:
    """One wandb run holding the figures and their tables (offline unless WANDB_MODE says otherwise),
    its files in wandb_dir (the runs' own sync folder, outputs/wandb, by default of main)."""
    import wandb

    wandb_dir = wandb_dir or out
    wandb_dir.mkdir(parents=True, exist_ok=True)
    run = wandb.init(project=os.environ.get("WANDB_PROJECT", "base-moe"), name=name, job_type="report",
                     dir=str(wandb_dir), mode=os.environ.get("WANDB_MODE", "offline"), reinit="finish_previous")
    for plot, _ in plots:
        if plot.empty:
            continue
        table = plot.table.astype(object).where(plot.table.notna(), None)
        run.log({f"report/{plot.name}": wandb.Image(str(out / f"{plot.name}.png"), caption=plot.caption),
                 f"report/{plot.name}_table": wandb.Table(dataframe=table)})
    run.finish()


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--outputs", default="outputs", help="run folders (ignored with --results-only)")
    ap.add_argument("--results", default="results", help="committed results")
    ap.add_argument("--out", default="outputs/report")
    ap.add_argument("--results-only", action="store_true", help="committed results alone (reproducible figures)")
    ap.add_argument("--batch-size", type=int, default=16, help="batch size of the trade-off figure")
    ap.add_argument("--exp", action="append", help="only these sweeps' quality figures (repeatable)")
    ap.add_argument("--log", choices=["none", "wandb"], default="none")
    args = ap.parse_args(argv)
    data = load(None if args.results_only else args.outputs, args.results)
    plots = build(data, args.batch_size, args.exp)
    sources = f"`{args.results}/`" + ("" if args.results_only else f" and `{args.outputs}/` ({len(data.outputs)} runs)")
    cmd = "make report REFRESH=1" if args.results_only else "make report"
    header = (f"# Report\n\nMade by `{cmd}` (`python -m analysis.report {' '.join(argv or [])}`) from {sources}; "
              "no model was run. An experiment found in both is read from the one holding more runs.\n\n"
              + markdown_table(T.exp_info(T.quality_points(data)).rename(columns={"seeds": "most seeds"})) + "\n")
    path = write(plots, Path(args.out), header)
    drawn = sum(not p.empty for p, _ in plots)
    print(f"{path}: {drawn} figures, {len(plots) - drawn} without data")
    for p, _ in plots:
        print(f"  {p.name}: " + (f"no data ({p.empty})" if p.empty else "written"))
    if args.log == "wandb":
        log_wandb(plots, Path(args.out), "report" + (f"-{'-'.join(args.exp)}" if args.exp else ""),
                  Path(args.outputs) / "wandb")
    return path


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
