"""Are two trees of run folders the same run? Per-request outputs and selection statistics, compared exactly.

    python -m analysis.compare_runs outputs/guard_before outputs/guard_after results/refactor_guard/cpu

For every run folder (a folder with report.json) present under both roots, by its path relative to
the root, it compares samples.jsonl row by row (task, doc, generation, correctness, decode batch),
and selection_steps.csv, fidelity_steps.csv and metrics.csv cell by cell. Writes
<dest>.csv (one row per run folder and file: rows compared, rows that differ, and `engine`, the decode
engine of the two runs, "A vs B" where they differ: analysis/engines.py) and <dest>.md, and exits 1
if anything differs, so a restructuring can be guarded by it.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from analysis.engines import run_engine
from analysis.load import command_line

TABLES = ("selection_steps.csv", "fidelity_steps.csv", "metrics.csv")


def run_folders(root: Path) -> dict[str, Path]:
    return {str(p.parent.relative_to(root)): p.parent for p in sorted(root.rglob("report.json"))}


def _samples(path: Path) -> pd.DataFrame:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line]
    df = pd.DataFrame(rows).sort_values(["task", "doc_id"]).reset_index(drop=True)
    return df.map(lambda v: json.dumps(v, sort_keys=True))  # exact, NaN and None included


def compare_file(a: Path, b: Path, name: str) -> dict[str, object]:
    """Rows compared and rows that differ (a missing file on one side differs entirely)."""
    if not a.exists() and not b.exists():
        return {}
    if a.exists() != b.exists():
        return {"file": name, "rows": None, "differing_rows": None, "note": "present on one side only"}
    if name == "samples.jsonl":
        da, db = _samples(a), _samples(b)
    else:  # every cell as written, so NaN and formatting compare exactly
        da, db = (pd.read_csv(p, dtype=str, keep_default_na=False) for p in (a, b))
    if list(da.columns) != list(db.columns) or len(da) != len(db):
        return {"file": name, "rows": len(da), "differing_rows": max(len(da), len(db)),
                "note": f"shape or columns differ: {da.shape} vs {db.shape}"}
    same = (da.astype(str) == db.astype(str)).all(axis=1)
    return {"file": name, "rows": len(da), "differing_rows": int((~same).sum()), "note": ""}


def engines(*run_dirs: Path) -> str:
    """The decode engine of the runs compared: one fingerprint, or "A vs B" where they differ."""
    return " vs ".join(dict.fromkeys(run_engine(d) for d in run_dirs))


def compare(root_a: Path, root_b: Path) -> pd.DataFrame:
    ra, rb = run_folders(root_a), run_folders(root_b)
    rows = []
    for run in sorted(set(ra) | set(rb)):
        if run not in ra or run not in rb:
            rows.append({"run": run, "file": "report.json", "rows": None, "differing_rows": None,
                         "note": f"only under {root_a if run in ra else root_b}",
                         "engine": engines(ra[run] if run in ra else rb[run])})
            continue
        engine = engines(ra[run], rb[run])
        for name in ("samples.jsonl", *TABLES):
            row = compare_file(ra[run] / name, rb[run] / name, name)
            if row:
                rows.append({"run": run, **row, "engine": engine})
    return pd.DataFrame(rows)


def main(a: str, b: str, dest: str) -> int:
    table = compare(Path(a), Path(b))
    out = Path(dest)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out.with_suffix(".csv"), index=False)
    bad = table[(table["differing_rows"].fillna(1) != 0)]
    text = (f"{a} against {b}: {table['run'].nunique()} run folders, {len(table)} files compared, "
            f"{len(bad)} differ\n\n" + table.to_markdown(index=False) + "\n")
    out.with_suffix(".md").write_text(text)
    print(text)
    return 1 if len(bad) else 0


if __name__ == "__main__":
    sys.exit(main(*command_line(__doc__, 3)))
