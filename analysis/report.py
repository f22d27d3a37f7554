"""The report: figures of analysis/figures.py as PNG + SVG and a report.md that embeds them beside
their tables. Reads results/ (the committed grids) and outputs/ (your own runs) and keeps them apart:
the committed grids' figures are drawn from results/ alone, and your runs, when outputs/ holds any,
get their own section, "Your runs", with their own figures. Runs no model.

    make report                      # one-page summary: at most 8 figures, report.md <= 150 lines -> outputs/report/
    make report-all                  # every figure of every grid (--all) -> outputs/report/
    make report REFRESH=1            # results/ alone, every figure -> results/figures/ (the README's figures)
    make report LOG=wandb            # also one wandb summary run with the figures (offline)
    python -m analysis.report --out outputs/report [--all] [--results-only] [--exp ablation_mini] [--log wandb]

The summary's committed figures, in this order (SUMMARY; the last give way to yours, up to YOURS_MAX,
so the page never holds more than SUMMARY_MAX): the trade-off (1), accuracy against experts kept on
the two main grids (2), the pre-registered replication's calls (7), the H200 grid's speed-up per
batch size (8), the union before selection (3), the selection rules' fidelity on the first main
grid (4) and the predictor's R² (6a).
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable
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


def replication_md(results: Path, out: Path, per_grid: str = "The per-grid table below") -> str:
    """Which rule to use: the pre-registered replication's recommendation (analysis/replication.py, the
    same text README.md's "Which rule to use" shows), when its calls are committed; then where
    `per_grid`, the committed grids' own recommendations, are."""
    from analysis import replication

    path = results / Path(replication.PAIRED).name
    if not path.exists():
        return (f"No pre-registered recommendation yet: `{path}` is missing (`make replication`, "
                f"docs/preregistration.md).\n")
    return (replication.recommendation_text(pd.read_csv(path), link=os.path.relpath(replication.ROOT, out) + "/")
            + f"\n\n{per_grid} is each committed grid on its own (Holm per grid, pools reused across analyses): "
            "exploratory beside the replication.\n")


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


def _speed(data: Data) -> pd.DataFrame:
    """Every timed configuration; warns of rows no figure can show (no timing mode recorded)."""
    speed = T.throughput_rows(data)
    untimed = speed[speed["mode"].isna()] if len(speed) else speed
    if len(untimed):  # figures 1, 3 and 8 read CUDA-graph rows (tables.graph_rows)
        warn(f"figures 1 and 3 leave out the throughput rows of {', '.join(sorted(untimed['run'].astype(str).unique()))}:"
             " they record no timing mode (runs before the engine-based sweep), and the figures show CUDA-graph "
             "timings only")
    return speed


def _points(data: Data, exps: list[str] | None) -> pd.DataFrame:
    points = T.quality_points(data)
    return points[T.in_exps(points["exp"], exps)] if exps else points


def build(data: Data, batch_size: int = 16, exps: list[str] | None = None,
          grids: dict[str, pd.DataFrame] | None = None, committed: bool = True) -> list[tuple[F.Plot, str]]:
    """Every figure with the markdown that follows it in report.md (its table, paired calls);
    `grids` (paired_grids) is computed here when not given. `committed` (results/): also the
    pre-registered replication's figure (7), which only results/ holds, and no kept-experts heat map
    (6b), which only run folders can give, unless `data` holds run folders too."""
    points = _points(data, exps)
    grids = paired_grids(data, points) if grids is None else grids
    speed = _speed(data)
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
    heat = T.adaptive_kept(data)  # from run folders' selection_steps.csv: results/ holds none
    if exps:
        heat = heat[T.in_exps(heat["exp"], exps)]
    for exp in sorted(heat["exp"].unique()) or ([] if committed and len(data.outputs) == 0 else [""]):
        h = heat[heat["exp"] == exp]
        plot = F.heatmap_figure(h, exp)
        summary = h.groupby(["variant", "budget", "layer"], dropna=False)["kept"].mean().unstack("layer")
        out.append((plot, markdown_table(summary.round(2).reset_index().rename(columns=lambda c: f"layer {c}"
                                                                              if isinstance(c, (int, np.integer))
                                                                              else c), digits=2) if len(h) else ""))
    if committed:
        calls = T.replication_calls(data)
        out.append((F.replication_figure(calls), _replication_md(calls)))
    plot = F.speedup_figure(T.graph_rows(speed))
    out.append((plot, _speed_md(plot.table) if not plot.empty else ""))
    return out


