"""The continuous engine's forwards on their own: its decode step with every slot decoding and its
packed prefill of the largest token bucket, each replayed back to back and profiled by kernel.

    row = probe_forwards(engine, prompts)   # {"full_step_ms", "kernels_per_layer", "prefill_ms", ...}

Why: inside a stream the decode step measured at least 35 % above the static engine's replay
(results/serve/README.md), and a burst's prefill runs several times over its compute floor. A
stream's step differs from a static one in two ways: the engine's own graph (per-row cache writes
and masks, each row's bookkeeping) and the stream around it (the host, the gaps between forwards,
fewer rows occupied). This measures the first alone, in the units of the throughput benchmark
(base/runtime/throughput.py):

  decode   every slot holds a prompt of at most `prompt_tokens` tokens (packed prefills of at most
           the largest bucket each); ms per replayed decode step over `steps` replays, then
           `profiled` eager steps (compiled regions as captured) by kernel class and name
           (base/runtime/profile.py). Decode attention reads every row up to the longest
           decoding row's slot, so the step grows with the context: the serving benchmark probes
           at the median context its stream's decode steps read
  prefill  the largest token bucket filled with prompt tokens (whole prompts, cut to fit); ms per
           replayed packed prefill over `prefills` replays, prompt tokens/s, one eager prefill by
           kernel class and name (columns prefixed `prefill_`)

On a CPU the figures check the bookkeeping, not speed.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from base.runtime.continuous import ContinuousEngine
from base.runtime.packing import Chunk


STEPS, PROFILED = 32, 3  # timed replays and profiled eager steps of the decode probe


def longest_context(engine: ContinuousEngine, steps: int = STEPS, profiled: int = PROFILED) -> int:
    """The longest prompt the decode probe can take: one packed prefill's bucket, and room in the
    cache for the probe's own steps (2 warm-up, `steps` timed, `profiled` eager, one spare)."""
    return min(engine.buckets[-1], engine.L - steps - profiled - 3)


def probe_forwards(engine: ContinuousEngine, prompts: list[list[int]], steps: int = STEPS, prompt_tokens: int = 64,
                   profiled: int = PROFILED, prefills: int = 5) -> dict[str, Any]:
    """The decode and prefill probes of the module doc; the engine is left reset (every slot empty)."""
    B, layers = engine.B, engine.model.config.num_hidden_layers
    longest = longest_context(engine, steps, profiled)
    if not 1 <= prompt_tokens <= longest:
        raise ValueError(f"prompt_tokens={prompt_tokens} must be in 1..{longest} "
                         f"(the largest token bucket, and the cache's {engine.L} slots less the probe's steps)")
    chunks = [Chunk(slot, prompts[slot % len(prompts)][:prompt_tokens], 0, True) for slot in range(B)]
    engine.reset(stop_at_eos=False)
    for round_ in _rounds(chunks, engine.buckets[-1]):
        engine.run_packed(round_, mixed=False)
    for _ in range(2):
        engine.step()
    row: dict[str, Any] = {"slots": B, "prompt_tokens": prompt_tokens,
                           "full_step_ms": _ms_per_run(engine, engine.step, steps)}
    names: list[dict] = []
    row.update(_profiled(engine, engine.step, profiled, layers, "", names, "decode"))

    fill = _fill(prompts, B, engine.buckets[-1])
    prefill = lambda: engine.run_packed(fill, mixed=False)
    engine.reset(stop_at_eos=False)
    prefill()  # the bucket's graph was captured by the warm-up; one replay first
    row["prefill_tokens"] = sum(len(c.ids) for c in fill)
    row["prefill_ms"] = _ms_per_run(engine, prefill, prefills)
    row["prefill_tokens_per_s"] = 1e3 * row["prefill_tokens"] / row["prefill_ms"]
    row.update(_profiled(engine, prefill, 1, layers, "prefill_", names, "prefill"))
    row["kernels"] = names
    engine.reset()
    return row


def _rounds(chunks: list[Chunk], bucket: int) -> list[list[Chunk]]:
    """Whole chunks in order, as few packed prefills of at most `bucket` tokens as that takes."""
    rounds: list[list[Chunk]] = [[]]
    used = 0  # tokens in the last round
    for c in chunks:
        if rounds[-1] and used + len(c.ids) > bucket:
            rounds.append([])
            used = 0
        rounds[-1].append(c)
        used += len(c.ids)
    return rounds


def _fill(prompts: list[list[int]], slots: int, bucket: int) -> list[Chunk]:
    """Whole prompts, one per slot, until the bucket is full (the last one cut to fit)."""
    chunks, used = [], 0
    for slot in range(slots):
        ids = prompts[slot % len(prompts)][: bucket - used]
        if not ids:
            break
        chunks.append(Chunk(slot, ids, 0, True))
        used += len(ids)
    return chunks


def _ms_per_run(engine: ContinuousEngine, run: Callable[[], Any], n: int) -> float:
    """Mean ms of `n` runs back to back: CUDA events around them on a GPU, the host's clock on a CPU."""
    if engine.device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / n
    t = time.perf_counter()
    for _ in range(n):
        run()
    return 1e3 * (time.perf_counter() - t) / n


def _profiled(engine: ContinuousEngine, run: Callable[[], Any], n: int, layers: int, prefix: str,
              names: list[dict], forward: str) -> dict[str, float]:
    """`n` runs with the engine's graphs off (the same kernels, launched one by one), by class:
    `<prefix><class>_ms` and `_kernels_per_layer`; each kernel name appended to `names`."""
    from base.runtime.profile import profile_steps

    enabled, engine.graphs.enabled = engine.graphs.enabled, False
    found: list[dict] = []
    try:
        classes = profile_steps(engine.model, lambda: [run() for _ in range(n)], n, found)
    finally:
        engine.graphs.enabled = enabled
    names += [{"forward": forward, **k, "kernels_per_layer": k["kernels_per_step"] / layers} for k in found]
    out = {f"{prefix}kernels_per_layer": classes["total"][1] / layers}
    for cls, (ms, count) in classes.items():
        key = prefix + cls.replace(" ", "_").replace("/", "_")
        out[f"{key}_ms"], out[f"{key}_kernels_per_layer"] = ms, count / layers
    return out
