"""The run folder: outputs/<experiment>/<run name>/ with config.yaml, report.json and CSV tables.

Every file is written to a temporary name and renamed, so a reader never sees half a file; the
report is written last, so an interrupted run leaves no report and is not taken as finished.
"""
from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import Any

from base.files import atomic_write_text

REPORT = "report.json"
PENDING_REPORT = ".report.json.pending"  # a complete run's report until publish makes it the folder's


def write_table(path: Path, rows: list[dict[str, Any]]) -> None:
    import pandas as pd  # here, not at the top: run.py refuses a bad command line before pandas loads

    atomic_write_text(path, pd.DataFrame(rows).to_csv(index=False))


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """One JSON object per line (free text such as generations survives intact; pandas:
    `pd.read_json(path, lines=True)`)."""
    atomic_write_text(path, "".join(json.dumps(r, default=str) + "\n" for r in rows))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """write_jsonl's rows back ([] when the file is missing; a line cut by a kill is dropped)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            break
    return rows


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
                 # serve.search_* (2026-12-02) first: a serve run recorded before them keeps its hash too
                 ("serve", "search_steps"): 0, ("serve", "search_range"): [1.0, 64.0],
                 ("serve", "search_attainment"): 0.9,
                 ("serve",): {"rates": [None, 4.0, 16.0], "requests": 12, "repeats": 3, "slo_ttft_ms": 500.0,
                              "slo_tpot_ms": 25.0},
                 # issue 41 (2026-12-05): the calibration's floor per expert, method.shrink, the diagnostic
                 ("calibration", "tokens_per_expert"): 1024, ("method", "shrink"): None,
                 ("diagnose",): {"enabled": True, "prompts": 64, "prompt_len": 32, "gen_tokens": 16, "rules": None},
                 # scheduler.compile_prefill (2026-12-04) first: a run recorded before it keeps its hash
                 ("scheduler", "compile_prefill"): False,
                 # the continuous-batching engine before issue 26: padded prefill, a host sync per step
                 ("scheduler",): {"packing": "padded", "chunked": False, "chunk_tokens": 256,
                                  "buckets": [64, 128, 256, 512, 1024, 2048], "min_prompt_tokens": 1,
                                  "max_wait_steps": 0, "overlap": False}}
# Options deleted after runs were recorded with them, with the value that matches what runs now (an
# option that lost its A/B at its default, or one whose winning value became the only path): a run
# recorded with that value while the option existed is still the same config.
# Each is in base/config.py DELETED_KEYS too, which refuses it on the command line saying why.
REMOVED_OPTIONS = {("method", "route_in_select"): False,  # issue 42/44 (2026-12-05)
                   ("throughput", "pdl"): False,  # issue 42 item 4 (2026-12-05: lost its A/Bs)
                   # issue 42 item 5 (2026-12-06): layer and modules lost their A/Bs to layer_combo
                   ("throughput", "regions"): "layer_combo",
                   # issue 42 item 5 (2026-12-06): the eager prefill lost its A/B; true is what runs now
                   # (a run recorded at false, the default, hashed without it: LATER_OPTIONS)
                   ("scheduler", "compile_prefill"): True}


def _serves_continuously(cfg: dict[str, Any]) -> bool:
    """Does the run decode through the continuous-batching engine, the one user of `scheduler.*`?"""
    if cfg.get("stage") == "evaluate":
        return (cfg.get("eval") or {}).get("batching", "static") == "continuous"
    if cfg.get("stage") == "throughput":
        return (cfg.get("throughput") or {}).get("mode", "steps") in ("stream", "serve")
    return False


# Keys renamed after runs were recorded (issue 44), new path -> the path they were hashed under: a
# configuration is hashed with its keys where they were then, so a run recorded before keeps its hash.
RENAMED_OPTIONS = {("eval", "gen_tokens"): ("eval", "gen_toks"), ("eval", "max_gen_tokens"): ("eval", "max_gen_toks")}
# Keys moved into scheduler.* (issue 44), with the value runs had before: they were eval.* in an
# evaluation's config and stream.* in a throughput run's (the other group held these values).
MOVED_TO_SCHEDULER = {"admission": "fifo", "max_wait_rounds": 4}


def as_recorded(cfg: dict[str, Any]) -> dict[str, Any]:
    """The resolved configuration with RENAMED_OPTIONS and MOVED_TO_SCHEDULER back where runs were
    hashed (in place; a configuration already in that layout is returned as it is)."""
    for (group, new), (old_group, old) in RENAMED_OPTIONS.items():
        node = cfg.get(group)
        if isinstance(node, dict) and new in node:
            cfg.setdefault(old_group, {})[old] = node.pop(new)
    scheduler = cfg.get("scheduler")
    if isinstance(scheduler, dict) and MOVED_TO_SCHEDULER.keys() & scheduler.keys():
        home = "stream" if cfg.get("stage") == "throughput" else "eval"
        for key, before in MOVED_TO_SCHEDULER.items():
            value = scheduler.pop(key, before)
            for group in ("eval", "stream"):
                if isinstance(cfg.get(group), dict):
                    cfg[group][key] = value if group == home else before
    return cfg


def load_config(resolved_config: str) -> dict[str, Any]:
    """A resolved configuration (YAML) as a dict: libyaml's parser where PyYAML has it (the pure
    Python one took ~5 ms per config, and a rerun check hashes a config up to 17 ways)."""
    import yaml

    return yaml.load(resolved_config, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}


def config_hash(resolved_config: str, ignore: tuple[str, ...] = NON_SEMANTIC_KEYS) -> str:
    """Hash of the resolved configuration (YAML) with renamed and moved keys where runs recorded
    them (as_recorded), without the `ignore` keys, LATER_OPTIONS at their defaults, and
    `scheduler.*` where nothing serves through the continuous engine."""
    return _hash(load_config(resolved_config), ignore)


def _hash(cfg: dict[str, Any], ignore: tuple[str, ...]) -> str:
    """config_hash of a parsed configuration (changed in place: pass a copy)."""
    import hashlib

    cfg = {k: v for k, v in as_recorded(cfg).items() if k not in ignore}
    if not _serves_continuously(cfg):  # scheduler.* cannot change what it computes
        cfg.pop("scheduler", None)
    for path, default in LATER_OPTIONS.items():
        *parents, key = path
        node = cfg
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict) and key in node and node[key] == default:
            del node[key]
    return hashlib.sha1(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:12]


def same_config(resolved_config: str, recorded: str | None) -> bool:
    """Is a finished run's recorded hash this configuration's (also as hashed before issue 21, and
    with the REMOVED_OPTIONS it was recorded with)? No hash (an unfinished run: None; a report
    without one: "") is never this configuration's. The ways are tried in turn, up to the first that
    matches."""
    if not recorded:
        return False
    cfg = load_config(resolved_config)
    ways = chain([(cfg, NON_SEMANTIC_KEYS), (cfg, LEGACY_NON_SEMANTIC_KEYS)],
                 ((c, NON_SEMANTIC_KEYS) for c in _with_removed_options(cfg)))  # made as they are tried
    return any(_hash(copy.deepcopy(c), ignore) == recorded for c, ignore in ways)


def _with_removed_options(cfg: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The configuration as a run may have recorded it while REMOVED_OPTIONS existed, each at its
    value: once per nonempty set of them (they existed at different times, so a run may have had
    any of them). Copies; `cfg` is left as it is."""
    from itertools import combinations

    options = list(REMOVED_OPTIONS.items())
    for n in range(1, len(options) + 1):
        for subset in combinations(options, n):
            variant = copy.deepcopy(cfg)
            for path, value in subset:
                *parents, key = path
                node = variant
                for p in parents:
                    node = node.get(p) if isinstance(node, dict) else None
                if isinstance(node, dict):
                    node.setdefault(key, value)
            yield variant