# ---- the one-page summary ----------------------------------------------------------------------
Plan = list[tuple[str, Callable[[], tuple[F.Plot, str]]]]  # (what it shows, draw it: figure and markdown)
SUMMARY_MAX = 8  # figures on the summary page, yours included
YOURS_MAX = 4  # of which at most this many are your runs'
MAIN_GRIDS = ("quality_seeds_mini", "quality_seeds_mini_olmoe")  # every selector x budget, one per embedded model


def main_grids(points: pd.DataFrame, exps: list[str] | None = None) -> list[str]:
    """The grids whose accuracy-vs-kept figure the summary shows: the named sweeps (--exp), else
    MAIN_GRIDS where committed, else each model's grid with the most points (tables.primary_exp)."""
    have = list(T.exp_info(points)["exp"])
    if exps:
        return have
    main = [e for e in MAIN_GRIDS if e in have]
    if main or not have:
        return main
    models = points[points["metric"] == "accuracy"].groupby("model")["n"].sum().sort_values(ascending=False).index
    return [e for e in (T.primary_exp(points, m) for m in models[:2]) if e]


def _budget_col(b) -> str:
    return "no budget" if pd.isna(b) else f"M={int(b)}"


def accuracy_md(w: pd.DataFrame) -> str:
    """Accuracy per selector (rows) and budget (columns): the compact table under a summary figure."""
    if w.empty or "accuracy" not in w:
        return ""
    cols = sorted(w["budget"].dropna().astype(int).unique())
    t = w.assign(M=w["budget"].map(_budget_col)).pivot_table(index="variant", columns="M", values="accuracy",
                                                               aggfunc="first")
    t = t.reindex(index=F._variants(w), columns=[c for c in [*(f"M={b}" for b in cols), "no budget"] if c in t])
    return ("Accuracy (exact match) per selector and budget M (distinct experts kept per MoE layer per decode "
            "step; `no budget`: dense and rules that choose their own count):\n\n"
            + markdown_table(t.reset_index().rename_axis(columns=None)) + "\n")


def _replication_md(calls: pd.DataFrame) -> str:
    """Each rule minus base (percentage points) with its corrected call, per model and budget."""
    if calls.empty:
        return ""
    col = [f"{m} M={int(b)}" for m, b in zip(calls["model"], calls["budget"])]
    t = calls.assign(cell=[f"{100 * d:+.1f} {c}" for d, c in zip(calls["diff"], calls["call"])], col=col)
    t = t.pivot_table(index="method", columns="col", values="cell", aggfunc="first")
    t = t.reindex(index=list(dict.fromkeys(calls["method"])), columns=list(dict.fromkeys(col)))
    return ("Rule minus base in accuracy (percentage points) and its Holm-corrected call:\n\n"
            + markdown_table(t.reset_index().rename(columns={"method": "rule"}).rename_axis(columns=None)) + "\n")


