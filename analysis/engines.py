"""The decode engine behind a run or a committed grid, by the fingerprint base/run/provenance.py
writes into report.json (`provenance.fingerprint`, e.g. `c3-packed-cpu`), and the check that an
analysis never pools or compares what different engines made.

    engine_of(report, config)          # a run's fingerprint; named from its config when the run
                                       # was recorded before fingerprints existed
    LEGACY_GRIDS["replication_mini"]   # the engine of a committed grid whose records predate them
    one_engine(frame, "replication_mini paired calls")   # the single engine of a frame, or exit 2
    with_engine(table, engine)         # a table written with its `engine` column (the last)
    python -m analysis.engines stamp   # the column added to a committed table made before it (below)

Engines before fingerprints (read from a run's config.yaml, as provenance.py's module doc names
them): continuous batching without a `scheduler` section is `c1-padded` (before issue 26: the host
read every step before launching the next); with one, `c2` (issue 26's packed engine; `c2s` where
`scheduler.overlap=false` synced every step, so stops were exact; with overlap a stop string
ended its request a step late); static batching `s1`; timing runs `t1`.
Reads outputs/ and results/ only; `stamp` writes the committed tables' `engine` column (nothing else).
"""
from __future__ import annotations

import sys
from fnmatch import fnmatch

import pandas as pd

# Committed grids whose records were written before fingerprints: the engine each was made on
# (the commit and settings are in the grid's README, in results/archive/README.md for the archived ones).
LEGACY_GRIDS = {
    # static batching on this project's CPU machine (transformers' generate: eval.engine=auto on a CPU)
    **{g: "s1-generate-cpu" for g in (
        "quality_mini", "quality_mini_olmoe", "quality_seeds_mini", "quality_seeds_mini_olmoe", "ablation_mini",
        "ablation_mini_olmoe", "rules_mini", "rules_mini_olmoe", "heldout_mini128")},
    # continuous batching re-run on 2026-12-02 with scheduler.overlap=false (results/README.md)
    **{g: "c2s-packed-cpu" for g in (
        "quality_seeds_mini_continuous", "quality_seeds_mini_olmoe_continuous", "rules_mini_continuous",
        "rules_mini_olmoe_continuous", "admission_mini", "admission_mini_olmoe", "heldout_mini128_continuous")},
    # the pre-registered replication at commit 2166d53 (no scheduler section: the engine before issue 26)
    "replication_mini@2166d53": "c1-padded-cpu", "replication_mini_olmoe@2166d53": "c1-padded-cpu",
    # its 128-expert family at 270ce4d, scheduler defaults (overlap on: host stops one step late)
    "replication_mini128": "c2-packed-cpu",
    # results/archive/rerun_2026-12-02: quality_seeds_mini_continuous on the default of that day (overlap on)
    "rerun_quality_seeds_mini_continuous": "c2-packed-cpu",
}


def _device(report: dict) -> str:
    return str(report.get("device") or "cpu").split(":")[0]


def engine_of(report: dict, config: dict | None = None) -> str:
    """The fingerprint of the engine that made a run (see the module doc)."""
    recorded = (report.get("provenance") or {}).get("fingerprint")
    if recorded:
        return recorded
    device = _device(report)
    if report.get("stage") != "evaluate":
        return f"t1-{device}"
    ev = report.get("eval") or {}
    if ev.get("batching", "static") != "continuous":
        return f"s1-{'engine' if ev.get('engine') else 'generate'}-{device}"
    scheduler = (config or {}).get("scheduler")
    if not scheduler:
        return f"c1-padded-{device}"
    name = f"c2{'' if scheduler.get('overlap', True) else 's'}-{scheduler.get('packing', 'packed')}"
    if scheduler.get("chunked"):
        name += f"+chunk{scheduler.get('chunk_tokens')}"
    if scheduler.get("min_prompt_tokens", 1) > 1 or scheduler.get("max_wait_steps", 0) > 0:
        name += f"+wait{scheduler.get('min_prompt_tokens')}/{scheduler.get('max_wait_steps')}"
    if scheduler.get("compile_prefill"):
        name += "+cprefill"
    return f"{name}-{device}"


