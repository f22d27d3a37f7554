"""Every committed comparison in one family: the cross-grid correction (issue 27).

    python -m analysis.cross_grid            # re-test the committed tables, add the cross-grid columns, re-render
    python -m analysis.cross_grid --check    # list the committed tables whose columns are out of date (exit 1)

Each grid's calls are Holm-corrected over that grid (analysis/stats.py). The grids share prompt
pools and the README's headlines draw on many of them, so two corrections over grids are added:

  q           Benjamini-Hochberg over every difference test of every committed comparison table
              (FAMILY, below): the false discovery rate over all of them;
  q_tost      the same over every equivalence test that can make a tie (stats.TIE_METRICS);
  p_headline  Holm over the HEADLINE family: every comparison of the tables and metrics the README's
              headline bullets report (inconclusive ones included: the family is what was tested,
              not what came out significant), nan outside it; p_tost_headline its TOSTs;
  scope       "confirmed" where the grid's call (higher, lower, tie) also passes q (q_tost for a
              tie) at ALPHA, and p_headline where the row is in the headline family; "exploratory"
              where it does not; empty for inconclusive and excluded rows.

Rows excluded from their grid's family (null by construction, or a metric that mirrors another)
stay out of every family. Before the cross-grid step each table's grid calls are re-made from its
own committed p-values by stats.grid_calls (so the exclusions and the no-accuracy-tie rule of issue
27 apply to committed tables without re-running a model); admission tables by
analysis.admission.from_table, the static-continuous differences in differences by analysis.did.

FAMILY: results/*_paired.csv, *_batching.csv, *_did.csv, admission_*.csv and quality_mini_diff.csv,
and the single comparisons kept as `python -m analysis.paired` transcripts (MD_PAIRED). A grid
named in PREREGISTERED keeps its own pre-registered family and calls (they are not re-made here),
and its rows count in q like every other comparison; its table gets the cross-grid columns in
its .csv only (its .md is analysis/replication.py's). Writes each table back
(.csv and its .md re-rendered) and results/cross_grid.{csv,md}, every comparison with its columns.

Engines (issue 40): every comparison is between runs of one table, and a table is one decode
engine's (its `engine` column, refused where it holds two: analysis/engines.py one_engine). The
family pools comparisons of several engines, as a correction for testing many hypotheses may:
results/cross_grid.csv names each row's engine (`engine`, the last column) and cross_grid.md
counts the comparisons per engine. A table written back keeps its `engine` column, the last.
Reads and writes results/ only.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import stats as S
from analysis.engines import COLUMN as ENGINE
from analysis.engines import (
    LEGACY_GRIDS,
    REPLICATION_AS_COMMITTED,
    one_engine,
    rule_engine,
    with_engine,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
# single comparisons committed as `python -m analysis.paired A B` transcripts (no CSV)
MD_PAIRED = ("quality_mini_olmoe_paired.md", "routing/paired_oea_mini.md")
# their engine: each compares two runs of a static grid on the CPU (the runs its transcript names)
MD_ENGINES = {"quality_mini_olmoe_paired.md": LEGACY_GRIDS["quality_mini_olmoe"],
              "routing/paired_oea_mini.md": LEGACY_GRIDS["quality_mini"]}
# grids whose calls rest on a pre-registered family of their own (docs/): their calls are not re-made
# here, and their rows count in q like every other comparison (module doc)
PREREGISTERED: tuple[str, ...] = ("replication",)  # issue 27: docs/preregistration.md, its own Holm family
# The README's headline bullets: table -> the metrics they report (all the table's rows of them);
# MD_PAIRED rows by (file, "A vs B" as in the transcript's command, run folder names). The family is
# results/*.csv at the top level only: grids moved to results/archive/ (made on an engine that is no
# longer current, issue 44) left it, the continuous, batching and held-out tables with them.
HEADLINE: dict[str, tuple[str, ...]] = {
    "ablation_mini_paired": ("accuracy", "kl"), "ablation_mini_olmoe_paired": ("accuracy", "kl"),
}
HEADLINE_MD = {("routing/paired_oea_mini.md", "budget=null,method=dense vs budget=null,method.k0=1,method=oea"),
               ("quality_mini_olmoe_paired.md", "budget=null,method=dense vs budget=null,method.k0=1,method=oea")}
KEY = ["table", "method", "budget", "metric"]
CROSS = ["q", "q_tost", "p_headline", "p_tost_headline", "scope"]


# ---- the committed tables, each re-tested by its own grid's rules ---------------------------------

def kind(name: str) -> str | None:
    """Which analysis wrote a committed table (by its file name), None if it is not a comparison table."""
    if name.endswith("_paired"):
        return "paired"
    for k in ("batching", "did"):
        if name.endswith(f"_{k}"):
            return k
    if name.startswith("admission_"):
        return "admission"
    return "diff" if name == "quality_mini_diff" else None


def tables(results: Path = RESULTS) -> dict[str, pd.DataFrame]:
    """Every committed comparison table (name -> frame as committed), PREREGISTERED grids' too."""
    out = {}
    for path in sorted(results.glob("*.csv")):
        name = path.stem
        if kind(name):
            out[name] = pd.read_csv(path)
    return out