def _speed_md(t: pd.DataFrame) -> str:
    """Speed-up over dense per (model, router) and batch size at the budget every model was timed at."""
    if t.empty:
        return ""
    per_model = t.groupby("budget")["model"].nunique()
    common = sorted(per_model[per_model == per_model.max()].index)
    budget = common[(len(common) - 1) // 2]  # the middle budget every model was timed at
    at = t[t["budget"] == budget]
    w = at.pivot_table(index=["model", "routing"], columns="batch_size", values="speedup_vs_dense", aggfunc="first")
    w = w.rename(columns=lambda b: f"batch {int(b)}").reset_index().rename_axis(columns=None)
    return (f"Speed-up over dense (×) at M={int(budget)}:\n\n" + markdown_table(w, digits=2) + "\n")


def summary(data: Data, batch_size: int = 16, exps: list[str] | None = None) -> Plan:
    """The committed grids' summary figures, most informative first (the module's docstring says
    which): `take` draws as many as the page has room for."""
    points = _points(data, exps)
    speed = _speed(data)
    mains = main_grids(points, exps)

    def wide(exp):
        return T.wide(points[points["exp"] == exp])

    def kept(exp):
        w = wide(exp)
        return F.kept_figure(w, exp), accuracy_md(w)

    def rules(exp):
        plot = F.rules_figure(wide(exp), exp)
        return plot, "" if plot.empty else "Its table and paired calls against base: `make report-all`.\n"

    def replication():
        calls = T.replication_calls(data)
        return F.replication_figure(calls), _replication_md(calls)

    def speedup():
        plot = F.speedup_figure(T.graph_rows(speed))
        return plot, _speed_md(plot.table) if not plot.empty else ""

    plan: Plan = [
        ("the trade-off", lambda: (F.tradeoff_figure(T.tradeoff(points, speed, batch_size, T.pool_sizes(data)),
                                                     batch_size), ""))]
    plan += [(f"accuracy vs kept: {e}", lambda e=e: kept(e)) for e in mains]
    plan += [("the replication's calls", replication), ("speed-up per batch size", speedup),
             ("union vs batch size", lambda: (F.union_figure(T.union_by_batch(data, speed)), ""))]
    plan += [(f"selection rules: {e}", lambda e=e: rules(e)) for e in mains[:1]]
    plan += [("predictor R²", lambda: (F.r2_figure(T.predictor_r2(data)), ""))]
    return plan


def yours(data: Data, batch_size: int = 16, exps: list[str] | None = None,
          grids: dict[str, pd.DataFrame] | None = None) -> Plan:
    """Your runs' summary figures, as summary's: per experiment (most runs
    first) accuracy vs kept experts with the paired accuracy calls against base; the trade-off where
    you timed anything; the selection rules' fidelity per experiment; the union before selection."""
    points = _points(data, exps)
    grids = paired_grids(data, points) if grids is None else grids
    speed = _speed(data)
    info = T.exp_info(points).sort_values(["runs", "exp"], ascending=[False, True])

    def kept(exp):
        w = T.wide(points[points["exp"] == exp])
        grid = grids.get(exp, pd.DataFrame())
        acc = grid[grid["metric"] == "accuracy"] if len(grid) else grid
        return F.kept_figure(w, exp), accuracy_md(w) + _paired_md(acc)

    def rules(exp):
        plot = F.rules_figure(T.wide(points[points["exp"] == exp]), exp)
        return plot, "" if plot.empty else "Its table and paired calls of every metric: `make report-all`.\n"

    plan: Plan = [(f"accuracy vs kept: {e}", lambda e=e: kept(e)) for e in info["exp"]]
    if len(speed):
        plan.append(("your trade-off", lambda: (F.tradeoff_figure(
            T.tradeoff(points, speed, batch_size, T.pool_sizes(data)), batch_size), "")))
    plan += [(f"selection rules: {e}", lambda e=e: rules(e)) for e in info["exp"]]
    if len(speed):
        plan.append(("your union vs batch size", lambda: (F.union_figure(T.union_by_batch(data, speed)), "")))
    return plan


def take(plan: Plan, room: int) -> tuple[list[tuple[F.Plot, str]], list[str]]:
    """Draw the plan's figures in order until `room` have data (a figure without data is kept as
    its "No figure" line and takes no room); the rest are named, not drawn."""
    out: list[tuple[F.Plot, str]] = []
    for i, (_, draw) in enumerate(plan):
        if sum(not p.empty for p, _ in out) >= room:
            return out, [what for what, _ in plan[i:]]
        out.append(draw())
    return out, []


def _figure_md(plot: F.Plot, md: str, out: Path) -> list[str]:
    """A figure's blocks of report.md (its files saved under out), or the line saying why there is none."""
    number = plot.name.split("_", 1)[0].removeprefix("fig")  # fig6b_... -> 6b: the issue's numbering
    text = [f"## Figure {number}: {plot.title}"]
    if plot.empty:
        return text + [f"No figure: {plot.empty}."]
    save(plot.fig, out, plot.name)
    return text + [f"![{plot.title}]({plot.name}.png)", f"*{plot.caption}*", md]


def write(plots: list[tuple[F.Plot, str]], out: Path, header: str,
          sections: list[tuple[str, list[tuple[F.Plot, str]]]] = ()) -> Path:
    """PNG + SVG of every figure with data, and report.md: the header, its figures, then each
    further (heading markdown, figures) section (your runs); an empty figure is a line saying why.
    Blocks are separated by one blank line."""
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("fig*.png"), *out.glob("fig*.svg")]:  # the folder mirrors this report, no stale figures
        old.unlink()
    blocks = [header]
    for part_header, part in [("", plots), *sections]:
        blocks.append(part_header)
        for plot, md in part:
            blocks += _figure_md(plot, md, out)
    path = out / "report.md"
    path.write_text("\n\n".join(b.strip("\n") for b in blocks if b.strip()) + "\n")
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
    offline = getattr(run, "offline", False)
    sync_dir = Path(run.settings.sync_dir) if offline else None
    url = None if offline else getattr(run, "url", None)
    run.finish()
    # The same line a run prints at its end (base/run/logger.py where_logged; analysis reads no base/).
    if sync_dir is not None:
        shown = os.path.relpath(sync_dir) if not os.path.relpath(sync_dir).startswith("..") else str(sync_dir)
        print(f"[wandb] logged offline to {shown}: upload it with `wandb sync {shown}`")
    elif url:
        print(f"[wandb] logged online: {url}")