def finished_hash(out_dir: Path) -> str | None:
    """The config hash of the finished run in out_dir ("" for a report without one), None if unfinished."""
    if not is_finished(out_dir):
        return None
    try:
        return json.loads((out_dir / REPORT).read_text()).get("config_hash", "")
    except (OSError, ValueError):
        return ""


COUNTED = ("*.jsonl", "*.csv")  # the run's tables: their line counts go into its report


def line_counts(out_dir: Path) -> dict[str, int]:
    """Lines of each table the run wrote (report.json's `files`)."""
    return {p.name: _lines(p) for pattern in COUNTED for p in sorted(out_dir.glob(pattern))}


def _lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def damaged(out_dir: Path) -> list[str]:
    """The tables of a finished run that are missing or hold another number of lines than its
    report recorded (a truncated samples.jsonl was skipped as finished); [] for reports from
    before the counts were recorded."""
    report = read_report(out_dir) or {}
    out = []
    for name, n in (report.get("files") or {}).items():
        path = out_dir / name
        if not path.exists():
            out.append(f"{name} is missing")
        elif _lines(path) != n:
            out.append(f"{name} has {_lines(path)} lines, its report says {n}")
    return out


def read_report(out_dir: Path) -> dict[str, Any] | None:
    """The finished run's report, or None (unfinished, or unreadable)."""
    try:
        return json.loads((out_dir / REPORT).read_text())
    except (OSError, ValueError):
        return None


def selection_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per MoE layer, over decode steps: mean union and kept experts (and the kept count's spread),
    weight retained, tokens that lost an expert, mean occupancy (rows decoding per step), and
    retained energy and the relative MoE-output error when recorded. A step with no active token
    (the continuous engine's last one, after its requests ended on the device) selects nothing and
    is left out: it would count as a step that kept 0 experts."""
    import pandas as pd

    if not rows:
        return []
    df = pd.DataFrame(rows)
    df = df[df["decode"]] if df["decode"].any() else df
    if "tokens" in df and (df["tokens"] > 0).any():
        df = df[df["tokens"] > 0]
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
    import pandas as pd

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