def one_engine(frame: pd.DataFrame, what: str, column: str = "engine") -> str:
    """The one engine of `frame`'s rows; exit 2 naming them when `what` would mix engines."""
    engines = sorted(frame[column].dropna().astype(str).unique()) if column in frame else []
    if len(engines) > 1:
        counts = frame[column].astype(str).value_counts()
        listed = ", ".join(f"{e} ({counts[e]} rows)" for e in engines)
        print(f"error: {what} would mix rows of {len(engines)} decode engines: {listed}. Compare runs of one engine "
              f"(base/run/provenance.py names them; re-run the older ones)", file=sys.stderr)
        raise SystemExit(2)
    return engines[0] if engines else "unknown"


# ---- the engine column of every committed table (issue 40) -----------------------------------------
#
# Every CSV table under results/ (but archive/, records/ and NOT_STAMPED) carries a column `engine`:
# the fingerprint of the decode engine that made its rows, or `none (<what made them>)` for a table
# no decode engine made. The analysis modules write it themselves from the runs they read
# (with_engine, run_engine); `python -m analysis.engines stamp` adds it to a committed table made
# before they did, by the rules below, and changes no other column (each file is read back: its other
# columns must equal what they were, else nothing is written):
#
#     python -m analysis.engines stamp             # every committed table lacking the column (--dry-run: list)
#     python -m analysis.engines stamp <csv>...    # these tables (a new one, e.g. a copied predictor.csv)
#     python -m analysis.engines check             # list the committed tables lacking it (exit 1)

COLUMN = "engine"
# tables no decode engine made: what made their rows instead
FIT = "none (fit)"                                    # a predictor fitted to routing (stage=fit): held-out R²
DENSE_FORWARD = "none (dense forward)"                # routing histograms of one forward over prompt + answer
TEACHER_FORCED = "none (teacher-forced forward)"      # routing on reference answers fed token by token
TRAINING = "none (training log)"                      # a model's training curve
KERNEL_BENCH = "none (kernel benchmark)"              # a kernel timed alone (tools/bench_*, tune_step_kernels)
GPU_LOG = "none (nvidia-smi log)"                     # the GPU's clocks, temperature and power during a grid
PER_ROW = "per row"                                   # each row its own: PER_ROW_RULES

# Tables stamped by their path (repository-relative, fnmatch: `*` crosses folders), first match wins;
# before these, results/<grid>.csv, <grid>_paired.csv and <grid>_diff.csv at the top level take
# LEGACY_GRIDS[<grid>] (the static grids: quality_mini*, quality_seeds_mini*, ablation_*, rules_*).
# A table no rule names takes the engine of the run folder it lies in (report.json, engine_of).
# A run folder's own tables (throughput.csv, serve.csv, selection_steps.csv, ...: base/ writes them
# without the column) are stamped when committed, like the rest: by their area's rule, which the
# run's report.json must agree with (table_engine), or, where no rule names the folder, by it.
STAMP_RULES: tuple[tuple[str, str], ...] = (
    ("results/cross_grid.csv", PER_ROW),                        # each comparison its table's
    ("results/refactor_guard/cpu/comparison.csv", PER_ROW),     # each run its own (eval.engine)
    ("results/heldout/models/*/train_log.csv", TRAINING),       # the held-out models' training (issue 41)
    # the pre-registered grid: continuous batching on this project's CPU (experiments/heldout/grid.sh)
    ("results/heldout/grid_*.csv", "c3-packed-cpu"),
    ("results/heldout/*.csv", PER_ROW),                         # each row its batching's (experiments/heldout/)
    ("results/*_predictor_r2.csv", FIT),                        # the Makefile's copy of stage=fit's predictor.csv
    ("results/routing/*/train_log.csv", TRAINING),              # the OLMoE top-4 control model's training
    ("results/routing/*routing_stats.csv", TEACHER_FORCED),     # experiments/routing_stats.py
    ("results/specialisation/js.csv", DENSE_FORWARD),           # experiments/specialisation.py: histograms
    # experiments/specialisation.py: dense union over decode steps of transformers' generate, 16 prompts
    # a batch, on this project's CPU (`make specialisation`, 2026-11-29)
    ("results/specialisation/union*.csv", "s1-generate-cpu"),
    # the CPU guard of issue 17: evaluate runs with static batches on the CPU (their report.json)
    ("results/refactor_guard/cpu/*", "s1-generate-cpu"),
    # the 2026-12-05 guards (cpu_2026-12-05, cpu_2026-12-05b): the same runs, by then continuous
    # batching (issue 40's engine)
    ("results/refactor_guard/cpu_2026-12-05*/*", "c3-packed-cpu"),
    ("results/*gpu_state*.csv", GPU_LOG),
    ("results/*tune_step.csv", KERNEL_BENCH),                   # tools/tune_step_kernels.py
    ("results/*bench_select.csv", KERNEL_BENCH),                # tools/bench_select.py
    ("results/*bench_skinny.csv", KERNEL_BENCH),                # tools/bench_skinny.py
    ("results/*bench_experts.csv", KERNEL_BENCH),               # tools/bench_experts.py
    # timing runs on a CUDA GPU (stage=throughput: static steps, streams, serving; timing only)
    ("results/refactor_guard/h200/*", "t1-cuda"),
    ("results/roofline/*", "t1-cuda"),
    ("results/serve/*", "t1-cuda"),
    ("results/stream/*", "t1-cuda"),
    ("results/throughput/*", "t1-cuda"),
    ("results/multi_gpu/*", "t1-cuda"),
)


