"""The README's readings of the quality grids, written from the committed paired tables so the text
cannot drift from the data (analysis/claims.py registers them as generated blocks).

    text = grid_reading("results/ablation_mini")       # one grid: every call against base, by metric
    text = headline(["results/ablation_mini", ...], intro)  # a README headline bullet

Each reading says which test made the calls, how many calls the grid has and the correction, the
equivalence margins, and lists the rules per call; it states numbers only as they are in the
<grid>_paired.csv (analysis/ablation.py writes it). Reads results/ only.
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


def _cell(r: pd.Series, digits: int = 3) -> str:
    return f"{r['method']} at M={int(r['budget'])} ({r['diff']:+.{digits}f} [{r['low']:+.{digits}f}, {r['high']:+.{digits}f}])"


def _by_call(p: pd.DataFrame, metric: str) -> dict[str, list[str]]:
    """Rules per verdict against base, in the metric's own sense: better, worse, tie, inconclusive."""
    m = p[p["metric"] == metric].sort_values(["budget", "method"])
    better = "higher" if S.HIGHER_IS_BETTER[metric] else "lower"
    out: dict[str, list[str]] = {"better": [], "worse": [], "tie": [], "inconclusive": []}
    for _, r in m.iterrows():
        if r["call"] in ("higher", "lower"):
            out["better" if r["call"] == better else "worse"].append(_cell(r, 3 if metric != "kl" else 4))
        else:
            out[r["call"]].append(f"{r['method']} at M={int(r['budget'])}")
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
    n = int(p["p"].notna().sum())
    counts = p["call"].value_counts().reindex(list(CALLS), fill_value=0)
    margins = ", ".join(f"{NAMES[m]} ±{S.MARGINS[m]:g}" for m in S.HIGHER_IS_BETTER if m in set(p["metric"]))
    return (f"{n} calls, Holm-corrected at {S.ALPHA:g} ({counts['higher']} higher, {counts['lower']} lower, "
            f"{counts['tie']} tie, {counts['inconclusive']} inconclusive); tie means the equivalence test "
            f"passed against the margin ({margins})")


def grid_reading(grid: str | Path) -> str:
    """Every call of one grid against base, metric by metric, with its test and correction."""
    table, p, pool = load(grid)
    name = Path(grid).name
    acc = table[(table["metric"] == "accuracy")]
    dense = acc[acc["method"] == "dense"]["mean"]
    mdd = p.groupby("metric")["mdd"].median()
    lines = [f"`results/{name}_paired.csv` ({pool.rstrip('.')}; {method_line(p)}). "
             + (f"Dense accuracy {dense.iloc[0]:.3f}. " if len(dense) else "")
             + "Median minimal detectable difference (80 % power at the strictest Holm level): "
             + ", ".join(f"{NAMES[m]} {mdd[m]:.3f}" for m in S.HIGHER_IS_BETTER if m in mdd.index) + "."]
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
