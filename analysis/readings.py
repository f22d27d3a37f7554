"""The README's readings of the quality grids, written from the committed paired tables so the text
cannot drift from the data (analysis/claims.py registers them as generated blocks).

    text = grid_reading("results/ablation_mini")       # one grid: every call against base, by metric
    text = headline(["results/ablation_mini", ...], intro)  # a README headline bullet

Each reading says which test made the calls, how many calls the grid has and the correction, the
equivalence margins (no accuracy tie is called: the prompts an accuracy tie would need are
stated instead), and lists the rules per call; a call that fails the cross-grid correction
(column `scope`, analysis/cross_grid.py) is marked "exploratory". It states numbers only as they are
in the <grid>_paired.csv (analysis/ablation.py writes it, analysis/cross_grid.py adds its cross-grid
columns). Reads results/ only.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis import stats as S

CALLS = ("higher", "lower", "tie", "inconclusive")
NAMES = {"accuracy": "accuracy", "kl": "KL", "dll": "log-likelihood change", "out_error": "MoE-output error",
         "energy_retained": "retained energy"}


def load(grid: str | Path) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(per-point table, paired table, the pool line of its .md) of one committed grid."""
    g = Path(grid)
    md = g.with_suffix(".md").read_text()
    pool = next((line for line in md.splitlines() if line.startswith("Model ")), "")
    return pd.read_csv(g.with_suffix(".csv")), pd.read_csv(g.parent / f"{g.name}_paired.csv"), pool


def exploratory(r: pd.Series) -> bool:
    """Whether a row's call fails the cross-grid correction (analysis/cross_grid.py)."""
    return r.get("scope") == "exploratory"


def _cell(r: pd.Series, digits: int = 3) -> str:
    return (f"{r['method']} at M={int(r['budget'])} ({r['diff']:+.{digits}f} [{r['low']:+.{digits}f}, "
            f"{r['high']:+.{digits}f}]{', exploratory' if exploratory(r) else ''})")


def _by_call(p: pd.DataFrame, metric: str) -> dict[str, list[str]]:
    """Rules per verdict against base, in the metric's own sense: better, worse, tie, inconclusive."""
    m = p[(p["metric"] == metric) & (p["call"] != S.EXCLUDED)].sort_values(["budget", "method"])
    better = "higher" if S.HIGHER_IS_BETTER[metric] else "lower"
    out: dict[str, list[str]] = {"better": [], "worse": [], "tie": [], "inconclusive": []}
    for _, r in m.iterrows():
        if r["call"] in ("higher", "lower"):
            out["better" if r["call"] == better else "worse"].append(_cell(r, 3 if metric != "kl" else 4))
        else:
            out[r["call"]].append(f"{r['method']} at M={int(r['budget'])}" + (" (exploratory)" if exploratory(r) else ""))
    return out


def _verdicts(p: pd.DataFrame, metric: str, list_inconclusive: bool = True) -> str:
    v = _by_call(p, metric)
    parts = [f"{k} than base: {', '.join(v[k])}" for k in ("better", "worse") if v[k]]
    if v["tie"]:
        parts.append(f"tie: {', '.join(v['tie'])}")
    if v["inconclusive"]:
        parts.append(f"inconclusive: {', '.join(v['inconclusive'])}" if list_inconclusive else
                     f"{len(v['inconclusive'])} inconclusive")
    return "; ".join(parts) if parts else "no comparison"


def method_line(p: pd.DataFrame) -> str:
    called = p[p["call"] != S.EXCLUDED]
    n = int(called["p"].notna().sum())
    counts = called["call"].value_counts().reindex(list(CALLS), fill_value=0)
    metrics = set(called["metric"])
    ties = [m for m in S.HIGHER_IS_BETTER if m in metrics and m in S.TIE_METRICS]
    left = sorted(set(p.loc[p["call"] == S.EXCLUDED, "metric"]))
    line = (f"{n} calls, Holm-corrected at {S.ALPHA:g} ({counts['higher']} higher, {counts['lower']} lower, "
            f"{counts['tie']} tie, {counts['inconclusive']} inconclusive)")
    if left:
        line += f", {' and '.join(NAMES[m] for m in left)} reported, not called (it mirrors KL)"
    if ties:
        line += ("; tie means the equivalence test passed against the margin ("
                 + ", ".join(f"{NAMES[m]} ±{S.MARGINS[m]:g}" for m in ties) + ")")
    if "scope" in p:
        ex = int((p["scope"] == "exploratory").sum())
        line += (f"; {ex} of the {int(counts[['higher', 'lower', 'tie']].sum())} calls fail the cross-grid "
                 "correction (exploratory, `results/cross_grid.md`)")
    return line


