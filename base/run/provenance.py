"""What made a run's outputs: the code's commit and the engine settings that change them, with a
short fingerprint every committed table carries (`report.json` key `provenance`).

    provenance(cfg, root, stop_mode="device", engine_path="continuous")
    # {"commit": "1766e8a", "dirty": False, "engine": {...settings...}, "fingerprint": "c3-packed-cpu"}

The fingerprint names the decode engine by what changes its outputs, readable on its own:

    c<V>-<packing>[+chunk<N>][+wait<T>/<S>][+cprefill][-hoststops]-<device>   continuous batching
                  (+cprefill: packed prefills through the compiled regions, on a GPU since 2026-12-06)
    s<V>-<engine|generate>-<device>                                           static batching
    t<V>-<device>                                                              throughput runs (timing only)

V is the engine's version, bumped when the same config decodes differently:

    continuous 1  before issue 26: no scheduler; prompts left-padded; the host read every step
                  before launching the next (stops exact, a freed slot refilled at once)
    continuous 2  issue 26: packed prefill; with scheduler.overlap (default) the host read step i
                  after launching i+1: a stop string ended its request one step late and a slot it
                  freed was refilled a step later; overlap=false synced (`c2s`)
    continuous 3  issue 40: EOS, limits and stop strings end a row on the device in the step that
                  made its last token; the host acts one forward behind with overlap on or off, so
                  the schedule never depends on host timing (overlap is timing only, not in the
                  fingerprint); `-hoststops` where some stop string could only be checked on the host
    static 1      the static batches (unchanged since the engine's first version)

On a GPU, `kernel_table` names the tuned-launch table the kernels read (file, hash, entries).
`scheduler.overlap`, the table and the commit are recorded, not fingerprinted: neither changes outputs. The
device type is (CPU and GPU round differently). analysis/engines.py reads the fingerprint back,
and names the engine of runs recorded before it existed from their config.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from base.checks import ConfigError

CONTINUOUS_VERSION = 3
STATIC_VERSION = 1
THROUGHPUT_VERSION = 1


NAMED_COMMIT = "BASE_COMMIT"  # a device machine's copy of .git can be older than the tree it runs


def named_commit() -> str | None:
    """BASE_COMMIT, when set: the commit a run names instead of git's HEAD (a GPU call passes the
    host's HEAD, e.g. `BASE_COMMIT=d85acdf bash experiments/gpu/roofline.sh`); ConfigError unless
    it is 7 to 40 hex digits, so a run with a bad value is refused at start (preflight)."""
    value = os.environ.get(NAMED_COMMIT, "").strip()
    if value and not re.fullmatch(r"[0-9a-f]{7,40}", value):
        raise ConfigError(f"{NAMED_COMMIT}={value!r} is not a commit: give 7 to 40 hex digits "
                         f"(git rev-parse --short HEAD), or unset it")
    return value or None


def commit(root: Path) -> dict[str, Any]:
    """The checkout's commit (short) and whether tracked files differ from it; None outside git.
    With BASE_COMMIT set, that commit, `dirty` unknown (None) and `commit_from` saying so."""
    if (named := named_commit()) is not None:
        return {"commit": named, "dirty": None, "commit_from": NAMED_COMMIT}
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=root, capture_output=True,
                               timeout=10).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": sha or None, "dirty": dirty if sha else None}


def fingerprint(engine: dict[str, Any]) -> str:
    """The short name of an engine's settings (see the module doc)."""
    device = engine["device"]
    if engine["kind"] == "throughput":
        return f"t{engine['version']}-{device}"
    if engine["kind"] == "static":
        return f"s{engine['version']}-{engine['path']}-{device}"
    name = f"c{engine['version']}-{engine['packing']}"
    if engine.get("chunked"):
        name += f"+chunk{engine['chunk_tokens']}"
    if engine.get("min_prompt_tokens", 1) > 1 or engine.get("max_wait_steps", 0) > 0:
        name += f"+wait{engine['min_prompt_tokens']}/{engine['max_wait_steps']}"
    if engine.get("compile_prefill"):
        name += "+cprefill"
    if engine.get("stop_mode") == "host":
        name += "-hoststops"
    return f"{name}-{device}"


def engine_settings(cfg, device: str, path: str, stop_mode: str | None = None,
                    compiled_prefill: bool = False) -> dict[str, Any]:
    """The settings that decide a run's outputs (`path`: continuous | engine | generate |
    throughput: what decoded it; `compiled_prefill`: whether the continuous engine's packed prefills
    ran through its compiled regions, as they do wherever it compiles them: a GPU's kernels round
    differently from the eager ones)."""
    device = device.split(":")[0]
    if path == "throughput":
        return {"kind": "throughput", "version": THROUGHPUT_VERSION, "device": device}
    if path != "continuous":
        return {"kind": "static", "version": STATIC_VERSION, "path": path, "device": device}
    s = cfg.scheduler
    return {"kind": "continuous", "version": CONTINUOUS_VERSION, "device": device, "packing": s.packing,
            "chunked": s.chunked, "chunk_tokens": s.chunk_tokens, "buckets": list(s.buckets),
            "min_prompt_tokens": s.min_prompt_tokens, "max_wait_steps": s.max_wait_steps,
            "compile_prefill": compiled_prefill, "stop_mode": stop_mode or "device",
            "admission": s.admission, "overlap": s.overlap}


def kernel_table(device: str) -> dict[str, Any] | None:
    """On a GPU, the tuned-launch table this run's kernels read (kernels/tuned.py `table_record`):
    recorded, not fingerprinted (it changes timings, not what the engine decodes)."""
    if not device.startswith("cuda"):
        return None
    import torch

    from kernels.tuned import device_name, table_record

    return table_record(device_name(torch.device(device)))


def provenance(cfg, device: str, path: str, stop_mode: str | None = None,
               compiled_prefill: bool = False) -> dict[str, Any]:
    engine = engine_settings(cfg, device, path, stop_mode, compiled_prefill)
    out = {**commit(cfg.root), "engine": engine, "fingerprint": fingerprint(engine)}
    if (table := kernel_table(device)) is not None:
        out["kernel_table"] = table
    return out