def _cross_grid_rows(frame: pd.DataFrame, root) -> list[str]:
    """results/cross_grid.csv: each comparison's table's engine (analysis/cross_grid.py row_engines)."""
    from analysis.cross_grid import row_engines

    return row_engines(frame, root / "results")


def _guard_rows(frame: pd.DataFrame, root) -> list[str]:
    """results/refactor_guard/cpu/comparison.csv: static batches on the CPU, through transformers'
    generate, or through base/runtime/engine.py where the run (its folder name, the overrides of
    experiments/guard/cpu_runs.sh; the runs were not committed) set eval.engine=on."""
    return ["s1-engine-cpu" if "eval.engine=on" in run else "s1-generate-cpu" for run in frame["run"].astype(str)]


# the tables whose rows were made by different engines: path -> their engines, row by row
def _heldout_rows(frame: pd.DataFrame, root) -> list[str]:
    """results/heldout/: experiments/heldout/ writes each row's engine; continuous rows are the
    current continuous engine's (issue 40), static ones transformers' generate, the mechanism's
    teacher-forced rows a plain forward."""
    by = {"continuous": "c3-packed-cpu", "online": "c3-packed-cpu", "static": "s1-generate-cpu",
          "teacher_forced": TEACHER_FORCED}
    col = "batching" if "batching" in frame else "state"
    return [by[v] for v in frame[col].astype(str)]


PER_ROW_RULES = {"results/cross_grid.csv": _cross_grid_rows,
                 "results/refactor_guard/cpu/comparison.csv": _guard_rows,
                 "results/heldout/mechanism_calls.csv": _heldout_rows,
                 "results/heldout/mechanism/summary.csv": _heldout_rows}
# Not stamped here: analysis/replication.py writes these tables from the replication's records, each
# row with its records' engine where it writes the column; they are left to it (and to the test's list).
NOT_STAMPED = ("results/replication*",)
# the replication as committed (commit 2166d53, results/README.md) for a reader that needs its
# engine while its tables have no column (analysis/cross_grid.py)
REPLICATION_AS_COMMITTED = LEGACY_GRIDS["replication_mini@2166d53"]


def with_engine(frame: pd.DataFrame, engine) -> pd.DataFrame:
    """`frame` with the column `engine` (one fingerprint, or one per row) as its last column."""
    out = frame.drop(columns=[COLUMN], errors="ignore").copy()
    out[COLUMN] = engine
    return out


def run_engine(run_dir) -> str:
    """The engine of one run folder, from its report.json and config.yaml (engine_of); `unknown`
    for a folder without report.json (a run killed before it finished)."""
    import json
    from pathlib import Path

    import yaml

    run_dir = Path(run_dir)
    if not (run_dir / "report.json").is_file():
        return "unknown"
    report = json.loads((run_dir / "report.json").read_text())
    config = run_dir / "config.yaml"
    return engine_of(report, (yaml.safe_load(config.read_text()) or {}) if config.exists() else None)