def preregistered(name: str) -> bool:
    return any(name.startswith(g) for g in PREREGISTERED)


def regrid(name: str, t: pd.DataFrame) -> pd.DataFrame:
    """A committed table's grid calls re-made from its own p-values (stats.grid_calls), cross-grid
    columns dropped. Batching tables mark dense as null by construction; admission tables written
    before issue 27 get the crossed seed test (analysis.admission.from_table)."""
    t = t.drop(columns=[c for c in CROSS if c in t])
    if preregistered(name):  # its own pre-registered family: calls as committed
        t["excluded"] = t["excluded"].astype(object).fillna("") if "excluded" in t else ""
        return t
    k = kind(name)
    if k == "admission":
        from analysis import admission

        if "accuracy_diff" in t:  # the pre-issue-27 layout
            return admission.from_table(t)
        return S.grid_calls(t)
    if k == "batching":
        from analysis.batching import NULL_BY_CONSTRUCTION

        t["excluded"] = [NULL_BY_CONSTRUCTION.get(m, "") for m in t["method"]]
    if k in ("paired", "did", "diff"):  # their exclusions follow from the metric (stats.MIRRORS)
        t = t.drop(columns=["excluded"], errors="ignore")
    return S.grid_calls(t)


def md_rows(results: Path = RESULTS) -> pd.DataFrame:
    """The MD_PAIRED transcripts as comparison rows (exact McNemar from their discordant counts),
    called on Holm over each transcript file's comparisons, as every grid's calls are over its grid."""
    rows = []
    for rel in MD_PAIRED:
        if not (results / rel).exists():
            continue
        text = (results / rel).read_text()
        for block in text.split("```"):
            lines = block.strip().splitlines()
            head = [i for i, line in enumerate(lines) if line.startswith("$ python -m analysis.paired")]
            if not head:
                continue
            a, b = (Path(x).name for x in lines[head[0]].split()[-2:])
            kv = dict(line.strip().split(": ", 1) for line in lines[head[0] + 1:] if ": " in line)
            a_only, b_only, n = int(kv["a_only"]), int(kv["b_only"]), int(kv["n"])
            p = S.mcnemar_exact(a_only, b_only)
            rows.append({"table": rel, "method": f"{a} vs {b}", "budget": np.nan, "metric": "accuracy",
                         "diff": float(kv["diff"]), "p": p, "p_tost": np.nan, "excluded": "", "n": n})
    out = pd.DataFrame(rows, columns=["table", "method", "budget", "metric", "diff", "p", "p_tost", "excluded",
                                      "call", "n"]).astype({"call": object})
    for _, idx in out.groupby("table").groups.items():  # a transcript file is one grid: Holm over its rows
        p_holm = S.holm(out.loc[idx, "p"].to_numpy(dtype=float))
        out.loc[idx, "call"] = [S.call(d, ph, np.nan) for d, ph in zip(out.loc[idx, "diff"], p_holm)]
    return out


def table_engine(name: str, results: Path = RESULTS, frame: pd.DataFrame | None = None) -> str:
    """The decode engine of a committed comparison table (its `engine` column: one, or exit 2), of
    an MD_PAIRED transcript (MD_ENGINES), or, for a table written before the column, its grid's
    (analysis/engines.py: the replication as committed, the static grids by name)."""
    if name in MD_ENGINES:
        return MD_ENGINES[name]
    path = results / f"{name}.csv"
    if frame is None and path.exists():
        frame = pd.read_csv(path)
    if frame is not None and ENGINE in frame:
        return one_engine(frame, f"the comparisons of results/{name}.csv")
    if preregistered(name):
        return REPLICATION_AS_COMMITTED
    return rule_engine(f"results/{name}.csv") or "unknown"


