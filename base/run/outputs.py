"""The run folder: outputs/<experiment>/<run name>/ with config.yaml, report.json and CSV tables.

Every file is written to a temporary name and renamed, so a reader never sees half a file; the
report is written last, so an interrupted run leaves no report and is not taken as finished.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
from filelock import Timeout

from base.checks import ConfigError
from base.files import atomic_write_text, new_lock

REPORT = "report.json"
PENDING_REPORT = ".report.json.pending"  # a complete run's report until publish makes it the folder's


def write_table(path: Path, rows: list[dict[str, Any]]) -> None:
    atomic_write_text(path, pd.DataFrame(rows).to_csv(index=False))


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """One JSON object per line (free text such as generations survives intact; pandas:
    `pd.read_json(path, lines=True)`)."""
    atomic_write_text(path, "".join(json.dumps(r, default=str) + "\n" for r in rows))


def write_report(out_dir: Path, report: dict[str, Any], name: str = REPORT) -> None:
    atomic_write_text(out_dir / name, json.dumps(report, indent=2, default=str))


def is_finished(out_dir: Path) -> bool:
    return (out_dir / REPORT).exists()


# Keys that do not change what a run computes: changing them never makes a finished run stale.
NON_SEMANTIC_KEYS = ("force", "logger", "artifacts_dir", "outputs_dir", "exp_name", "allow_outside_outputs")
LEGACY_NON_SEMANTIC_KEYS = ("force", "logger")  # what runs finished before issue 21 left out of their hash
# Options added after runs were recorded, with the value every earlier run had: at that value they
# are left out of the hash, so a run finished before they existed keeps its hash (and is still
# skipped). eval.batching: every earlier run batched statically (continuous became the default).
LATER_OPTIONS = {("model", "device_map"): None, ("allow_outside_outputs",): False,
                 ("describe",): {"gpu_gb": 141}, ("eval", "batching"): "static",
                 ("eval", "admission"): "fifo", ("eval", "max_wait_rounds"): 4,
                 ("throughput", "mode"): "steps",
                 ("stream",): {"requests_per_slot": 8, "prompt_len": [128, 512], "output_len": [32, 256], "rate": None,
                               "admission": "fifo", "max_wait_rounds": 4, "stats_requests_per_slot": 2,
                               "lengths_from": None},
                 ("serve",): {"rates": [None, 4.0, 16.0], "requests": 12, "repeats": 3, "slo_ttft_ms": 500.0,
                              "slo_tpot_ms": 25.0}}


def config_hash(resolved_config: str, ignore: tuple[str, ...] = NON_SEMANTIC_KEYS) -> str:
    """Hash of the resolved configuration (YAML) without the `ignore` keys and LATER_OPTIONS at
    their defaults."""
    import hashlib

    import yaml

    cfg = {k: v for k, v in (yaml.safe_load(resolved_config) or {}).items() if k not in ignore}
    for path, default in LATER_OPTIONS.items():
        *parents, key = path
        node = cfg
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict) and key in node and node[key] == default:
            del node[key]
    return hashlib.sha1(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:12]


def same_config(resolved_config: str, recorded: str | None) -> bool:
    """Is a finished run's recorded hash this configuration's (also as hashed before issue 21)?"""
    return recorded in (config_hash(resolved_config), config_hash(resolved_config, LEGACY_NON_SEMANTIC_KEYS))


# A rerun writes its folder beside the finished one and swaps it in when complete (publish): a
# kill at any point leaves the previous result whole. Only the run's own folder is ever replaced: a
# marker written with the results names the run it holds (check_target). Every name below is built
# by plain string comparison, never as a glob pattern (a run name holds list brackets).
MARKER = ".base_run.json"  # {"run": the overrides that name the folder, "config_hash": ...}
HYDRA_FILES = (".hydra", "run.log")  # what Hydra wrote into a run folder before the run wrote its own
MAX_RUN_NAME = 120  # file systems allow 255 bytes per name; leave room for the .partial-<pid> suffixes


def run_name(overrides: str) -> str:
    """A run folder's name: its sorted overrides, "default" for none; a long one keeps a readable
    prefix and a hash of the whole (every override is in config.yaml and report.json). A path in an
    override value (model.path=/data/m) cannot lead the folder elsewhere: separators become '_'."""
    if not overrides:
        return "default"
    overrides = overrides.replace("/", "_").replace("\\", "_")
    if len(overrides) <= MAX_RUN_NAME:
        return overrides
    digest = hashlib.sha1(overrides.encode()).hexdigest()[:10]
    return f"{overrides[: MAX_RUN_NAME - 12].rstrip(',')}-{digest}"


def check_run_folder(what: str, folder: Path, outputs_dir: Path, allow_outside: bool,
                     protected: dict[str, Path]) -> None:
    """Where a run or sweep folder may go: below outputs_dir (anywhere else only with
    allow_outside_outputs=true), and never a folder that holds one of `protected` (the checkout,
    the working directory, outputs_dir, artifacts_dir: a run replaces its folder when it finishes)."""
    f, outputs = folder.resolve(), outputs_dir.resolve()
    for name, path in protected.items():
        path = path.resolve()
        if f == path or f in path.parents:
            raise ConfigError(f"{what}={folder} would make {f} a run folder, and it holds {name} ({path}); "
                              f"give a folder of its own below outputs_dir")
    if not allow_outside and outputs not in f.parents:
        raise ConfigError(f"{what}={folder} is outside outputs_dir={outputs_dir} ({outputs}): runs go below "
                          f"outputs_dir; set allow_outside_outputs=true to write to {f}")


def write_marker(folder: Path, run_key: str, chash: str) -> None:
    atomic_write_text(folder / MARKER, json.dumps({"run": run_key, "config_hash": chash}))


def _marker_run(folder: Path) -> str | None:
    try:
        return str(json.loads((folder / MARKER).read_text())["run"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_target(out_dir: Path, run_key: str) -> None:
    """Refuse a run folder that holds anything but a run of these overrides (run_key): a run never
    replaces what it did not make. Allowed: no folder, an empty one, one whose marker names this
    run, one holding only Hydra's files of a start that failed, and a finished run from before
    markers existed in the folder these overrides name."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ConfigError(f"run folder {out_dir} is a file; give a folder that is new, empty or a run of the same "
                          f"overrides")
    entries = sorted(p.name for p in out_dir.iterdir())
    if not entries or set(entries) <= set(HYDRA_FILES):
        return
    held = _marker_run(out_dir)
    if held == run_key:
        return
    if held is None and is_finished(out_dir) and out_dir.name == run_name(run_key):
        return  # a finished run of these overrides, made before run folders had a marker
    what = (f"the run of other overrides ({held or 'none'})" if held is not None else
            f"files that are not a run of these overrides ({', '.join(entries[:5])}{', ...' if len(entries) > 5 else ''})")
    raise ConfigError(f"run folder {out_dir} holds {what}; a run replaces only its own folder: give a new or empty "
                      f"folder (hydra.run.dir=..., or drop it for outputs_dir/exp_name/<overrides>)")


