"""A quality grid: per budget (equal kept experts), each selector's retained energy, MoE-output
error, next-token KL, teacher-forced log-likelihood change and accuracy, with 95 % intervals, and
paired comparisons against base with one call each. Reads outputs/ only.

    python -m analysis.ablation outputs/ablation_mini results/ablation_mini

Input: the evaluate runs of one experiment folder made with eval.fidelity=true: one model, one
prompt pool (task and task.limit), one or several batching seeds (eval.seed). Runs that differ in
model, task or limit are refused: pooling them would average different prompts as replicates.

Written:
  <dest>.csv        one row per (method, budget, metric): value over the run(s), 95 % interval
  <dest>_paired.csv one row per (method, budget, metric): method minus base, paired, with its
                    interval, p, TOST p, Holm-adjusted both, call and minimal detectable difference
  <dest>.md         both as tables
Both tables end in the column `engine`: the decode engine of the runs (analysis/engines.py; a folder
of two engines is refused, exit 2).

Tests and calls: analysis/stats.py (its docstring). In short: accuracy by the exact McNemar test
(several seeds: a permutation test over prompts, seeds nested in the prompt); KL and dll by a
cluster bootstrap over prompts, tokens weighted; energy and output error by a cluster bootstrap over
decode batches (their unit: the whole batch's MoE output); Holm over all calls of the grid; "tie"
only where the equivalence test against stats.MARGINS passes, else "inconclusive".
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import records as R
from analysis import stats as S
from analysis.engines import one_engine, with_engine
from analysis.load import variant_label  # noqa: F401 - re-exported: tests and notebooks import it from here

METRICS = ("union_mean", "occupancy_mean", "kept_mean", "energy_retained", "out_error", "kl", "dll", "top1_agree",
           "accuracy")
PAIRED = ("accuracy", "kl", "dll", "out_error", "energy_retained")
REF = "base"
ORDER = ("top1_union", "router_sum", "router_sq", "calib_energy", "base", "oracle", "dense")
POOL = tuple(R.POOL)  # what makes two runs score the same prompts


def runs(root: str | Path) -> pd.DataFrame:
    """One row per finished evaluate run: method, budget, batching seed, model and prompt pool,
    its folder and summary (analysis.records.runs). Refuses a folder mixing models, prompt pools or engines."""
    df = R.runs(root, METRICS)
    pools = df[list(POOL)].astype(str).drop_duplicates()
    if len(pools) > 1:
        listing = "; ".join(", ".join(f"{k}={v}" for k, v in r.items()) for r in pools.to_dict("records"))
        raise SystemExit(f"error: {root} holds runs of {len(pools)} prompt pools, models or engines ({listing}): one "
                         f"grid is one model on one prompt pool, decoded by one engine; analyse each in its own folder")
    return df


def prompts_of(g: pd.DataFrame) -> pd.DataFrame:
    """Per prompt over the runs (seeds) of one point (rows of runs()): correct averaged, fidelity sums added."""
    return R.per_prompt(R.of_runs(g)[0])


def run_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (method, budget, metric): the value over the point's runs and its 95 % interval."""
    prompts, batches = R.of_runs(df)
    out = []
    for (method, budget), g in df.groupby(["method", "budget"], dropna=False):
        row = {"method": method, "budget": budget, "seeds": len(g)}
        seeds = list(g["seed"])
        p = R.per_prompt(R.at_point(prompts, method, budget, seeds))
        values = {"accuracy": (*S.accuracy_interval(p["correct"].to_numpy()), "prompts")}
        if "kl_sum" in p and p["fidelity_tokens"].sum() > 0:
            for m, col in (("kl", "kl_sum"), ("dll", "dll_sum"), ("top1_agree", "agree_sum")):
                values[m] = (*S.ratio_interval(p[col].to_numpy(), p["fidelity_tokens"].to_numpy()), "prompts")
        b = R.batch_arrays(R.at_point(batches, method, budget, seeds))
        for m, num, den in (("energy_retained", "energy_kept", "energy_total"), ("out_error", "out_err", "out_dense")):
            if b and len(b[num]) > 1 and b[den].sum() > 0:
                values[m] = (*S.layer_ratio_interval(b[num], b[den]), "decode batches")
        for m in METRICS:
            mean, low, high, unit = values.get(m, (g[m].astype(float).mean(), np.nan, np.nan, "runs"))
            out.append({**row, "metric": m, "mean": mean, "low": low, "high": high, "unit": unit})
    return pd.DataFrame(out)


def paired_table(df: pd.DataFrame, ref: str = REF) -> pd.DataFrame:
    """Each method minus `ref` at the same budget over the runs of `df` (runs()): paired_from_records
    over their records."""
    return paired_from_records(*R.of_runs(df), ref=ref)