def row_engines(long: pd.DataFrame, results: Path = RESULTS) -> list[str]:
    """The engine of each row of a long table (results/cross_grid.csv's layout: a `table` column)."""
    engines = {name: table_engine(name, results) for name in long["table"].astype(str).unique()}
    return [engines[name] for name in long["table"].astype(str)]


# ---- the cross-grid columns ----------------------------------------------------------------------

def _long(regridded: dict[str, pd.DataFrame], extra: pd.DataFrame, results: Path = RESULTS) -> pd.DataFrame:
    """One row per comparison of every table: KEY, diff, p, p_tost (nan where no tie can be called:
    the grid's p_tost_holm is nan), excluded, call, `row`, its index in its table, and `engine`,
    its table's decode engine (table_engine)."""
    parts = []
    for name, t in regridded.items():
        method = t["variant"] if "variant" in t else t["method"]
        metric = t["metric"] if "metric" in t else pd.Series("accuracy", index=t.index)
        parts.append(pd.DataFrame({"table": name, "method": method, "budget": t["budget"], "metric": metric,
                                   "diff": t["diff"], "p": t["p"], "p_tost": t["p_tost"].where(t["p_tost_holm"].notna()),
                                   "excluded": t["excluded"].fillna(""), "call": t["call"], "row": t.index,
                                   ENGINE: table_engine(name, results, t)}))
    if len(extra):
        parts.append(extra.assign(row=-1, **{ENGINE: row_engines(extra, results)})[
            ["table", "method", "budget", "metric", "diff", "p", "p_tost", "excluded", "call", "row", ENGINE]])
    return pd.concat(parts, ignore_index=True)


def cross(long: pd.DataFrame) -> pd.DataFrame:
    """The cross-grid columns (module docstring) over every row of `long` (_long)."""
    out = long.copy()
    family = (out["excluded"] == "") & out["p"].notna()
    ties = family & out["p_tost"].notna()
    head = family & np.array([((t, m) in HEADLINE_MD) or (m2 in HEADLINE.get(t, ())) for t, m, m2 in
                              zip(out["table"], out["method"], out["metric"])])
    for col, mask, src in (("q", family, "p"), ("q_tost", ties, "p_tost"), ("p_headline", head, "p"),
                           ("p_tost_headline", head & ties, "p_tost")):
        out[col] = np.nan
        adjust = S.bh if col.startswith("q") else S.holm
        out.loc[mask, col] = adjust(out.loc[mask, src].to_numpy(float))
    out["scope"] = [_scope(r) for _, r in out.iterrows()]
    return out


def _scope(r: pd.Series) -> str:
    if r["call"] in ("higher", "lower"):
        ok = r["q"] < S.ALPHA and not (r["p_headline"] >= S.ALPHA)
    elif r["call"] == "tie":
        ok = r["q_tost"] < S.ALPHA and not (r["p_tost_headline"] >= S.ALPHA)
    else:
        return ""
    return "confirmed" if ok else "exploratory"


def apply(results: Path = RESULTS) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """(every committed table re-tested with the cross-grid columns, the long table of all rows)."""
    regridded = {name: regrid(name, t) for name, t in tables(results).items()}
    long = cross(_long(regridded, md_rows(results), results))
    for name, t in regridded.items():
        mine = long[long["table"] == name].set_index("row")
        for col in CROSS:
            t[col] = mine[col].reindex(t.index).to_numpy()
        regridded[name] = t
    return regridded, long


def summary_md(long: pd.DataFrame) -> str:
    fam = long[(long["excluded"] == "") & long["p"].notna()]
    called = fam[fam["call"].isin(["higher", "lower", "tie"])]
    head = fam["p_headline"].notna()
    by = called.groupby("table")["scope"].value_counts().unstack(fill_value=0)
    by = by.reindex(index=sorted(fam["table"].unique()), columns=["confirmed", "exploratory"], fill_value=0)
    by.insert(0, "comparisons", fam.groupby("table").size().reindex(by.index))
    by.insert(1, "calls", called.groupby("table").size().reindex(by.index, fill_value=0))
    excluded = long[long["excluded"] != ""]
    engines = fam[ENGINE].value_counts() if ENGINE in fam else pd.Series(dtype=int)
    pooled = (f"The family pools the comparisons of {len(engines)} decode engine(s) "
              f"({', '.join(f'`{e}` {n}' for e, n in engines.items())}; analysis/engines.py); each comparison is "
              "between runs of one table, made by one engine (column `engine` of results/cross_grid.csv).\n\n")
    return (f"Made by `python -m analysis.cross_grid` from the committed comparison tables.\n\n"
            f"The cross-grid family: {len(fam)} comparisons of {fam['table'].nunique()} committed tables "
            f"(every difference test of results/*_paired.csv, *_batching.csv, *_did.csv, admission_*.csv, "
            f"quality_mini_diff.csv and the {len(MD_PAIRED)} `analysis.paired` transcripts), {len(excluded)} rows "
            f"excluded (null by construction, or dll, which mirrors KL). q: Benjamini-Hochberg over the "
            f"{len(fam)}; p_headline: Holm over the {int(head.sum())} comparisons the README's headline bullets "
            f"report. Of {len(called)} calls (higher, lower, tie by each grid's Holm), {int((called['scope'] == 'confirmed').sum())} "
            f"pass the cross-grid correction (confirmed) and {int((called['scope'] == 'exploratory').sum())} do not "
            "(exploratory). Every row with its columns: results/cross_grid.csv.\n\n"
            + pooled + by.reset_index().to_markdown(index=False) + "\n")