def grid_engine(name: str) -> str | None:
    """The engine of a top-level static grid's table by its name (LEGACY_GRIDS), None if no grid."""
    for suffix in ("_paired", "_diff", ""):
        if name.endswith(suffix) and name.removesuffix(suffix) in LEGACY_GRIDS:
            return LEGACY_GRIDS[name.removesuffix(suffix)]
    return None


class StampError(Exception):
    """A table the rules cannot stamp, or one whose runs contradict its rule."""


def _posix(rel) -> str:
    return str(rel).replace("\\", "/")


def stamped_here(rel: str) -> bool:
    """Whether a repository-relative CSV is one of the tables that carry the column (module notes)."""
    rel = _posix(rel)
    return (rel.startswith("results/") and rel.endswith(".csv") and not rel.startswith(("results/archive/",
            "results/records/")) and not any(fnmatch(rel, p) for p in NOT_STAMPED))


def committed_tables(root) -> list[str]:
    """Every committed CSV table that carries the column (stamped_here), repository-relative, sorted:
    git's tracked files, or every file under results/ where git cannot say."""
    import subprocess
    from pathlib import Path

    root = Path(root)
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", "results"], cwd=root, capture_output=True, timeout=30,
                             check=True).stdout.decode()
        files = [f for f in out.split("\0") if f]
    except (OSError, subprocess.SubprocessError):
        files = [_posix(p.relative_to(root)) for p in (root / "results").rglob("*.csv")]
    return sorted(f for f in files if stamped_here(f) and (root / f).is_file())


def rule_engine(rel: str) -> str | None:
    """The engine the rules give the table at `rel` (repository-relative): its grid's at the top
    of results/, else the first STAMP_RULES pattern it matches; None where none does."""
    from pathlib import PurePosixPath

    rel = _posix(rel)
    p = PurePosixPath(rel)
    if str(p.parent) == "results" and grid_engine(p.stem):
        return grid_engine(p.stem)
    return next((engine for pattern, engine in STAMP_RULES if fnmatch(rel, pattern)), None)


def _runs(folder) -> dict[str, list]:
    """engine -> the run folders (report.json with a stage) under `folder`."""
    import json

    found: dict[str, list] = {}
    for rep in sorted(folder.rglob("report.json")):
        if "stage" in json.loads(rep.read_text()):
            found.setdefault(run_engine(rep.parent), []).append(rep.parent)
    return found


def table_engine(root, rel: str) -> str:
    """The engine a committed table is stamped with: its rule's, which the runs in the table's folder
    and below must agree with (a rule naming a decode engine, below the top of results/); with no
    rule, the engine of the run folder holding it."""
    from pathlib import Path

    root, rel = Path(root), _posix(rel)
    folder, results = (root / rel).parent, root / "results"
    engine = rule_engine(rel)
    if engine is None:
        for d in [folder, *folder.parents]:
            if d == results or results not in d.parents:
                break
            if (d / "report.json").exists():
                return run_engine(d)
        raise StampError(f"{rel}: no rule of analysis/engines.py STAMP_RULES names its engine and no run folder "
                         "(report.json) holds it: add a rule")
    if engine.startswith("none") or engine == PER_ROW or folder == results:
        return engine
    other = {e: dirs for e, dirs in _runs(folder).items() if e != engine}
    if other:
        e, dirs = next(iter(other.items()))
        raise StampError(f"{rel}: its rule gives {engine}, but {len(dirs)} run(s) under {folder.relative_to(root)} were "
                         f"made by {e} (e.g. {dirs[0].relative_to(root)}): fix the rule or the table")
    return engine


def _split(text: str) -> tuple[list[str], list[str]]:
    """(leading `#` comment lines, the table's lines), each with its line end."""
    lines = text.splitlines(keepends=True)
    n = 0
    while n < len(lines) and lines[n].startswith("#"):
        n += 1
    return lines[:n], lines[n:]


def _frame(body: list[str]) -> pd.DataFrame:
    import io

    if not "".join(body).strip():
        return pd.DataFrame()
    return pd.read_csv(io.StringIO("".join(body)), dtype=str, keep_default_na=False)


def _cell(value: str) -> str:
    return f'"{value.replace(chr(34), 2 * chr(34))}"' if any(c in value for c in ',"\n\r') else value