def _siblings(out_dir: Path, kind: str) -> list[Path]:
    """out_dir's own .<name>.<kind>-<pid> folders (kind: partial or old), by exact name."""
    prefix = f".{out_dir.name}.{kind}-"
    if not out_dir.parent.is_dir():
        return []
    return sorted(p for p in out_dir.parent.iterdir() if p.name.startswith(prefix) and p.name[len(prefix):].isdigit())


@contextmanager
def run_lock(out_dir: Path) -> Iterator[None]:
    """Hold the lock of one run folder (a file beside it) for the with-block: two runs of one
    folder never stage or publish at once; the second waits, and says so."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    lock = new_lock(out_dir.parent / f".{out_dir.name}.lock")
    try:
        lock.acquire(blocking=False)
    except Timeout:
        print(f"[base] another run of {out_dir} is in progress (lock {lock.lock_file}); waiting for it", flush=True)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def staging_dir(out_dir: Path) -> Path:
    """A fresh folder for the run's results, beside out_dir; leftovers of killed reruns go. Call it
    holding run_lock(out_dir): no other run of the folder is live then."""
    recover(out_dir)
    for stale in _siblings(out_dir, "partial"):
        shutil.rmtree(stale, ignore_errors=True)
    stage = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    stage.mkdir(parents=True)
    return stage


def recover(out_dir: Path) -> None:
    """Finish or undo a publish that was killed (call it holding run_lock(out_dir)). Killed after
    its second rename, out_dir holds the whole new result with the report still pending: the report
    is put in place. Killed after its first rename, the previous result is .<name>.old-<pid>: it is
    put back. Old folders of finished swaps go."""
    if (out_dir / PENDING_REPORT).exists() and not is_finished(out_dir):
        (out_dir / PENDING_REPORT).rename(out_dir / REPORT)
    for old in _siblings(out_dir, "old"):
        if not is_finished(out_dir) and is_finished(old):
            if out_dir.is_dir() and not any(out_dir.iterdir()):
                out_dir.rmdir()  # made empty by Hydra for the recovering run
            if not out_dir.exists():
                old.rename(out_dir)
                continue
        shutil.rmtree(old, ignore_errors=True)


def publish(stage: Path, out_dir: Path) -> None:
    """The complete new result replaces out_dir's (checked by check_target to be this run's own):
    two renames swap the folders, and the pending report becomes report.json last (until then no
    reader sees a report.json beside half a run; recover() finishes or undoes a killed swap)."""
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
    try:
        out_dir.rename(old)
    except FileNotFoundError:
        old = None
    stage.rename(out_dir)
    (out_dir / PENDING_REPORT).rename(out_dir / REPORT)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def remove_if_made(out_dir: Path, new_folders: list[Path], started: float) -> None:
    """After a failed start: the run folder, if empty and made by this command (below a folder that
    was missing when it started, or, for a sweep's point, created since), and the folders above it
    that were missing, if empty. Nothing that existed before the command is removed."""
    made = [p for p in new_folders if out_dir == p or p in out_dir.parents]
    try:
        if not any(out_dir.iterdir()) and (made or out_dir.stat().st_ctime >= started):
            out_dir.rmdir()
    except OSError:
        return
    for folder in sorted((p for p in made if p != out_dir), key=lambda p: len(p.parts), reverse=True):
        try:
            folder.rmdir()  # only an empty one
        except OSError:
            return


def finished_hash(out_dir: Path) -> str | None:
    """The config hash of the finished run in out_dir ("" for a report without one), None if unfinished."""
    if not is_finished(out_dir):
        return None
    try:
        return json.loads((out_dir / REPORT).read_text()).get("config_hash", "")
    except (OSError, ValueError):
        return ""


def selection_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per MoE layer, over decode steps: mean union and kept experts (and the kept count's spread),
    weight retained, tokens that lost an expert, mean occupancy (rows decoding per step), and
    retained energy and the relative MoE-output error when recorded."""
    if not rows:
        return []
    df = pd.DataFrame(rows)
    df = df[df["decode"]] if df["decode"].any() else df
    sums = df.groupby("layer").sum(numeric_only=True)
    out = pd.DataFrame({
        "union_mean": df.groupby("layer")["union"].mean(),
        "kept_mean": df.groupby("layer")["kept"].mean(),
        # the distribution over steps, for adaptive budgets (coverage) where the count varies
        "kept_min": df.groupby("layer")["kept"].min(),
        "kept_p50": df.groupby("layer")["kept"].median(),
        "kept_p90": df.groupby("layer")["kept"].quantile(0.9),
        "kept_max": df.groupby("layer")["kept"].max(),
        **({"executed_mean": df.groupby("layer")["executed"].mean()} if "executed" in df else {}),
        "weight_retained": sums["weight_kept"] / sums["weight_total"].clip(lower=1e-30),
        "tokens_lost_frac": sums["tokens_lost"] / sums["tokens"].clip(lower=1),
        "occupancy_mean": df.groupby("layer")["tokens"].mean(),  # active rows per step: requests decoding
        "steps": df.groupby("layer")["step"].nunique(),
    })
    if "energy_kept" in df:
        out["energy_retained"] = sums["energy_kept"] / sums["energy_total"].clip(lower=1e-30)
    if "out_err" in df:  # ratio of sums: the relative error of the layer's MoE output over the run
        out["out_error"] = sums["out_err"] / sums["out_dense"].clip(lower=1e-30)
    return out.reset_index().to_dict("records")


def overall(summary: list[dict[str, Any]]) -> dict[str, float]:
    if not summary:
        return {}
    df = pd.DataFrame(summary)
    return {k: float(df[k].mean()) for k in df.columns if k not in ("layer", "steps")}


# The metric that stands for a task in the summary, in order of preference, and its filter.
SUMMARY_METRICS = ("exact_match", "acc", "pass@1", "pass_at_1", "f1", "acc_norm")
SUMMARY_FILTERS = ("strict-match", "none")


def summary_accuracy(metrics: list[dict[str, Any]], top_level: list[str]) -> tuple[float | None, list[dict]]:
    """Mean of one named metric per top-level task or group (as the task config lists them).

    A group stands for its members (lm-eval's group score); a plain task for itself. Returns the
    mean and the rows that entered it, so a report says exactly what was averaged."""
    used = []
    for name in top_level:
        rows = [r for r in metrics if r["task"] == name]
        rank = lambda r: (SUMMARY_METRICS.index(r["metric"]) if r["metric"] in SUMMARY_METRICS else len(SUMMARY_METRICS),
                          SUMMARY_FILTERS.index(r["filter"]) if r["filter"] in SUMMARY_FILTERS else len(SUMMARY_FILTERS))
        rows = sorted(rows, key=rank)
        if rows:
            used.append({k: rows[0][k] for k in ("task", "metric", "filter", "value")})
    mean = sum(r["value"] for r in used) / len(used) if used else None
    return mean, used