def paired_from_records(prompts: pd.DataFrame, batches: pd.DataFrame, ref: str = REF) -> pd.DataFrame:
    """Each method minus `ref` at the same budget over the seeds both ran (prompts, decode batches
    paired), then the grid's calls (stats.grid_calls: one Holm family, dll reported, not called).
    `prompts`, `batches`: a grid's records (analysis/records.py), from its runs or its records file."""
    rows = []
    for budget in sorted(prompts["budget"].dropna().unique()):
        at = prompts[prompts["budget"] == budget]
        base = at[at["method"] == ref]
        for method, g in at[at["method"] != ref].groupby("method"):
            seeds = sorted(set(g["seed"]) & set(base["seed"]))
            if not seeds:
                continue
            pm, pb = R.per_prompt(g[g["seed"].isin(seeds)]), R.per_prompt(base[base["seed"].isin(seeds)])
            j = pm.add_suffix("_m").join(pb.add_suffix("_b"), how="inner")
            if len(j) != len(pm) or len(j) != len(pb) or (j["prompt_hash_m"] != j["prompt_hash_b"]).any():
                raise ValueError(f"{method} and {ref} at M={budget}: different prompts; not a paired comparison")
            at_point = {"method": method, "budget": budget}
            rows.append({**at_point, "metric": "accuracy", "unit": f"prompts ({len(j)})",
                         **S.paired_accuracy(j["correct_m"].to_numpy(float), j["correct_b"].to_numpy(float)).row()})
            if "kl_sum_m" in j and j["fidelity_tokens_m"].sum() > 0:
                for m in ("kl", "dll"):
                    c = S.paired_ratio(j[f"{m}_sum_m"].to_numpy(float), j[f"{m}_sum_b"].to_numpy(float),
                                       j["fidelity_tokens_m"].to_numpy(float), m)
                    rows.append({**at_point, "metric": m, "unit": f"prompts ({len(j)})", **c.row()})
            bm = R.batch_arrays(R.at_point(batches, method, budget, seeds))
            bb = R.batch_arrays(R.at_point(batches, ref, budget, seeds))
            if bm and bb and np.array_equal(bm["keys"], bb["keys"]):
                for m, num, den in (("out_error", "out_err", "out_dense"), ("energy_retained", "energy_kept",
                                                                             "energy_total")):
                    c = S.paired_ratio(bm[num], bb[num], bm[den], m, den_b_P=bb[den])
                    rows.append({**at_point, "metric": m, "unit": f"decode batches ({len(bm['keys'])})", **c.row()})
    if not rows:
        return pd.DataFrame()
    return S.grid_calls(pd.DataFrame(rows))


def _fmt(mean: float, low: float, high: float, digits: int) -> str:
    if np.isnan(mean):
        return ""
    if np.isnan(low):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


DIGITS = {"union_mean": 2, "occupancy_mean": 2, "kept_mean": 2, "energy_retained": 3, "out_error": 3, "kl": 3,
          "dll": 3, "top1_agree": 3, "accuracy": 3}


def _call_cell(r) -> str:
    """diff [interval] call: the 95 % interval beside a difference test, the 90 % one beside a tie
    (the TOST at ALPHA passes iff it lies within the margin); exploratory where the call fails the
    cross-grid correction (analysis/cross_grid.py)."""
    if r["call"] == "tie":
        low, high = S.tost_interval(r["diff"], r["se"])
        cell = f"{r['diff']:+.3f} [90 %: {low:+.3f}, {high:+.3f}] tie"
    else:
        cell = f"{r['diff']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}] {r['call']}"
    return cell + (" (exploratory)" if r.get("scope") == "exploratory" else "")