def _grids_line(points: pd.DataFrame) -> str:
    """The committed grids, one line per model: `exp (runs)`, for the summary's header."""
    info = T.exp_info(points)
    if info.empty:
        return "_(no committed quality grids)_\n"
    return "\n".join(f"- {model}: " + ", ".join(f"{e} ({int(r)} runs)" for e, r in zip(g["exp"], g["runs"]))
                     for model, g in info.groupby("model")) + "\n"


def _has_committed(data: Data, points: pd.DataFrame) -> bool:
    res = data.results
    return bool(len(points) or len(T.throughput_rows(data)) or len(res.routing) or len(res.predictor)
                or len(T.replication_calls(data)))


def _yours_md(data: Data, points: pd.DataFrame, grids: dict[str, pd.DataFrame], where: str, left: list[str]) -> str:
    """The head of the "Your runs" section: what outputs/ holds, the calls of your grids, what was left out."""
    if not len(data.outputs):
        return (f"# Your runs\n\nNo finished runs under `{where}` (a run folder is finished when it holds "
                "report.json): `make demo`, or `python run.py ...`, writes them there.\n")
    text = ["# Your runs\n", (f"{len(data.outputs)} finished runs under `{where}`, drawn from `{where}` alone: none "
                              "of their points is in the committed grids' figures above, and no committed point is in "
                              "the figures below. A grid you re-ran under a committed grid's name is drawn here as "
                              "yours (its figure's file ends in `_yours`).\n")]
    if len(points):
        text.append(markdown_table(T.exp_info(points).drop(columns="source").rename(columns={"seeds": "most seeds"}))
                    + "\n")
    paired = pd.concat([g.assign(exp=e) for e, g in grids.items()], ignore_index=True) if grids else pd.DataFrame()
    rec = T.recommendations(paired, points)
    if len(rec):
        text.append("Per experiment and budget, from your runs' paired accuracy calls against base (analysis/stats.py: "
                    "Holm over each experiment; higher/lower where the corrected test rejects, else inconclusive; an "
                    "accuracy tie is never called):\n\n" + markdown_table(
                        rec[["exp", "budget", "recommend", "accuracy", "why", "lower", "inconclusive"]]) + "\n")
    if left:
        text.append(f"Not drawn here (the page holds {SUMMARY_MAX} figures, {YOURS_MAX} of them yours): "
                    f"{', '.join(left)}; `make report-all`, or `make report EXP=<sweep>` for one sweep.\n")
    return "\n".join(text)


def _rename_collisions(committed: list[tuple[F.Plot, str]], mine: list[tuple[F.Plot, str]]) -> None:
    """A figure of your runs named like a drawn committed one (a grid you re-ran, the trade-off) gets `_yours`."""
    taken = {p.name for p, _ in committed if not p.empty}
    for plot, _ in mine:
        if plot.name in taken:
            plot.name += "_yours"