def stamp_text(text: str, engine) -> str:
    """A CSV file's text with the column `engine` appended to every line (one value, or one per
    row), every other byte kept; a table with a quoted line break is refused (StampError)."""
    import csv

    comments, body = _split(text)
    if not "".join(body).strip():  # an empty table (pandas writes one as a blank line): no rows, no columns
        return "".join(comments) + COLUMN + "\n"
    if len(list(csv.reader(body))) != len(body):
        raise StampError("a quoted cell holds a line break: stamp it by hand")
    rows = len(body) - 1
    values = [engine] * rows if isinstance(engine, str) else [str(v) for v in engine]
    if len(values) != rows:
        raise StampError(f"{len(values)} engines for {rows} rows")
    out = []
    for line, value in zip(body, [COLUMN, *values]):
        end = line[len(line.rstrip("\r\n")):] or "\n"
        out.append(f"{line.rstrip(chr(13) + chr(10))},{_cell(value)}{end}")
    new = "".join(comments) + "".join(out)
    before, after = _frame(body), _frame(_split(new)[1])
    if list(after.columns) != [*before.columns, COLUMN] or not after[list(before.columns)].equals(before):
        raise StampError("stamping would change another column")
    return new


def stamp(root, tables: list[str] | None = None, write: bool = True) -> dict[str, str]:
    """Add the column to every table of `tables` (default: committed_tables) lacking it, by
    table_engine; {table: engine (PER_ROW: per row)} of those stamped (or, write=False, to stamp).
    A table with the column but an empty value in it is an error (StampError): the rules fill no
    gaps in a column something else wrote."""
    from pathlib import Path

    root = Path(root)
    done = {}
    for rel in tables if tables is not None else committed_tables(root):
        path = root / rel
        text = path.read_text()
        have = _frame(_split(text)[1])
        if COLUMN in have.columns:
            if (have[COLUMN].str.strip() == "").any():
                raise StampError(f"{rel}: its {COLUMN} column has empty values")
            continue
        engine = table_engine(root, rel)
        values = PER_ROW_RULES[rel](have, root) if engine == PER_ROW else engine
        if write:
            path.write_text(stamp_text(text, values))
        done[rel] = engine
    return done


def lacking(root) -> list[str]:
    """The committed tables without the column, or with an empty value in it."""
    from pathlib import Path

    out = []
    for rel in committed_tables(root):
        _, body = _split((Path(root) / rel).read_text())
        t = _frame(body)
        if COLUMN not in t.columns or (t[COLUMN].str.strip() == "").any():
            out.append(rel)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse
    from pathlib import Path

    ap = argparse.ArgumentParser(description="The engine column of the committed tables (issue 40): the notes "
                                             "above STAMP_RULES in analysis/engines.py.")
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("stamp", help="add the column to every committed table lacking it (or to the tables named)")
    s.add_argument("tables", nargs="*", help="CSV files, repository-relative (default: every committed table)")
    s.add_argument("--dry-run", action="store_true", help="only list what would be stamped")
    sub.add_parser("check", help="list the committed tables lacking the column (exit 1 if any)")
    args = ap.parse_args(argv)
    root = Path(__file__).resolve().parents[1]
    if args.command == "check":
        missing = lacking(root)
        for rel in missing:
            print(f"{rel}: no {COLUMN} column (or an empty value): run `python -m analysis.engines stamp`")
        print(f"{len(committed_tables(root))} committed tables: {len(missing)} without their {COLUMN}")
        return 1 if missing else 0
    tables = []
    for arg in args.tables:
        path = Path(arg).resolve()
        rel = _posix(path.relative_to(root)) if root in path.parents else arg
        if not path.is_file() or not stamped_here(rel):
            print(f"error: {arg}: not a table that carries the column (a CSV file under results/, not archive/, "
                  f"records/ or {', '.join(NOT_STAMPED)})", file=sys.stderr)
            return 2
        tables.append(rel)
    try:
        done = stamp(root, tables or None, write=not args.dry_run)
    except StampError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for rel, engine in done.items():
        print(f"{'would stamp' if args.dry_run else 'stamped'} {rel}: {engine}")
    print(f"{len(done)} tables {'to stamp' if args.dry_run else 'stamped'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
