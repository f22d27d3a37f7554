"""Figure-ready tables from the loader's frames (analysis/load.py): one row per plotted point.

Quality points come from outputs/ (run folders, aggregated here over batching seeds) or from the
committed results/ (per-run tables, or per-seed aggregates already). An experiment found in both
is taken from the source holding more runs (outputs/ on a tie: it has per-request records), so a
sweep still being written to outputs/ does not hide its finished, committed version.

An experiment of outputs/ holding runs of several models is reported as one experiment per model,
`<exp>[<model>]` (per_model): its points, captions, paired calls and Holm family are one model's.
A run repeating another's measurement is counted once (load.RunSet.evaluations); an experiment
whose runs were decoded by different engines, or scored different prompt pools, is refused.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import yaml

from analysis import stats as S
from analysis.engines import one_engine
from analysis.load import ROOT, Data, fail

METRICS = ("accuracy", "kept_mean", "union_mean", "energy_retained", "out_error", "kl", "dll", "top1_agree")
POINT = ["exp", "model", "variant", "budget", "batch_size"]
REASSIGN = ("base", "base+drop", "base+similar")  # backfill (base's default) and the other modes
PAIRED = ["exp", "variant", "budget", "metric", "diff", "low", "high", "p", "p_tost", "margin", "se", "n", "test",
          "a_only", "b_only", "p_holm", "p_tost_holm", "call", "mdd", "unit"]
OLD_TEST = "uncorrected, percentile bootstrap; superseded where a grid was re-run"


def aggregate(runs: pd.DataFrame) -> pd.DataFrame:
    """Per point (exp, model, variant, budget, batch size) and metric: mean over its runs (batching
    seeds) with their range (stats.seed_range: the seeds re-batch the same prompts, so a spread, not
    an interval), n runs. One run: low and high are NaN. Refuses an experiment whose runs scored
    different prompt pools (task or task.limit): they are not replicates of one point."""
    cols = [*POINT, "metric", "mean", "low", "high", "n"]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    if "pool" in runs:
        pools = runs.dropna(subset=["pool"]).groupby("exp")["pool"].unique()
        mixed = {e: sorted(p) for e, p in pools.items() if len(p) > 1}
        if mixed:
            fail("runs of one experiment scored different prompt pools, so they cannot be averaged: "
                 + "; ".join(f"{e}: {', '.join(p)}" for e, p in mixed.items())
                 + ". Give each pool its own exp_name (or folder).")
    rows = []
    for key, g in runs.groupby(POINT, dropna=False):
        for m in METRICS:
            if m in g and g[m].notna().any():
                mean, low, high = S.seed_range(g[m].to_numpy(dtype=float))
                rows.append({**dict(zip(POINT, key)), "metric": m, "mean": mean, "low": low, "high": high,
                             "n": int(g[m].notna().sum())})
    return pd.DataFrame(rows, columns=cols)


def _runs_per_exp(points: pd.DataFrame) -> pd.Series:
    acc = points[points["metric"] == "accuracy"]
    return acc.groupby("exp")["n"].sum()


def per_model(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs with an experiment holding several models renamed `<exp>[<model>]`: each model's runs
    are their own experiment (a figure, caption and family of calls never mix two models)."""
    if runs.empty:
        return runs
    models = runs.groupby("exp")["model"].nunique()
    several = runs["exp"].isin(models[models > 1].index)
    if not several.any():
        return runs
    runs = runs.copy()
    runs.loc[several, "exp"] = runs.loc[several, "exp"] + "[" + runs.loc[several, "model"].astype(str) + "]"
    return runs


