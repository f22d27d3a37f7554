"""The decode engine behind a run or a committed grid, by the fingerprint base/run/provenance.py
writes into report.json (`provenance.fingerprint`, e.g. `c3-packed-cpu`), and the check that an
analysis never pools or compares what different engines made.

    engine_of(report, config)          # a run's fingerprint; named from its config when the run
                                       # was recorded before fingerprints existed
    LEGACY_GRIDS["replication_mini"]   # the engine of a committed grid whose records predate them
    one_engine(frame, "replication_mini paired calls")   # the single engine of a frame, or exit 2

Engines before fingerprints (read from a run's config.yaml, as provenance.py's module doc names
them): continuous batching without a `scheduler` section is `c1-padded` (before issue 26: the host
read every step before launching the next); with one, `c2` (issue 26's packed engine; `c2s` where
`scheduler.overlap=false` synced every step, so stops were exact; with overlap a stop string
ended its request a step late); static batching `s1`; timing runs `t1`.
Reads outputs/ and results/ only.
"""
from __future__ import annotations

import sys

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
