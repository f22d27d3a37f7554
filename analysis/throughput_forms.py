"""An engine form's A/B inside one throughput run: each `METHOD+FORM` variant against its plain
`METHOD` variant, round by round. Engine forms existed until 2026-12-06 (deleted with the last,
+compile_prefill, which won its A/B): this reads the committed runs that timed them.

    python -m analysis.throughput_forms <run folder or throughput.csv> [<out>]

The run timed its variants in interleaved rounds with the order rotated (`throughput.repeats`), so
a variant with a form and the same variant without it ran in the same process and round; the
comparison pairs their passes by round (`ms_runs`), as analysis/kernel_ab.py pairs a kernel's
implementations: per batch size and variant, the median ms per step [min, max] over rounds, and
the form's ms over the plain variant's in the same round (< 1: the form is faster), median and
range. Kernels per layer come from the run's profile where it profiled both (report.json).
Writes <out>.csv and <out>.md when <out> is given, the .csv's last column `engine` the decode engine
of the run (analysis/engines.py; `unknown` for a throughput.csv outside its run folder). Reads run
folders only (outputs/ or results/).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from analysis.engines import run_engine, with_engine
from analysis.kernel_ab import medians, ratios

PLAIN = "plain"


def passes(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (batch size, variant without its forms, forms, round): the graph-timed passes
    (a CPU run's eager ones where it has no graph rows) in kernel_ab's layout: `impl` = the forms."""
    timed = df[df["mode"] == ("graph" if (df["mode"] == "graph").any() else "eager")]
    rows = []
    for _, r in timed.iterrows():
        name, *forms = str(r["variant"]).split("+")
        for i, ms in enumerate(str(r["ms_runs"]).split(";")):
            rows.append({"batch_size": r["batch_size"], "variant": name, "budget": r["budget"],
                         "impl": "+".join(forms) or PLAIN, "round": i, "us": float(ms)})
    return pd.DataFrame(rows)


def kernels_per_layer(report: Path) -> pd.Series:
    """The profile's kernels per decoder layer by variant label (empty without a profile)."""
    prof = pd.DataFrame(json.loads(report.read_text()).get("profile") or []) if report.is_file() else pd.DataFrame()
    if prof.empty:
        return pd.Series(dtype=float)
    return prof[prof["class"] == "total"].set_index("variant")["kernels_per_layer"]


def compare(csv: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(medians per variant and form, each form over plain by round); ms, not µs, despite the
    column name kernel_ab gives them."""
    t = passes(pd.read_csv(csv).drop(columns=["engine"], errors="ignore"))
    if t.empty or PLAIN not in set(t["impl"]) or set(t["impl"]) == {PLAIN}:
        raise SystemExit(f"error: {csv}: no variant with a form beside its plain variant "
                         f"(a run with throughput.methods=[base,base+FORM], made while engine forms existed)")
    paired = t.groupby(["batch_size", "variant", "budget"], dropna=False)["impl"].transform(
        lambda s: PLAIN in set(s) and len(set(s)) > 1)
    t = t[paired.astype(bool)]
    med = medians(t).rename(columns={"median": "ms", "lo": "ms_min", "hi": "ms_max"})
    per_layer = kernels_per_layer(csv.parent / "report.json")
    label = med["variant"] + med["impl"].map(lambda f: "" if f == PLAIN else f"+{f}")
    med["kernels_per_layer"] = label.map(per_layer)
    ratio = ratios(t, PLAIN).rename(columns={"median": "over_plain", "lo": "over_plain_min", "hi": "over_plain_max"})
    return med, ratio


def main(path: str, out: str | None = None) -> None:
    csv = Path(path) / "throughput.csv" if Path(path).is_dir() else Path(path)
    if not csv.is_file():
        raise SystemExit(f"error: {csv}: no such file (give a throughput run folder or its throughput.csv)")
    med, ratio = compare(csv)
    text = ["ms per replayed step, median [min, max] over the run's interleaved rounds\n",
            med.round(4).to_markdown(index=False),
            "\n\neach form over its plain variant in the same round (< 1: the form is faster)\n",
            ratio.round(4).to_markdown(index=False), "\n"]
    if out:
        out_p = Path(out)
        out_p.parent.mkdir(parents=True, exist_ok=True)
        engine = run_engine(csv.parent) if (csv.parent / "report.json").is_file() else "unknown"
        with_engine(pd.concat([med.assign(table="ms"), ratio.assign(table="over_plain")]), engine).to_csv(
            out_p.with_suffix(".csv"), index=False)
        out_p.with_suffix(".md").write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    main(*sys.argv[1:3])
