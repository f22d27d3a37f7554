"""The selection-rule ablation: per budget (equal kept experts), each selector's retained energy,
MoE-output error, next-token KL, teacher-forced log-likelihood change and accuracy, with 95 %
intervals over batching seeds, and paired differences against base. Reads outputs/ only.

    python -m analysis.ablation outputs/ablation_mini results/ablation_mini

Input: the evaluate runs of one experiment folder made with eval.fidelity=true and several
eval.seed values (`make ablation`). Each run gives one value per metric (its summary); the runs of
one (method, budget) differ only in their batching seed.

Written:
  <dest>.csv        one row per (method, budget, metric): mean over seeds, 95 % t-interval, seeds
  <dest>_paired.csv one row per (method, budget, metric): method minus base, paired, with its
                    95 % interval and call (a difference only when the interval excludes zero)
  <dest>.md         both as tables

Intervals:
  - a metric's interval is the t-interval of its per-seed values (n seeds, t with n - 1 degrees of
    freedom): the spread over batchings;
  - accuracy minus base: paired bootstrap over prompts (10 000 resamples) of each prompt's
    difference averaged over the seeds both runs share, plus the exact McNemar p-value over all
    (seed, prompt) pairs (pairs of one prompt under several seeds are not independent: read p as
    descriptive);
  - KL and log-likelihood change minus base: paired bootstrap over decode batches (seed, batch
    index): the same prompts share a decode batch in both runs of one seed;
  - retained energy and output error minus base: t-interval of the per-seed differences.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from analysis.load import variant_label
from analysis.paired import mcnemar_exact

METRICS = ("union_mean", "occupancy_mean", "kept_mean", "energy_retained", "out_error", "kl", "dll", "top1_agree",
           "accuracy")
REF = "base"
ORDER = ("top1_union", "router_sum", "router_sq", "calib_energy", "base", "oracle", "dense")


def runs(root: str | Path) -> pd.DataFrame:
    """One row per finished evaluate run: method, budget, batching seed, its folder and summary."""
    rows = []
    for path in sorted(Path(root).rglob("report.json")):
        rep = json.loads(path.read_text())
        if rep.get("stage") != "evaluate":
            continue
        ev = rep.get("eval", {})
        rows.append({"method": variant_label(rep["method"], rep.get("method_config", {})), "budget": rep["budget"],
                     "seed": ev.get("batch_seed", rep.get("seed")), "dir": str(path.parent),
                     **{m: rep.get("summary", {}).get(m) for m in METRICS}})
    if not rows:
        raise SystemExit(f"no finished evaluate runs under {root}")
    df = pd.DataFrame(rows)
    df["budget"] = df["budget"].astype("Int64")
    return df


def t_interval(values: np.ndarray) -> tuple[float, float, float]:
    """(mean, low, high): 95 % t-interval of the mean; a single value gives a zero-width interval."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if len(v) == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(v.mean())
    if len(v) == 1:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))
    return mean, mean - half, mean + half