# ---- writing the tables back ---------------------------------------------------------------------

def render(name: str, t: pd.DataFrame, results: Path = RESULTS) -> str:
    """A committed table's .md from its frame (the header lines of a grid's .md kept as committed)."""
    k = kind(name)
    if k == "paired":
        from analysis.ablation import markdown

        grid = name.removesuffix("_paired")
        md = (results / f"{grid}.md").read_text()
        return md[:md.index("Value over")] + markdown(pd.read_csv(results / f"{grid}.csv"), t)
    if k == "batching":
        from analysis.batching import markdown

        made = (results / f"{name}.md").read_text().splitlines()[0]
        static, continuous, dest = re.search(r"analysis\.batching (\S+) (\S+) (\S+)`", made).groups()
        return markdown(t, static, continuous, dest)
    if k == "did":
        from analysis.did import markdown

        made = (results / f"{name}.md").read_text().splitlines()[0]
        return markdown(t, re.search(r"Made by `(.+)`\.", made).group(1))
    if k == "admission":
        from analysis.admission import markdown

        dest = f"results/{name}"
        return markdown(t, f"{dest}.csv", dest, f"python -m analysis.admission --from-table {dest}")
    from analysis.quality_diff import markdown

    return markdown(t)


def write(results: Path = RESULTS) -> list[str]:
    regridded, long = apply(results)
    written = []
    for name, t in regridded.items():
        t = t.assign(budget=t["budget"].astype("Int64"))  # 8, not 8.0, where dense has none
        if ENGINE in t:  # the last column, where analysis/engines.py stamps it
            t = with_engine(t, t[ENGINE])
        t.to_csv(results / f"{name}.csv", index=False)
        written.append(name)
        if preregistered(name):
            continue
        md = results / (f"{name.removesuffix('_paired')}.md" if kind(name) == "paired" else f"{name}.md")
        md.write_text(render(name, t, results))
    cols = [*KEY, "diff", "p", "p_tost", "call", "excluded", *CROSS, ENGINE]
    long[cols].to_csv(results / "cross_grid.csv", index=False)
    (results / "cross_grid.md").write_text(summary_md(long))
    return written


def check(results: Path = RESULTS, atol: float = 1e-12) -> list[str]:
    """The committed tables whose calls or cross-grid columns differ from a fresh apply()."""
    regridded, _ = apply(results)
    failures = []
    for name, fresh in regridded.items():
        old = pd.read_csv(results / f"{name}.csv")
        for col in ["call", *CROSS]:
            if col not in old:
                failures.append(f"{name}: no {col} column: run `python -m analysis.cross_grid`")
                break
            a, b = old[col], fresh[col]
            if not (pd.api.types.is_numeric_dtype(a) and pd.api.types.is_numeric_dtype(b)):
                same = a.astype("string").fillna("").to_numpy() == b.astype("string").fillna("").to_numpy()
            else:
                same = np.isclose(a.to_numpy(float), b.to_numpy(float), rtol=1e-9, atol=atol, equal_nan=True)
            if not same.all():
                failures.append(f"{name}: {col} out of date in {int((~same).sum())} row(s): run `python -m analysis.cross_grid`")
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only list the tables that are out of date")
    args = ap.parse_args(argv)
    if args.check:
        failures = check()
        for f in failures:
            print(f)
        print(f"{len(tables())} comparison tables: {len(failures)} out of date")
        return 1 if failures else 0
    for name in write():
        print(f"rewrote results/{name}.csv and its .md")
    print("wrote results/cross_grid.csv and results/cross_grid.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
