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
from analysis import stats as S
from analysis import tables as T
from analysis.load import Data, fail, load, warn
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


def paired_grids(data: Data, points: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per experiment, every variant minus base, paired, with its calls: the committed
    *_paired.csv for committed data (its columns as written), else over the per-request records of
    outputs/ (accuracy only, tables.paired_accuracy: one Holm family per experiment)."""
    out: dict[str, pd.DataFrame] = {}
    for exp, source in T.exp_info(points).set_index("exp")["source"].items():
        if source == "results":
            p = data.results.paired
            p = p[p["exp"] == exp].dropna(axis=1, how="all") if len(p) else p
        else:
            runs = T.evaluations(data)
            runs = runs[runs["exp"] == exp]
            samples = data.outputs.table("samples", runs)
            variants = sorted(v for v in runs["variant"].dropna().unique() if v not in ("base", "dense"))
            p = _paired_outputs(exp, samples, variants)
        if len(p):
            out[exp] = p.reset_index(drop=True)
    return out


def _paired_outputs(exp: str, samples: pd.DataFrame, variants: list[str]) -> pd.DataFrame:
    """tables.paired_accuracy over an experiment's records; records without prompt hashes (runs
    before they were recorded) cannot show that two runs scored the same prompts: no calls, said."""
    if samples.empty:
        return pd.DataFrame()
    unhashed = samples["prompt_hash"].isna() if "prompt_hash" in samples else pd.Series(True, index=samples.index)
    if unhashed.any() or "correct" not in samples:
        runs = sorted(samples.loc[unhashed, "run"].unique()) or sorted(samples["run"].unique())
        warn(f"no paired calls for {exp}: the samples.jsonl of {len(runs)} run(s) ({', '.join(runs[:3])}"
             f"{', ...' if len(runs) > 3 else ''}) lack prompt_hash or correct (an older schema)")
        return pd.DataFrame()
    try:
        return T.paired_accuracy(samples, variants)
    except ValueError as e:
        fail(str(e))


def _calls_text(grid: pd.DataFrame) -> str:
    if not T.corrected(grid):
        return (f"calls as committed ({T.OLD_TEST}): a difference where the 95 % interval excludes zero, else "
                "\"tie\", which here means only that the interval holds zero (no equivalence test)")
    tests = "; ".join(f"{m}: {t}" for m, t in grid.groupby("metric")["test"].first().items())
    n = int((grid["p"].notna() & (grid["call"] != S.EXCLUDED)).sum())
    cross = (" A call marked exploratory fails the cross-grid correction (results/cross_grid.md: Benjamini-Hochberg over "
             "every committed comparison, Holm over the README's headline family); excluded: reported, not called "
             "(it mirrors KL, or is equal by construction)." if "scope" in grid else "")
    return (f"calls Holm-corrected over the grid's {n} comparisons (p: the corrected p of no difference); "
            f"higher/lower where that test rejects at {S.ALPHA:g}, tie (not for accuracy: stats.TIE_METRICS) where "
            "it does not and the corrected equivalence test (TOST) against the margin passes, else inconclusive."
            + cross + " Tests: " + tests)


def _paired_md(grid: pd.DataFrame, variants: list[str] | None = None) -> str:
    """The grid's paired rows (of `variants`) as one cell per (budget, variant, metric)."""
    p = grid if variants is None or grid.empty else grid[grid["variant"].isin(variants)]
    if p.empty:
        return ""
    new = T.corrected(grid)

    def cell(r) -> str:
        text = f"{r['diff']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}] {r['call']}"
        text += " (exploratory)" if r.get("scope") == "exploratory" else ""
        return text + (f", p {r['p_holm']:.2g}" if new and pd.notna(r["p_holm"]) else "")

    wide = p.assign(cell=[cell(r) for _, r in p.iterrows()]).pivot_table(
        index=["budget", "variant"], columns="metric", values="cell", aggfunc="first").reset_index()
    return (f"\nMinus base at the same budget, paired, [95 % interval], {_calls_text(grid)}:\n\n"
            + wide.to_markdown(index=False) + "\n")


def replication_md(results: Path, out: Path) -> str:
    """Which rule to use: the pre-registered replication's recommendation (analysis/replication.py, the
    same text README.md's "Which rule to use" shows), when its calls are committed."""
    from analysis import replication

    path = results / Path(replication.PAIRED).name
    if not path.exists():
        return (f"No pre-registered recommendation yet: `{path}` is missing (`make replication`, "
                f"docs/preregistration.md).\n")
    return (replication.recommendation_text(pd.read_csv(path), link=os.path.relpath(replication.ROOT, out) + "/") + "\n\nThe per-grid table below is each committed "
            "grid on its own (Holm per grid, pools reused across analyses): exploratory beside the replication.\n")