def bootstrap(diff: np.ndarray, n_boot: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): percentile bootstrap 95 % interval of the mean of paired differences."""
    d = np.asarray(diff, dtype=float)
    rng = np.random.default_rng(seed)
    boot = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
    low, high = np.percentile(boot, [2.5, 97.5])
    return float(d.mean()), float(low), float(high)


def call(low: float, high: float, diff: float) -> str:
    if np.isnan(low) or low <= 0 <= high:
        return "tie"
    return "higher" if diff > 0 else "lower"


def per_seed_table(df: pd.DataFrame) -> pd.DataFrame:
    out = []
    for (method, budget), g in df.groupby(["method", "budget"], dropna=False):
        for m in METRICS:
            mean, low, high = t_interval(g[m].to_numpy(dtype=float))
            out.append({"method": method, "budget": budget, "metric": m, "mean": mean, "low": low, "high": high,
                        "seeds": int(g[m].notna().sum())})
    return pd.DataFrame(out)


def _samples(run_dir: str) -> pd.DataFrame:
    return pd.read_json(Path(run_dir) / "samples.jsonl", lines=True)


def _batch_means(run_dir: str) -> pd.DataFrame:
    """Per decode batch: per-token KL and log-likelihood change (fidelity_steps.csv; continuous
    batching has none: no fixed batch to teacher-force the dense continuation in)."""
    path = Path(run_dir) / "fidelity_steps.csv"
    if not path.exists():
        return pd.DataFrame(columns=["decode_batch", "kl", "dll"])
    f = pd.read_csv(path)
    g = f.groupby("decode_batch")[["tokens", "kl_sum", "dll_sum"]].sum()
    return pd.DataFrame({"kl": g["kl_sum"] / g["tokens"], "dll": g["dll_sum"] / g["tokens"]}).reset_index()


def paired_table(df: pd.DataFrame, ref: str = REF) -> pd.DataFrame:
    """Each method minus `ref` at the same budget, paired over the seeds (and prompts, batches) both have."""
    out = []
    for budget in sorted(df["budget"].dropna().unique()):
        at = df[df["budget"] == budget]
        base = at[at["method"] == ref].set_index("seed")
        for method, g in at[at["method"] != ref].groupby("method"):
            g = g.set_index("seed")
            seeds = sorted(set(g.index) & set(base.index))
            if not seeds:
                continue
            # accuracy: per prompt, the difference averaged over the shared seeds
            diffs, a_only, b_only = [], 0, 0
            for s in seeds:
                j = _samples(g.loc[s, "dir"]).merge(_samples(base.loc[s, "dir"]), on=["task", "doc_id"],
                                                    suffixes=("_m", "_b"))
                if (j["prompt_hash_m"] != j["prompt_hash_b"]).any():
                    raise ValueError(f"{method} and {ref} at M={budget}, seed {s}: different prompts")
                cm, cb = j["correct_m"].to_numpy(float), j["correct_b"].to_numpy(float)
                a_only += int(((cm > 0.5) & (cb <= 0.5)).sum())
                b_only += int(((cb > 0.5) & (cm <= 0.5)).sum())
                diffs.append(j.set_index(["task", "doc_id"])["correct_m"] - j.set_index(["task", "doc_id"])["correct_b"])
            per_prompt = pd.concat(diffs, axis=1).mean(axis=1).to_numpy()
            d, lo, hi = bootstrap(per_prompt)
            out.append({"method": method, "budget": budget, "metric": "accuracy", "diff": d, "low": lo, "high": hi,
                        "call": call(lo, hi, d), "unit": f"prompts ({len(per_prompt)})", "a_only": a_only,
                        "base_only": b_only, "mcnemar_p": mcnemar_exact(a_only, b_only)})
            # KL, dll: paired over (seed, decode batch)
            pairs = pd.concat([_batch_means(g.loc[s, "dir"]).merge(_batch_means(base.loc[s, "dir"]), on="decode_batch",
                                                                   suffixes=("_m", "_b")) for s in seeds])
            for m in ("kl", "dll") if len(pairs) else ():
                d, lo, hi = bootstrap((pairs[f"{m}_m"] - pairs[f"{m}_b"]).to_numpy())
                out.append({"method": method, "budget": budget, "metric": m, "diff": d, "low": lo, "high": hi,
                            "call": call(lo, hi, d), "unit": f"decode batches ({len(pairs)})"})
            # run-level ratios: over seeds
            for m in ("energy_retained", "out_error"):
                dm = (g.loc[seeds, m].astype(float) - base.loc[seeds, m].astype(float)).to_numpy()
                d, lo, hi = t_interval(dm)
                out.append({"method": method, "budget": budget, "metric": m, "diff": d, "low": lo, "high": hi,
                            "call": call(lo, hi, d), "unit": f"seeds ({len(seeds)})"})
    return pd.DataFrame(out)


def _fmt(mean: float, low: float, high: float, digits: int) -> str:
    if np.isnan(mean):
        return ""
    if np.isnan(low):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


DIGITS = {"union_mean": 2, "occupancy_mean": 2, "kept_mean": 2, "energy_retained": 3, "out_error": 3, "kl": 3,
          "dll": 3, "top1_agree": 3, "accuracy": 3}


def markdown(table: pd.DataFrame, paired: pd.DataFrame) -> str:
    order = {m: i for i, m in enumerate(ORDER)}
    t = table.assign(cell=[_fmt(r["mean"], r["low"], r["high"], DIGITS[r["metric"]]) for _, r in table.iterrows()])
    # no budget: dense, or an adaptive rule (method.coverage) whose kept count is its own
    t["budget"] = [("dense" if r["method"] == "dense" else "none") if pd.isna(r["budget"]) else str(int(r["budget"]))
                   for _, r in t.iterrows()]
    wide = t.pivot_table(index=["budget", "method"], columns="metric", values="cell", aggfunc="first")
    wide = wide[[m for m in METRICS if m in wide.columns]].reset_index()
    wide = wide.sort_values(["budget", "method"], key=lambda c: c.map(lambda v: order.get(v, 99)) if c.name == "method"
                            else c.map(lambda v: {"none": 1e8, "dense": 1e9}.get(v) or int(v))).reset_index(drop=True)
    seeds = int(table["seeds"].max())
    text = [f"Mean over {seeds} batching seeds [95 % t-interval over seeds]; union_mean: distinct experts the "
            "active tokens route to per layer and decode step, before selection; occupancy_mean: requests decoding "
            "per step; kept_mean: experts kept per layer "
            "and step; energy_retained: sum w^2||E||^2 kept / routed; out_error: ||y_budget - y_dense||^2 / "
            "||y_dense||^2 of the MoE output; kl: KL(dense || budget) per token; dll: log-likelihood change per "
            "token of the dense continuation (teacher forcing); top1_agree: greedy tokens equal.\n",
            wide.to_markdown(index=False)]
    if not paired.empty:
        p = paired.assign(cell=[f"{r['diff']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}] {r['call']}"
                                for _, r in paired.iterrows()])
        pw = p.pivot_table(index=["budget", "method"], columns="metric", values="cell", aggfunc="first").reset_index()
        pw = pw[["budget", "method", *[m for m in ("energy_retained", "out_error", "kl", "dll", "accuracy")
                                       if m in pw.columns]]]
        pw = pw.sort_values(["budget", "method"], key=lambda c: c.map(lambda v: order.get(v, 99))
                            if c.name == "method" else c).reset_index(drop=True)
        acc = paired[paired["metric"] == "accuracy"][["budget", "method", "a_only", "base_only", "mcnemar_p"]]
        acc = acc.assign(mcnemar_p=acc["mcnemar_p"].map(lambda v: f"{v:.2g}"))
        text += [f"\nEach method minus {REF}, paired, [95 % interval] and call (tie unless the interval excludes "
                 "zero): accuracy by prompt bootstrap (per-prompt difference averaged over seeds), KL and dll by "
                 "decode-batch bootstrap, energy and error by t-interval over seeds.\n", pw.to_markdown(index=False),
                 f"\nAccuracy, discordant (seed, prompt) pairs: method right and {REF} wrong (a_only), the reverse "
                 "(base_only), exact McNemar p (pairs of one prompt under several seeds are not independent).\n",
                 acc.to_markdown(index=False)]
    return "\n".join(text) + "\n"


def made_by(root: str | Path, dest: str | Path, df: pd.DataFrame) -> str:
    """The .md header: the commands that made the runs under `root` (its folder name is the experiment's
    exp_name, e.g. outputs/ablation_mini_olmoe) and this table."""
    exp = Path(root).name
    if exp.startswith("rules_"):  # issue 10's rules: several sweeps (conf/experiment/rules_*.yaml)
        return (f"Made by `make rules` (the sweeps listed in conf/experiment/{exp}.yaml, under {root}), then "
                f"`python -m analysis.ablation {root} {dest}`.\n\n")
    if exp.startswith("quality_seeds_"):  # every selector x budget (conf/experiment/quality_seeds_*.yaml)
        make = "make quality-seeds" + ("" if exp == "quality_seeds_mini" else f" QS_EXP={exp}")
        return (f"Made by `{make}`: the runs of `python run.py -m experiment={exp}` (and `method=dense budget=null`, "
                f"`method=oea method.k0=1,2 budget=null`) under {root}, then `python -m analysis.ablation {root} "
                f"{dest}`.\n\n")
    make = "make ablation" + ("" if exp == "ablation_mini" else f" ABLATION_EXP={exp}")
    seeds = ",".join(str(int(s)) for s in sorted(df["seed"].dropna().unique()))
    return (f"Made by `{make}`: the runs of `python run.py -m experiment={exp} eval.seed={seeds}` (and `method=dense "
            f"budget=null`) under {root}, then `python -m analysis.ablation {root} {dest}`.\n\n")


def main(root: str, dest: str) -> None:
    df = runs(root)
    table = per_seed_table(df)
    paired = paired_table(df)
    out = Path(dest)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out.with_suffix(".csv"), index=False)
    paired.to_csv(out.parent / f"{out.name}_paired.csv", index=False)
    text = markdown(table, paired)
    out.with_suffix(".md").write_text(made_by(root, dest, df) + text)
    print(text)


if __name__ == "__main__":
    main(*(sys.argv[1:3] if len(sys.argv) > 2 else ("outputs/ablation_mini", "results/ablation_mini")))