def per_setting(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs of a point that another configuration of the experiment also measured (load.settings:
    e.g. predictor.ridge=1000 beside the sweep's own) renamed `<exp>[<setting>]`, each its own
    experiment; the sweep's own configuration keeps the experiment's name. A point never pools two
    configurations as batching seeds."""
    if runs.empty or "setting" not in runs:
        return runs
    several = runs["setting"].fillna("") != ""
    if not several.any():
        return runs
    runs = runs.copy()
    label = runs.loc[several, "setting"].str.replace("[", "(").str.replace("]", ")")
    runs.loc[several, "exp"] = runs.loc[several, "exp"] + "[" + label + "]"
    return runs


def sweep_of(exp: pd.Series) -> pd.Series:
    """The experiment names as swept: `sweep[mini]` (per_model) and `sweep[mini][ridge=1]` are `sweep`."""
    return exp.astype(str).str.replace(r"(\[[^\]]*\])+$", "", regex=True)


def in_exps(exp: pd.Series, names: list[str]) -> pd.Series:
    """Which rows belong to the named experiments (`sweep` names `sweep[mini]` too)."""
    return exp.isin(names) | sweep_of(exp).isin(names)


def per_batching(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs with an experiment holding one engine of each kind (static `s…`, continuous `c…`: the
    `eval.batching` axis, e.g. experiment=heldout_mechanism) renamed `<exp>[<engine>]`, each its own
    experiment. Two engines of one kind (a run made before an engine change beside a new one) are
    left together, for `evaluations` to refuse."""
    if runs.empty or "engine" not in runs:
        return runs
    runs = runs.copy()
    for exp, g in runs.groupby("exp"):
        engines = g["engine"].dropna().astype(str).unique()
        if len(engines) > 1 and len({e[0] for e in engines}) == len(engines):
            rows = runs["exp"] == exp
            runs.loc[rows, "exp"] = exp + "[" + runs.loc[rows, "engine"].astype(str) + "]"
    return runs


def evaluations(data: Data) -> pd.DataFrame:
    """The evaluate runs of outputs/ the report reads: one per measurement, an experiment per
    model, batching and setting; an experiment of two engines of one batching is refused (analysis/engines.py)."""
    ev = per_setting(per_batching(per_model(data.outputs.evaluations)))
    for exp, g in ev.groupby("exp") if len(ev) else ():
        one_engine(g, f"experiment {exp}")
    return ev


def quality_points(data: Data) -> pd.DataFrame:
    """Every quality point of every experiment, each experiment from its fuller source, with
    `source` (outputs | results) and `hardware` (where the runs recorded it)."""
    ev = evaluations(data)
    ours = aggregate(ev).assign(source="outputs")
    theirs = pd.concat([aggregate(data.results.runs), data.results.points], ignore_index=True).assign(source="results")
    n_ours, n_theirs = _runs_per_exp(ours), _runs_per_exp(theirs)
    take_theirs = [e for e in n_theirs.index if n_theirs[e] > n_ours.get(e, 0)]
    pts = pd.concat([ours[~ours["exp"].isin(take_theirs)], theirs[theirs["exp"].isin(take_theirs)]],
                    ignore_index=True)
    hw = ev.groupby("exp")["hardware"].first() if len(ev) and "hardware" in ev else pd.Series(dtype=object)
    pts["hardware"] = [hw.get(e) if s == "outputs" else None for e, s in zip(pts["exp"], pts["source"])]
    for col in ("budget", "batch_size"):
        pts[col] = pd.to_numeric(pts[col], errors="coerce").astype("Int64")
    for col in ("mean", "low", "high", "n"):  # an empty source concatenated in leaves object columns
        pts[col] = pd.to_numeric(pts[col], errors="coerce").astype(float)
    return pts


def wide(points: pd.DataFrame) -> pd.DataFrame:
    """One row per point: <metric>, <metric>_low, <metric>_high columns, and n (runs)."""
    if points.empty:
        return pd.DataFrame(columns=[*POINT, "n"])
    key = [*POINT, "source", "hardware"]
    p = points.assign(hardware=points["hardware"].fillna(""))
    mean = p.pivot_table(index=key, columns="metric", values="mean", dropna=False, aggfunc="first")
    low = p.pivot_table(index=key, columns="metric", values="low", dropna=False, aggfunc="first").add_suffix("_low")
    high = p.pivot_table(index=key, columns="metric", values="high", dropna=False, aggfunc="first").add_suffix("_high")
    n = p.groupby(key, dropna=False)["n"].max()
    out = mean.join(low).join(high).join(n).reset_index()
    out = out.dropna(how="all", subset=[c for c in mean.columns])
    out["hardware"] = out["hardware"].replace("", None)
    return out


def exp_info(points: pd.DataFrame) -> pd.DataFrame:
    """Per experiment: model, batch size(s), hardware, source, runs and the most seeds at a point."""
    acc = points[points["metric"] == "accuracy"]
    if acc.empty:
        return pd.DataFrame(columns=["exp", "model", "batch_size", "hardware", "source", "runs", "seeds"])
    g = acc.groupby("exp")
    return pd.DataFrame({
        "model": g["model"].first(), "batch_size": g["batch_size"].apply(lambda s: ",".join(map(str, sorted(s.dropna().unique())))),
        "hardware": g["hardware"].first(), "source": g["source"].first(), "runs": g["n"].sum(), "seeds": g["n"].max(),
    }).reset_index()


def primary_exp(points: pd.DataFrame, model: str, batch_size: int | None = None) -> str | None:
    """The model's experiment with the most accuracy points (at the batch size): the quality side
    of the trade-off. Experiments are never mixed on one curve: their prompt sets differ."""
    acc = points[(points["metric"] == "accuracy") & (points["model"] == model)]
    if batch_size is not None:
        acc = acc[acc["batch_size"] == batch_size]
    if acc.empty:
        return None
    size = acc.groupby("exp").agg(points=("variant", "size"), runs=("n", "sum"))
    return size.sort_values(["points", "runs"], ascending=False).index[0]


def throughput_rows(data: Data) -> pd.DataFrame:
    """Every timed configuration of outputs/ and results/throughput/runs (outputs/ first: where
    both timed the same configuration, the outputs/ row is kept)."""
    frames = [f for f in (data.outputs.throughput, data.results.throughput.throughput if data.results.throughput
                          else None) if f is not None and len(f)]
    if not frames:
        return pd.DataFrame(columns=["model", "routing", "batch_size", "variant", "budget", "mode"])
    df = pd.concat(frames, ignore_index=True)
    return df.drop_duplicates(["model", "routing", "batch_size", "variant", "budget", "mode"]).reset_index(drop=True)


def graph_rows(speed: pd.DataFrame) -> pd.DataFrame:
    """The CUDA-graph timings (GPU decoding as served); eager rows (a CPU run, the eager reference) are left out."""
    return speed[speed["mode"] == "graph"] if len(speed) else speed


def pool_sizes(data: Data) -> dict[str, int]:
    """Experts per MoE layer by model: the runs' reports (outputs/, results/throughput), then the
    committed routing statistics, then conf/model/<model>.yaml (arch.num_experts)."""
    sizes: dict[str, int] = {}
    for conf in sorted((ROOT / "conf" / "model").glob("*.yaml")):
        n = ((yaml.safe_load(conf.read_text()) or {}).get("arch") or {}).get("num_experts")
        if n:
            sizes[conf.stem] = int(n)
    found = [(data.results.routing, "experts")]
    found += [(f, "num_experts") for f in (data.results.throughput.throughput if data.results.throughput else None,
                                           data.outputs.throughput, data.outputs.runs)]
    for frame, col in found:  # later sources win: outputs/ runs last
        if frame is not None and len(frame) and col in frame:
            for model, n in frame.dropna(subset=[col]).groupby("model")[col].first().items():
                sizes[str(model)] = int(n)
    return sizes


def tradeoff(points: pd.DataFrame, speed: pd.DataFrame, batch_size: int = 16,
             experts: dict[str, int] | None = None) -> pd.DataFrame:
    """Accuracy and end-to-end decode speed-up over dense by (model, variant, budget) at one batch
    size (graph-mode timings; `fixed`, a timing control, left out). A row has accuracy, speed-up or
    both: has_quality / has_speed say which; each model's quality side is its primary_exp.

    `experts` (pool_sizes) gives each model's experts per layer (the timed rows carry theirs):
    kept_frac = kept_mean / experts on the quality side, kept_frac_timed the same on the timed side,
    the common x of the two measurements."""
    q = []
    for model in sorted(points["model"].dropna().unique()):
        exp = primary_exp(points, model, batch_size)
        if exp is not None:
            q.append(wide(points[(points["exp"] == exp) & (points["batch_size"] == batch_size)]))
    qual = pd.concat(q, ignore_index=True) if q else pd.DataFrame(columns=["model", "variant", "budget"])
    qual = qual.reindex(columns=["model", "variant", "budget", "exp", "n", "hardware", "accuracy", "accuracy_low",
                                 "accuracy_high", "kept_mean"]).rename(columns={"hardware": "quality_hardware"})
    s = graph_rows(speed)
    s = s[(s["batch_size"] == batch_size) & (s["variant"] != "fixed")]
    s = s.reindex(columns=["model", "variant", "budget", "routing", "speedup_vs_dense", "tokens_per_s", "kept_mean",
                           "hardware", "num_experts"]).rename(
        columns={"kept_mean": "kept_timed", "hardware": "speed_hardware", "speedup_vs_dense": "speedup"})
    for df in (qual, s):
        df["budget"] = pd.to_numeric(df["budget"], errors="coerce").astype("Int64")
    out = qual.merge(s, on=["model", "variant", "budget"], how="outer")
    out["has_quality"] = out["accuracy"].notna()
    out["has_speed"] = out["speedup"].notna()
    out["kept"] = out["kept_mean"].fillna(out["kept_timed"])
    pool = {**s.dropna(subset=["num_experts"]).groupby("model")["num_experts"].first().to_dict(), **(experts or {})}
    out["experts"] = pd.to_numeric(out["model"].map(pool), errors="coerce").astype(float)
    out["kept_frac"] = pd.to_numeric(out["kept_mean"], errors="coerce") / out["experts"]
    out["kept_frac_timed"] = pd.to_numeric(out["kept_timed"], errors="coerce") / out["experts"]
    return out.drop(columns="num_experts").sort_values(["model", "variant", "budget"]).reset_index(drop=True)


def pareto(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mask of the points no other point matches or beats on both x and y (higher is better)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    dominated = ((x[None, :] >= x[:, None]) & (y[None, :] >= y[:, None])
                 & ((x[None, :] > x[:, None]) | (y[None, :] > y[:, None]))).any(axis=1)
    return ~dominated & ~np.isnan(x) & ~np.isnan(y)


def union_by_batch(data: Data, speed: pd.DataFrame) -> pd.DataFrame:
    """Mean union before selection (distinct experts per layer per step) against batch size, per
    model and routing: dense rows of the throughput runs (random weights, uniform or skewed router)
    and the routing statistics of trained models (routing 'trained')."""
    rows = []
    dense = graph_rows(speed)
    dense = dense[dense["variant"] == "dense"] if len(dense) else dense
    for _, r in dense.iterrows():
        rows.append({"model": r["model"], "routing": r["routing"], "batch_size": int(r["batch_size"]),
                     "union": r.get("union_mean"), "experts": r.get("num_experts"), "source": "throughput"})
    for _, r in data.results.routing.iterrows():
        for col in r.index:
            if col.startswith("union_") and col[6:].isdigit():
                rows.append({"model": r["model"], "routing": "trained", "batch_size": int(col[6:]), "union": r[col],
                             "experts": r["experts"], "source": r["source"]})
    out = pd.DataFrame(rows, columns=["model", "routing", "batch_size", "union", "experts", "source"])
    out["pool_share"] = out["union"] / pd.to_numeric(out["experts"], errors="coerce")
    return out.sort_values(["model", "routing", "batch_size"]).reset_index(drop=True)


def predictor_r2(data: Data) -> pd.DataFrame:
    """Held-out R² per (model, layer): the committed results/ first (what the README quotes), then
    outputs/ fit runs of other models, then the R² the committed throughput reports carry."""
    frames = [f for f in (data.results.predictor, data.outputs.predictor,
                          data.results.throughput.predictor if data.results.throughput else None)
              if f is not None and len(f)]
    if not frames:
        return pd.DataFrame(columns=["model", "layer", "r2", "r2_within", "source"])
    return pd.concat(frames, ignore_index=True).drop_duplicates(["model", "layer"]).reset_index(drop=True)


def adaptive_kept(data: Data) -> pd.DataFrame:
    """Kept experts per (layer, decode step with an active token) of the adaptive-budget runs in
    outputs/ (method.coverage or budget_split), one run per (exp, variant, budget): the lowest batching seed. Steps are in run
    order over all decode batches, so they are not averaged over seeds (other seeds batch other prompts)."""
    runs = evaluations(data)
    cols = ["exp", "model", "variant", "budget", "batch_size", "seed", "layer", "step", "kept", "tokens"]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    adaptive = runs[runs["coverage"].notna() | runs["budget_split"].isin(["sensitivity"])]
    adaptive = adaptive.sort_values("seed").drop_duplicates(["exp", "variant", "budget"])
    steps = data.outputs.table("steps", adaptive) if len(adaptive) else pd.DataFrame()
    if steps.empty:
        return pd.DataFrame(columns=cols)
    steps = steps[steps["decode"].astype(bool)] if "decode" in steps else steps
    if "tokens" in steps:  # a step with no active token selects nothing (as selection.csv: base/run/outputs.py)
        steps = steps[steps["tokens"] > 0]
    return steps.reindex(columns=cols).reset_index(drop=True)


def paired_accuracy(samples: pd.DataFrame, variants: list[str], ref: str = "base") -> pd.DataFrame:
    """Accuracy of each variant minus `ref` at the same budget over the prompts both ran, per
    (exp, variant, budget) by stats.paired_accuracy (each prompt's outcome averaged over the batching
    seeds both ran), then one Holm family per experiment (stats.grid_calls): columns PAIRED."""
    grids = []
    budgeted = samples[samples["budget"].notna()] if len(samples) else samples
    for exp, e in budgeted.groupby("exp") if len(budgeted) else ():
        rows = []
        for budget, at in e.groupby("budget"):
            base = at[at["variant"] == ref]
            for v in variants:
                j = at[at["variant"] == v].merge(base, on=["seed", "task", "doc_id"], suffixes=("_m", "_b"))
                if v == ref or j.empty:
                    continue
                if (j["prompt_hash_m"] != j["prompt_hash_b"]).any():
                    raise ValueError(f"{exp}: {v} and {ref} at M={budget} hold different prompts for the same doc_id")
                per_prompt = j.groupby(["task", "doc_id"])[["correct_m", "correct_b"]].mean()
                c = S.paired_accuracy(per_prompt["correct_m"].to_numpy(), per_prompt["correct_b"].to_numpy())
                rows.append({"exp": exp, "variant": v, "budget": budget, "metric": "accuracy",
                             "unit": f"prompts ({len(per_prompt)})", **c.row()})
        if rows:
            grids.append(S.grid_calls(pd.DataFrame(rows)))
    return pd.concat(grids, ignore_index=True).reindex(columns=PAIRED) if grids else pd.DataFrame(columns=PAIRED)


def corrected(grid: pd.DataFrame) -> bool:
    """Whether a grid's paired rows carry the corrected calls (stats.grid_calls); older committed
    *_paired.csv files have uncorrected percentile-bootstrap calls (tie = the interval holds zero)."""
    return "p_holm" in grid and bool(grid["p_holm"].notna().any())


def _better(metric: str, call: str) -> bool:
    return call == ("higher" if S.HIGHER_IS_BETTER.get(metric, True) else "lower")


def recommendations(paired: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """Per (exp, budget), from the accuracy comparisons against base: the rule(s) to use.

    One or more rules higher than base (corrected call): the highest-accuracy one(s) among them;
    else base with every rule whose call is "tie" (TOST passed: equivalent within the margin).
    Rules called lower and inconclusive ones are listed apart; `also_better_on` names the other
    metrics on which a recommended rule beats base by a call. Grids of the older files (no
    correction) keep their higher/lower calls; their "tie" (an interval holding zero, no
    equivalence test) counts as inconclusive here. A pick whose call fails the cross-grid
    correction (column `scope`) is kept and marked "(exploratory)" in `why`."""
    cols = ["exp", "model", "budget", "recommend", "accuracy", "why", "also_better_on", "also_higher", "lower",
            "inconclusive", "test", "correction"]
    if paired.empty or "call" not in paired:
        return pd.DataFrame(columns=cols)
    acc = points[points["metric"] == "accuracy"].set_index(["exp", "variant", "budget"])["mean"]
    acc = acc[~acc.index.duplicated()].to_dict()
    model = points.groupby("exp")["model"].first() if len(points) else pd.Series(dtype=object)
    rows = []
    for exp, grid in paired.groupby("exp"):
        new = corrected(grid)
        correction = f"Holm over {int(grid['p'].notna().sum())} calls" if new else f"no correction ({len(grid)} calls)"
        for budget, at in grid[grid["metric"] == "accuracy"].groupby("budget"):
            calls = {v: c if new or c != "tie" else "inconclusive" for v, c in zip(at["variant"], at["call"])}
            # a call that fails the cross-grid correction (analysis/cross_grid.py) stays, marked
            scope = dict(zip(at["variant"], at["scope"].fillna(""))) if "scope" in at else {}
            diff = dict(zip(at["variant"], at["diff"]))
            base_acc = acc.get((exp, "base", budget), np.nan)
            value = {v: acc.get((exp, v, budget), base_acc + diff[v]) for v in calls}  # base + diff if no point
            higher = [v for v, c in calls.items() if c == "higher"]
            if higher:
                best = max(value[v] for v in higher)
                pick = [v for v in higher if value[v] == best]
                why = "higher than base" + ("" if new else " (uncorrected)")
                why += " (exploratory)" if any(scope.get(v) == "exploratory" for v in pick) else ""
            else:
                pick = ["base", *sorted(v for v, c in calls.items() if c == "tie")]
                why = "none higher than base: base" + (" and its ties (TOST)" if len(pick) > 1 else "")
            better = []
            for v in pick:
                other = grid[(grid["variant"] == v) & (grid["budget"] == budget) & (grid["metric"] != "accuracy")]
                ms = [m for m, c in zip(other["metric"], other["call"]) if _better(m, c)]
                if ms:
                    better.append(f"{v}: {', '.join(ms)}")
            rows.append({"exp": exp, "model": model.get(exp, grid["model"].iloc[0] if "model" in grid else None),
                         "budget": budget, "recommend": ", ".join(pick),
                         "accuracy": value.get(pick[0], base_acc), "why": why, "also_better_on": "; ".join(better),
                         "also_higher": ", ".join(sorted(set(higher) - set(pick))),
                         "lower": ", ".join(sorted(v for v, c in calls.items() if c == "lower")),
                         "inconclusive": ", ".join(sorted(v for v, c in calls.items() if c == "inconclusive")),
                         "test": "; ".join(at["test"].dropna().unique()) if new and "test" in at else OLD_TEST,
                         "correction": correction})
    return pd.DataFrame(rows, columns=cols)


def replication_calls(data: Data) -> pd.DataFrame:
    """The pre-registered replication's primary family (accuracy, each rule minus base at the same
    budget) from the committed results/replication*_paired.csv (analysis/replication.py), one file per
    Holm family: model, level, method, budget, diff, low, high, p_holm, call, n, with `family_size`
    (the comparisons Holm corrected over) and `source` (the file)."""
    root = data.results.root
    cols = ["model", "level", "method", "budget", "diff", "low", "high", "p_holm", "call", "n", "family_size", "source"]
    frames = []
    for path in sorted(root.glob("replication*_paired.csv")) if root is not None and root.is_dir() else []:
        t = pd.read_csv(path)
        if not {"family", "metric", "model", "method", "call"} <= set(t.columns):
            continue
        prim = t[t["family"] == "primary"]
        frames.append(prim[prim["metric"] == "accuracy"].assign(family_size=len(prim), source=path.name))
    return pd.concat(frames, ignore_index=True).reindex(columns=cols) if frames else pd.DataFrame(columns=cols)
