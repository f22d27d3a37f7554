"""A rule that reads no budget decodes the same at every budget: a sweep over budgets decodes it once.

    python run.py -m method=dense,base budget=4,8,16      # dense is three sweep points, one decode

`method=dense` ignores `budget`, and so does `oea` (every token's top-k0, however many experts that
keeps); yet each budget is a sweep point with a folder of its own (Hydra names it by its overrides).
An evaluation of such a rule whose experiment folder already holds a finished, intact evaluation of
the same configuration but for `budget`, decoded by the same code, takes that run's outputs instead
of decoding again: its folder gets a copy of them with its own config.yaml, marker, Hydra files and
report (`reused_from` names the run that decoded; `force=true` decodes it anew). Only evaluations: a
throughput run is a timing, measured where it runs. (The module keeps dense's name: dense was first.)
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
from base.run.provenance import commit

# what the copy writes itself (the run's own) rather than takes from the run it copies
OWN_FILES = (run_folder.MARKER, "config.yaml", outputs.REPORT, outputs.PENDING_REPORT, "run.log")


def reads_no_budget(method: str) -> bool:
    """Dense, and a selector that ignores the budget (oea). Not a budgeted rule run without one
    (method.coverage with budget=null): a sibling's budget would have capped it."""
    from base.method.selectors import SELECTORS

    return method == "dense" or not SELECTORS.get(method).uses_budget


def _without_budget(resolved_config: str) -> str:
    return outputs.config_hash(resolved_config, outputs.NON_SEMANTIC_KEYS + ("budget",))


def dense_sibling(cfg: RunConfig, resolved_config: str, older_engine: Callable[[Path], Any]) -> Path | None:
    """A finished, intact evaluation of this budget-free rule (dense, oea) beside cfg.out_dir (its
    experiment folder) whose config differs from this one's in `budget` at most, decoded by this
    checkout's code (its commit and whether tracked files differed from it, as the points of one sweep
    are: so an engine change a config does not show, such as the prefill compiled since 110fd43, is
    never copied across); `older_engine`: truthy for a folder an older engine version decoded. None
    when this run is no evaluation of a rule that reads no budget, with force=true, or where there is
    none. A run that decoded comes before a copy."""
    out = cfg.out_dir
    if cfg.stage != "evaluate" or not reads_no_budget(cfg.method.name) or cfg.force or not out.parent.is_dir():
        return None
    key, code = _without_budget(resolved_config), None
    candidates = []
    for p in out.parent.iterdir():
        # a run folder of its own: not this one, nor a staging, old or kept (`<run>~<hash>`) folder
        if p == out or not p.is_dir() or p.name.startswith(".") or "~" in p.name:
            continue
        recorded, report = p / "config.yaml", outputs.read_report(p)
        if report is None or not recorded.is_file() or _without_budget(recorded.read_text()) != key:
            continue
        made_by, code = report.get("provenance") or {}, code or commit(cfg.root)  # git only for a match
        if (made_by.get("commit"), made_by.get("dirty")) != (code.get("commit"), code.get("dirty")) or older_engine(p):
            continue
        if damage := outputs.damaged(p):
            print(f"[base] {p.name} holds this run's outputs but is damaged ({'; '.join(damage)}): not copied",
                  flush=True)
            continue
        candidates.append((bool(report.get("reused_from")), p.name, p))
    return min(candidates)[2] if candidates else None


def copy_run(sibling: Path, stage: Path, cfg: RunConfig, resolved_config: str, chash: str,
             extra_files: dict[str, str]) -> dict[str, Any]:
    """The sibling's outputs into `stage` as this run's (its own marker, config.yaml, Hydra's files
    `extra_files` and pending report; `wall_s` the copy's, the decode's own time stays in eval's
    `seconds`; `reused_from` the run that decoded them); the report."""
    t0 = time.perf_counter()
    for p in sibling.iterdir():
        if p.name in OWN_FILES or p.name.startswith("."):
            continue
        (shutil.copytree if p.is_dir() else shutil.copy2)(p, stage / p.name)
    run_folder.write_marker(stage, cfg.run_key, chash)
    atomic_write_text(stage / "config.yaml", resolved_config)
    for name, text in extra_files.items():
        atomic_write_text(stage / name, text)
    report = outputs.read_report(sibling) or {}
    source = report.get("reused_from") or sibling.name
    report.update(budget=cfg.budget, overrides=cfg.overrides, config_hash=chash, reused_from=source,
                  files=outputs.line_counts(stage), wall_s=time.perf_counter() - t0)
    report.pop("wandb", None)  # the sibling's logged run, not this one's
    note = (f"[base] {cfg.method.name} decodes the same at every budget: {cfg.out_dir.name} takes the outputs of "
            f"{source} (same config but for budget, same code) instead of decoding; force=true decodes it")
    atomic_write_text(stage / "run.log", note + "\n")
    print(note, flush=True)
    outputs.write_report(stage, report, outputs.PENDING_REPORT)
    return report