def calls_summary(paired: pd.DataFrame) -> str:
    """How many calls the grid's readings rest on, the correction, margins and detectable sizes."""
    called = paired[paired["call"] != S.EXCLUDED]
    n = int(called["p"].notna().sum())
    counts = called["call"].value_counts().reindex(["higher", "lower", "tie", "inconclusive"], fill_value=0)
    mdd = called.groupby("metric")["mdd"].median()
    margins = ", ".join(f"{m} {S.MARGINS[m]:g}" for m in PAIRED if m in mdd.index and m in S.TIE_METRICS)
    sizes = ", ".join(f"{m} {mdd[m]:.3g}" for m in PAIRED if m in mdd.index)
    left = sorted(set(paired.loc[paired["call"] == S.EXCLUDED, "metric"]))
    text = (f"{n} calls, Holm-corrected together at {S.ALPHA:g} (differences one family, equivalence tests "
            f"another): {counts['higher']} higher, {counts['lower']} lower, {counts['tie']} tie, "
            f"{counts['inconclusive']} inconclusive"
            + (f"; {', '.join(left)} reported, not called (it mirrors {S.MIRRORS.get(left[0], 'another metric')})"
               if left else "")
            + (f". Equivalence margins (a tie is called for {', '.join(m for m in S.TIE_METRICS if m in mdd.index)} "
               f"only, not for accuracy): {margins}" if margins else ". No tie is called for accuracy")
            + f". Median minimal detectable difference (80 % power at the strictest Holm level): {sizes}.")
    if "scope" in paired:
        ex = int((paired["scope"] == "exploratory").sum())
        text += (f" Cross-grid (`python -m analysis.cross_grid`, results/cross_grid.md): {ex} of the "
                 f"{int(counts[['higher', 'lower', 'tie']].sum())} calls fail it and are marked exploratory.")
    return text


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
    text = [(f"Value over {seeds} batching seed(s) [95 % interval: accuracy Wilson (one seed) or prompt bootstrap; "
            "kl, dll, top1_agree prompt bootstrap, tokens weighted; energy_retained, out_error decode-batch "
            "bootstrap]; union_mean: distinct experts the active tokens route to per layer and decode step, before "
            "selection; occupancy_mean: requests decoding per step; kept_mean: experts kept per layer and step; "
            "energy_retained: sum w^2||E||^2 kept / routed; out_error: ||y_budget - y_dense||^2 / ||y_dense||^2 of "
            "the MoE output; kl: KL(dense || budget) per token; dll: log-likelihood change per token of the dense "
            "continuation (teacher forcing); top1_agree: greedy tokens equal.\n"), wide.to_markdown(index=False)]
    if not paired.empty:
        pw = paired.assign(cell=[_call_cell(r) for _, r in paired.iterrows()]).pivot_table(
            index=["budget", "method"], columns="metric", values="cell", aggfunc="first").reset_index()
        pw = pw[["budget", "method", *[m for m in PAIRED if m in pw.columns]]]
        pw = pw.sort_values(["budget", "method"], key=lambda c: c.map(lambda v: order.get(v, 99))
                            if c.name == "method" else c).reset_index(drop=True)
        cols = ["budget", "method", "a_only", "b_only", "p", "p_holm", *[c for c in ("q", "p_headline") if c in paired],
                "mdd", *[c for c in ("scope",) if c in paired]]
        acc = paired[paired["metric"] == "accuracy"][cols]
        acc = acc.rename(columns={"b_only": f"{REF}_only"}).assign(
            **{c: acc[c].map(lambda v: "" if pd.isna(v) else f"{v:.2g}")
               for c in ("p", "p_holm", "q", "p_headline", "mdd") if c in acc})
        text += [f"\nEach method minus {REF}, paired, [95 % interval] and call (analysis/stats.py): higher/lower "
                 "where the Holm-corrected test of no difference rejects; tie where it does not and the "
                 "Holm-corrected equivalence test (TOST) against the margin passes, shown with the 90 % interval "
                 "that test corresponds to; else inconclusive; excluded: reported, not called. "
                 + calls_summary(paired) + "\n", pw.to_markdown(index=False),
                 (f"\nAccuracy, discordant prompts: method right and {REF} wrong (a_only), the reverse "
                  f"({REF}_only); exact McNemar p, Holm-adjusted over the grid"
                  + (", q: Benjamini-Hochberg over every committed comparison, p_headline: Holm over the README's "
                     "headline family (results/cross_grid.md)" if "q" in paired else "")
                  + "; mdd: minimal detectable difference (80 % power at the grid's strictest Holm level). The "
                  "intervals above are Tango's 95 % score intervals: they invert the asymptotic score test, which "
                  "the exact test behind the call is more conservative than, so an interval can exclude 0 where "
                  "p is a little above 0.05 (4-6 discordant prompts one way, or about 190 split 107/80).\n"),
                 acc.to_markdown(index=False)]
    return "\n".join(text) + "\n"


def made_by(root: str | Path, dest: str | Path, df: pd.DataFrame) -> str:
    """The .md header: the commands that made the runs under `root` (its folder name is the experiment's
    exp_name, e.g. outputs/ablation_mini_olmoe) and this table."""
    exp = Path(root).name
    if exp.startswith("rules_"):  # issue 10's rules: several sweeps (conf/experiment/rules_*.yaml)
        make = "make rules" + ("" if exp == "rules_mini" else f" RULES_EXP={exp}")
        return (f"Made by `{make}` (the Makefile's `rules` sweeps of experiment={exp}, under {root}), then "
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
    engine = one_engine(df, f"the grid of {root}")
    table = with_engine(run_table(df), engine)
    paired = with_engine(paired_table(df), engine)
    out = Path(dest)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out.with_suffix(".csv"), index=False)
    paired.to_csv(out.parent / f"{out.name}_paired.csv", index=False)
    text = markdown(table, paired)
    pool = df.iloc[0]
    where = (f"Model {pool['model']}, prompt pool: task {pool['tasks']}, task.limit={pool['limit']} per task, "
             f"{len(df)} runs. Decode engine: `{engine}` (analysis/engines.py).\n\n")
    out.with_suffix(".md").write_text(made_by(root, dest, df) + where + text)
    print(text)


if __name__ == "__main__":
    main(*(sys.argv[1:3] if len(sys.argv) > 2 else ("outputs/ablation_mini", "results/ablation_mini")))