def _committed_md(args: argparse.Namespace, points: pd.DataFrame, grids: dict[str, pd.DataFrame], shown: bool,
                  left: list[str]) -> str:
    """The report's head: what it read and what the page is; the committed grids and the recommendations."""
    read = f"`{args.results}/` (the committed grids)" + (
        "" if args.results_only else f" and `{args.outputs}/` (your runs, section \"Your runs\")")
    page = ("every figure of every grid, each with its table" if args.all else
            f"a one-page summary: at most {SUMMARY_MAX} figures, the committed grids' most informative and yours")
    text = [(f"# Report\n\nMade by `python -m analysis.report {' '.join(args.argv)}` from {read}; no model was run. "
             f"This page is {page}. `make report` writes the summary, `make report-all` every figure with its table "
             "(figure numbers here are that report's), `make report REFRESH=1` redraws every committed figure into "
             "results/figures/. An experiment holding runs of several models is reported per model, as "
             "`<exp>[<model>]`.\n")]
    if not shown:
        return "\n".join(text + [f"No committed results under `{args.results}/`.\n"])
    out = Path(args.out).resolve()
    if args.all:
        return "\n".join(text + ["## Committed grids\n", markdown_table(T.exp_info(points).drop(columns="source").rename(
            columns={"seeds": "most seeds"})) + "\n", recommendations_md(grids, points, Path(args.results), out)])
    text += ["## Committed grids\n", _grids_line(points), "## Recommendations\n",
             replication_md(Path(args.results), out, per_grid="`make report-all`'s per-grid table")]
    if left:
        text.append(f"Left out to keep the page to {SUMMARY_MAX} figures: {', '.join(left)} (`make report-all`).\n")
    return "\n".join(text)


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--outputs", default="outputs", help="your run folders, their own section (ignored with --results-only)")
    ap.add_argument("--results", default="results", help="committed results")
    ap.add_argument("--out", default="outputs/report")
    ap.add_argument("--all", action="store_true", help="every figure of every grid (default: a one-page summary)")
    ap.add_argument("--results-only", action="store_true", help="committed results alone (reproducible figures)")
    ap.add_argument("--batch-size", type=int, default=16, help="batch size of the trade-off figure")
    ap.add_argument("--exp", action="append", help="only these sweeps' quality figures (repeatable)")
    ap.add_argument("--log", choices=["none", "wandb"], default="none")
    args = ap.parse_args(argv)
    args.argv = argv or []
    committed = load(None, args.results)  # the committed grids and your runs: never one frame
    mine = load(None if args.results_only else args.outputs, None)
    yours_known = sorted({rep["_axes"]["exp"] for rep in mine.outputs.reports})
    if args.exp:  # the named sweeps' runs only: another experiment's (even one analysis refuses) stays out
        mine = Data(outputs=mine.outputs.only(args.exp), results=mine.results)
    c_points, y_points = T.quality_points(committed), T.quality_points(mine)
    unknown = [e for e in args.exp or [] if not (T.in_exps(c_points["exp"], [e]).any()
                                                 or T.in_exps(y_points["exp"], [e]).any())]
    if unknown:
        where = f"`{args.results}/`" + ("" if args.results_only else f" or `{args.outputs}/`")
        known = sorted(set(T.sweep_of(c_points["exp"])) | set(yours_known))
        fail(f"no experiment {', '.join(unknown)} in {where} (finished evaluate runs or committed tables); "
             f"known: {', '.join(known) or 'none'}")
    if args.exp:
        c_points, y_points = (p[T.in_exps(p["exp"], args.exp)] for p in (c_points, y_points))
    c_grids = paired_grids(committed, c_points)
    y_grids = paired_grids(mine, y_points) if len(mine.outputs) else {}
    shown = _has_committed(committed, c_points)
    c_left, y_left = [], []
    if args.all:
        c_plots = build(committed, args.batch_size, args.exp, c_grids) if shown else []
        y_plots = build(mine, args.batch_size, args.exp, y_grids, committed=False) if len(mine.outputs) else []
    else:  # yours first, up to YOURS_MAX; the committed grids' fill the page
        y_plots, y_left = take(yours(mine, args.batch_size, args.exp, y_grids), YOURS_MAX)
        room = SUMMARY_MAX - sum(not p.empty for p, _ in y_plots)
        c_plots, c_left = take(summary(committed, args.batch_size, args.exp), room) if shown else ([], [])
    _rename_collisions(c_plots, y_plots)
    sections = [] if args.results_only else [(_yours_md(mine, y_points, y_grids, f"{args.outputs}/", y_left), y_plots)]
    path = write(c_plots, Path(args.out), _committed_md(args, c_points, c_grids, shown, c_left), sections)
    plots = c_plots + y_plots
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
