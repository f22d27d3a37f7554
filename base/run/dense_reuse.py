"""Dense decodes the same at every budget: a sweep over budgets decodes it once.

    python run.py -m method=dense,base budget=4,8,16      # dense is three sweep points, one decode

`method=dense` ignores `budget`, yet each budget is a sweep point with a folder of its own (Hydra
names it by its overrides). An evaluation of dense whose experiment folder already holds a finished,
intact dense evaluation of the same configuration but for `budget` takes that run's outputs instead
of decoding again: its folder gets a copy of them with its own config.yaml, marker and report
(`reused_from` names the run it copied; `force=true` decodes it anew). Only evaluations: a
throughput run is a timing, measured where it runs.
"""
from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from base.config import RunConfig
from base.files import atomic_write_text
from base.run import outputs, run_folder

# what the copy writes itself (the run's own) rather than takes from the run it copies
OWN_FILES = (run_folder.MARKER, "config.yaml", outputs.REPORT, outputs.PENDING_REPORT, "run.log")


def _without_budget(resolved_config: str) -> str:
    return outputs.config_hash(resolved_config, outputs.NON_SEMANTIC_KEYS + ("budget",))


def dense_sibling(cfg: RunConfig, resolved_config: str, older_engine: Callable[[Path], Any]) -> Path | None:
    """A finished, intact dense evaluation beside cfg.out_dir (its experiment folder) whose config
    differs from this one's in `budget` at most, decoded by this engine version (`older_engine`:
    truthy for a folder an older engine decoded); None when this run is no dense evaluation, with
    force=true, or where there is none."""
    out = cfg.out_dir
    if cfg.stage != "evaluate" or cfg.method.name != "dense" or cfg.force or not out.parent.is_dir():
        return None
    key = _without_budget(resolved_config)
    for p in sorted(out.parent.iterdir()):
        # a run folder of its own: not this one, nor a staging, old or kept (`<run>~<hash>`) folder
        if p == out or not p.is_dir() or p.name.startswith(".") or "~" in p.name:
            continue
        recorded = p / "config.yaml"
        if outputs.finished_hash(p) is None or not recorded.is_file():
            continue
        if _without_budget(recorded.read_text()) == key and not outputs.damaged(p) and not older_engine(p):
            return p
    return None


def copy_run(sibling: Path, stage: Path, cfg: RunConfig, resolved_config: str, chash: str) -> dict[str, Any]:
    """The sibling's outputs into `stage` as this run's (its own marker, config.yaml and pending
    report; `wall_s` the copy's, the decode's own time stays in eval's `seconds`); the report."""
    t0 = time.perf_counter()
    for p in sibling.iterdir():
        if p.name in OWN_FILES or p.name.startswith("."):
            continue
        (shutil.copytree if p.is_dir() else shutil.copy2)(p, stage / p.name)
    run_folder.write_marker(stage, cfg.run_key, chash)
    atomic_write_text(stage / "config.yaml", resolved_config)
    report = outputs.read_report(sibling) or {}
    report.update(budget=cfg.budget, overrides=cfg.overrides, config_hash=chash, reused_from=sibling.name,
                  files=outputs.line_counts(stage), wall_s=time.perf_counter() - t0)
    report.pop("wandb", None)  # the sibling's logged run, not this one's
    note = (f"[base] dense decodes the same at every budget: {cfg.out_dir.name} takes the outputs of "
            f"{sibling.name} (same config but for budget) instead of decoding again; force=true decodes it")
    atomic_write_text(stage / "run.log", note + "\n")
    print(note, flush=True)
    outputs.write_report(stage, report, outputs.PENDING_REPORT)
    return report