def accuracy_tie_line(p: pd.DataFrame) -> str:
    """What an accuracy tie would take in this grid: the prompts for 80 % power of the TOST at the
    grid's strictest Holm level and the accuracy rows' median discordant fraction."""
    if "a_only" not in p:
        return ""
    acc = p[(p["metric"] == "accuracy") & p["a_only"].notna()]
    m = int((p["call"] != S.EXCLUDED).sum())
    if acc.empty or m == 0:
        return ""
    disc = float(((acc["a_only"] + acc["b_only"]) / acc["n"]).median())
    need = S.equivalence_n(max(disc, 1e-4), alpha=S.ALPHA / m)
    return (f"No accuracy tie is called: at this grid's median discordance ({100 * disc:.1f} % of prompts) an "
            f"accuracy tie within ±{S.MARGINS['accuracy']:g} would need about {need:,} prompts (80 % power at the "
            f"grid's strictest Holm level), against "
            f"{int(acc['n'].iloc[0]):,} here; an accuracy comparison that does not reject is inconclusive.")


def grid_reading(grid: str | Path) -> str:
    """Every call of one grid against base, metric by metric, with its test and correction."""
    table, p, pool = load(grid)
    name = Path(grid).name
    acc = table[(table["metric"] == "accuracy")]
    dense = acc[acc["method"] == "dense"]["mean"]
    mdd = p[p["call"] != S.EXCLUDED].groupby("metric")["mdd"].median()
    lines = [f"`results/{name}_paired.csv` ({pool.rstrip('.')}; {method_line(p)}). "
             + (f"Dense accuracy {dense.iloc[0]:.3f}. " if len(dense) else "")
             + "Median minimal detectable difference (80 % power at the strictest Holm level): "
             + ", ".join(f"{NAMES[m]} {mdd[m]:.3f}" for m in S.HIGHER_IS_BETTER if m in mdd.index) + ". "
             + accuracy_tie_line(p)]
    for metric in ("accuracy", "kl", "out_error", "energy_retained"):
        if metric in set(p["metric"]):
            lines.append(f"- **{NAMES[metric]}**: {_verdicts(p, metric)}.")
    return "\n".join(lines)


def headline(grids: list[str | Path], intro: str, metrics: tuple[str, ...] = ("accuracy", "kl")) -> str:
    """A README headline bullet: `intro`, then the calls of each grid in `metrics`, one line per model."""
    rows = []
    for grid in grids:
        _, p, pool = load(grid)
        model = pool.split(",")[0].replace("Model ", "")
        calls = " ".join(f"{NAMES[m][0].upper() + NAMES[m][1:] if i else NAMES[m]}: {_verdicts(p, m, False)}."
                         for i, m in enumerate(metrics))
        rows.append(f"  - `{model}` (`results/{Path(grid).name}.md`, {method_line(p).split(' (')[0]}): {calls}")
    return intro + "\n" + "\n".join(rows)


def prompts_per_run(grids: list[str | Path]) -> str:
    """'1,050' (or '1,050 and 700'): prompts behind each accuracy call of the grids."""
    sizes = {int(load(g)[1].query("metric == 'accuracy'")["n"].iloc[0]) for g in grids}
    return " and ".join(f"{s:,}" for s in sorted(sizes))


def cross_text(results: str | Path) -> str:
    """The cross-grid correction as a headline states it, from results/cross_grid.csv."""
    f = pd.read_csv(Path(results) / "cross_grid.csv")
    fam = f[(f["excluded"].fillna("") == "") & f["p"].notna()]
    return (f"a call marked exploratory fails the cross-grid correction (Holm over the "
            f"{int(fam['p_headline'].notna().sum())} comparisons the headline bullets report, Benjamini–Hochberg "
            f"over all {len(fam)} committed comparisons: `results/cross_grid.md`)")
