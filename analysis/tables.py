"""Figure-ready tables from the loader's frames (analysis/load.py): one row per plotted point.

Quality points come from outputs/ (run folders, aggregated here over batching seeds) or from the
committed results/ (per-run tables, or per-seed aggregates already). An experiment found in both
is taken from the source holding more runs (outputs/ on a tie: it has per-request records), so a
sweep still being written to outputs/ does not hide its finished, committed version.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.ablation import bootstrap, call, t_interval
from analysis.load import Data

METRICS = ("accuracy", "kept_mean", "union_mean", "energy_retained", "out_error", "kl", "dll", "top1_agree")
POINT = ["exp", "model", "variant", "budget", "batch_size"]
REASSIGN = ("base", "base+drop", "base+similar")  # backfill (base's default) and the other modes


def aggregate(runs: pd.DataFrame) -> pd.DataFrame:
    """Per point (exp, model, variant, budget, batch size) and metric: mean over its runs (batching
    seeds) with the 95 % t-interval, n runs. One run: low and high are NaN (no interval)."""
    cols = [*POINT, "metric", "mean", "low", "high", "n"]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for key, g in runs.groupby(POINT, dropna=False):
        for m in METRICS:
            if m in g and g[m].notna().any():
                mean, low, high = t_interval(g[m].to_numpy(dtype=float))
                rows.append({**dict(zip(POINT, key)), "metric": m, "mean": mean, "low": low, "high": high,
                             "n": int(g[m].notna().sum())})
    return pd.DataFrame(rows, columns=cols)


def _runs_per_exp(points: pd.DataFrame) -> pd.Series:
    acc = points[points["metric"] == "accuracy"]
    return acc.groupby("exp")["n"].sum()


def quality_points(data: Data) -> pd.DataFrame:
    """Every quality point of every experiment, each experiment from its fuller source, with
    `source` (outputs | results) and `hardware` (where the runs recorded it)."""
    ev = data.outputs.runs
    ev = ev[ev["stage"] == "evaluate"] if len(ev) else ev
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


def tradeoff(points: pd.DataFrame, speed: pd.DataFrame, batch_size: int = 16) -> pd.DataFrame:
    """Accuracy joined to end-to-end decode speed-up over dense by (model, variant, budget) at one
    batch size (graph-mode timings; `fixed`, a timing control, left out). A row has accuracy, speed-up
    or both: has_quality / has_speed say which; each model's quality side is its primary_exp."""
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
                           "hardware"]).rename(columns={"kept_mean": "kept_timed", "hardware": "speed_hardware",
                                                        "speedup_vs_dense": "speedup"})
    for df in (qual, s):
        df["budget"] = pd.to_numeric(df["budget"], errors="coerce").astype("Int64")
    out = qual.merge(s, on=["model", "variant", "budget"], how="outer")
    out["has_quality"] = out["accuracy"].notna()
    out["has_speed"] = out["speedup"].notna()
    out["kept"] = out["kept_mean"].fillna(out["kept_timed"])
    return out.sort_values(["model", "variant", "budget"]).reset_index(drop=True)


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
                     "union": r["union_mean"], "experts": r.get("num_experts"), "source": "throughput"})
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
    """Kept experts per (layer, decode step) of the adaptive-budget runs in outputs/ (method.coverage
    or budget_split), one run per (exp, variant, budget): the lowest batching seed. Steps are in run
    order over all decode batches, so they are not averaged over seeds (other seeds batch other prompts)."""
    runs = data.outputs.runs
    cols = ["exp", "model", "variant", "budget", "batch_size", "seed", "layer", "step", "kept", "tokens"]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    adaptive = runs[(runs["stage"] == "evaluate") & (runs["coverage"].notna() | runs["budget_split"].isin(["sensitivity"]))]
    adaptive = adaptive.sort_values("seed").drop_duplicates(["exp", "variant", "budget"])
    steps = data.outputs.table("steps", adaptive) if len(adaptive) else pd.DataFrame()
    if steps.empty:
        return pd.DataFrame(columns=cols)
    steps = steps[steps["decode"].astype(bool)] if "decode" in steps else steps
    return steps.reindex(columns=cols).reset_index(drop=True)


def paired_accuracy(samples: pd.DataFrame, variants: list[str], ref: str = "base") -> pd.DataFrame:
    """Accuracy of each variant minus `ref` at the same budget, paired over prompts: per prompt the
    difference averaged over the batching seeds both ran, bootstrap 95 % interval, call."""
    rows = []
    if samples.empty:
        return pd.DataFrame(columns=["exp", "variant", "budget", "diff", "low", "high", "call", "prompts"])
    for (exp, budget), at in samples[samples["budget"].notna()].groupby(["exp", "budget"]):
        base = at[at["variant"] == ref]
        for v in variants:
            other = at[at["variant"] == v]
            j = other.merge(base, on=["seed", "task", "doc_id"], suffixes=("_m", "_b"))
            if v == ref or j.empty:
                continue
            if (j["prompt_hash_m"] != j["prompt_hash_b"]).any():
                raise ValueError(f"{exp}: {v} and {ref} at M={budget} hold different prompts for the same doc_id")
            per_prompt = (j["correct_m"] - j["correct_b"]).groupby([j["task"], j["doc_id"]]).mean().to_numpy()
            d, lo, hi = bootstrap(per_prompt)
            rows.append({"exp": exp, "variant": v, "budget": budget, "diff": d, "low": lo, "high": hi,
                         "call": call(lo, hi, d), "prompts": len(per_prompt)})
    return pd.DataFrame(rows, columns=["exp", "variant", "budget", "diff", "low", "high", "call", "prompts"])