def recommendations_md(grids: dict[str, pd.DataFrame], points: pd.DataFrame, results: Path = Path("results"),
                       out: Path = Path("outputs/report")) -> str:
    """The report's Recommendations section: the replication's recommendation, then
    tables.recommendations over every grid."""
    paired = pd.concat([g.assign(exp=e) for e, g in grids.items()], ignore_index=True) if grids else pd.DataFrame()
    rec = T.recommendations(paired, points)
    margins = ", ".join(f"{m} ±{v:g}" for m, v in S.MARGINS.items())
    text = ["\n## Recommendations\n", replication_md(results, out),
            ("Per experiment and budget, from each rule's accuracy minus base's at the same budget, paired over the "
             "same prompts: where rules are higher than base, the most accurate of them; else base together with "
             "every rule tied with it. Calls (analysis/stats.py): per grid, every test of no difference is "
             f"Holm-corrected together at {S.ALPHA:g}, and every equivalence test too; higher/lower where the "
             "corrected test rejects; **tie means the two one-sided tests (TOST) against the metric's margin passed** "
             f"after correction (equivalent within ±margin); inconclusive: neither. Margins: {margins}. `also better "
             "on`: other metrics on which a recommended rule beats base by a call (lower kl and out_error, higher "
             "energy_retained and dll). Grids whose committed paired file predates these tests "
             f"({T.OLD_TEST}) keep their higher/lower calls; their \"tie\" (an interval holding zero, no "
             "equivalence test) is listed as inconclusive.\n")]
    if rec.empty:
        return "\n".join(text + ["_(no paired comparisons against base)_\n"])
    text.append(markdown_table(rec.drop(columns=["test", "correction"]).rename(
        columns={"also_better_on": "also better on", "also_higher": "also higher than base"})))
    per_grid = rec.groupby("exp")[["test", "correction"]].first()
    text.append("\nTest and correction per grid:\n\n" + "\n".join(
        f"- {e}: {r['test']}; {r['correction']}" for e, r in per_grid.iterrows()) + "\n")
    return "\n".join(text)


def build(data: Data, batch_size: int = 16, exps: list[str] | None = None,
          grids: dict[str, pd.DataFrame] | None = None) -> list[tuple[F.Plot, str]]:
    """Every figure with the markdown that follows it in report.md (its table, paired calls);
    `grids` (paired_grids) is computed here when not given."""
    points = T.quality_points(data)
    if exps:
        points = points[T.in_exps(points["exp"], exps)]
    grids = paired_grids(data, points) if grids is None else grids
    speed = T.throughput_rows(data)
    untimed = speed[speed["mode"].isna()] if len(speed) else speed
    if len(untimed):  # figures 1 and 3 read CUDA-graph rows (tables.graph_rows)
        warn(f"figures 1 and 3 leave out the throughput rows of {', '.join(sorted(untimed['run'].astype(str).unique()))}:"
             " they record no timing mode (runs before the engine-based sweep), and the figures show CUDA-graph "
             "timings only")
    info = T.exp_info(points).set_index("exp")
    out: list[tuple[F.Plot, str]] = []

    tr = T.tradeoff(points, speed, batch_size, T.pool_sizes(data))
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

    for exp in info.index:  # an experiment without fidelity metrics gets its figure's "No figure" line
        w = T.wide(points[points["exp"] == exp])
        plot = F.rules_figure(w, exp)
        others = [v for v in w["variant"].unique() if v not in ("base", "dense")]
        out.append((plot, markdown_table(plot.table) + "\n" + _paired_md(grids.get(exp, pd.DataFrame()), others)))

    for exp in info.index:
        w = T.wide(points[points["exp"] == exp])
        if w["variant"].isin(T.REASSIGN[1:]).any():
            grid = grids.get(exp, pd.DataFrame())
            plot = F.reassign_figure(w, exp, grid[grid["variant"].isin(T.REASSIGN[1:])] if len(grid) else grid)
            out.append((plot, markdown_table(plot.table) + "\n" + _paired_md(grid, list(T.REASSIGN[1:]))))
    if not any(p.name.startswith("fig5") for p, _ in out):
        out.append((F.reassign_figure(pd.DataFrame(), "", pd.DataFrame()), ""))

    r2 = T.predictor_r2(data)
    out.append((F.r2_figure(r2), markdown_table(r2.pivot_table(index="model", columns="layer", values="r2")
                                                .round(3).reset_index().rename(columns=lambda c: str(c)))
                if len(r2) else ""))
    heat = T.adaptive_kept(data)
    if exps:
        heat = heat[T.in_exps(heat["exp"], exps)]
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
    points = T.quality_points(data)
    unknown = [e for e in args.exp or [] if not T.in_exps(points["exp"], [e]).any()]
    if unknown:
        where = f"`{args.results}/`" + ("" if args.results_only else f" or `{args.outputs}/`")
        known = sorted(set(T.sweep_of(points["exp"])))
        fail(f"no experiment {', '.join(unknown)} in {where} (finished evaluate runs or committed tables); "
             f"known: {', '.join(known) or 'none'}")
    grids = paired_grids(data, points[T.in_exps(points["exp"], args.exp)] if args.exp else points)
    plots = build(data, args.batch_size, args.exp, grids)
    sources = f"`{args.results}/`" + ("" if args.results_only else f" and `{args.outputs}/` ({len(data.outputs)} runs)")
    cmd = "make report REFRESH=1" if args.results_only else "make report"
    header = (f"# Report\n\nMade by `{cmd}` (`python -m analysis.report {' '.join(argv or [])}`) from {sources}; "
              "no model was run. An experiment found in both is read from the one holding more runs; one holding "
              "runs of several models is reported per model, as `<exp>[<model>]`.\n\n"
              + markdown_table(T.exp_info(points).rename(columns={"seeds": "most seeds"})) + "\n"
              + recommendations_md(grids, points, Path(args.results), Path(args.out).resolve()))
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
