"""The continuous engine's decode step on its own: every slot decoding, replayed back to back, and
its kernels by class.

    row = probe_decode_step(engine, requests)   # {"full_step_ms", "kernels_per_layer", "<class>_ms", ...}

Why: inside a stream the decode step measured at least 35 % above the static engine's replay
(results/serve/README.md). A stream's step differs from a static one in two ways: the engine's own
graph (per-row cache writes and masks, each row's bookkeeping) and the stream around it (the host,
the gaps between forwards, fewer rows occupied). This measures the first alone, in the units of the
throughput benchmark (base/runtime/throughput.py): ms per replayed step with all B slots decoding a
short prompt, and the kernels of the same step run eagerly (compiled regions as captured), by class
(base/runtime/profile.py). On a CPU the figures check the bookkeeping, not speed.
"""
from __future__ import annotations

import time
from typing import Any

import torch

from base.runtime.continuous import ContinuousEngine
from base.runtime.packing import Chunk


def probe_decode_step(engine: ContinuousEngine, prompts: list[list[int]], steps: int = 32,
                      prompt_tokens: int = 64, profiled: int = 3) -> dict[str, Any]:
    """Fill every slot with a prompt of at most `prompt_tokens` tokens (one packed prefill, a
    captured shape), time `steps` replays of the decode step, profile `profiled` eager steps; the
    engine is left reset (every slot empty)."""
    from base.runtime.profile import profile_steps

    B = engine.B
    chunks = [Chunk(slot, prompts[slot % len(prompts)][:prompt_tokens], 0, True) for slot in range(B)]
    if sum(len(c.ids) for c in chunks) > engine.buckets[-1]:
        raise ValueError(f"{B} prompts of {prompt_tokens} tokens exceed the largest token bucket {engine.buckets[-1]}")
    engine.reset(stop_at_eos=False)
    engine.run_packed(chunks, mixed=False)
    for _ in range(2):
        engine.step()
    cuda = engine.device.type == "cuda"
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            engine.step()
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end) / steps
    else:
        t = time.perf_counter()
        for _ in range(steps):
            engine.step()
        ms = 1e3 * (time.perf_counter() - t) / steps

    def eager_steps() -> None:
        with torch.no_grad():
            for _ in range(profiled):
                engine._step()

    names: list[dict] = []
    classes = profile_steps(engine.model, eager_steps, profiled, names)
    layers = engine.model.config.num_hidden_layers
    engine.reset()
    row: dict[str, Any] = {"slots": B, "prompt_tokens": prompt_tokens, "full_step_ms": ms,
                           "kernels_per_layer": classes["total"][1] / layers,
                           "kernels": [{**k, "kernels_per_layer": k["kernels_per_step"] / layers} for k in names]}
    for cls, (cls_ms, n) in classes.items():
        key = cls.replace(" ", "_").replace("/", "_")
        row[f"{key}_ms"], row[f"{key}_kernels_per_layer"] = cls_ms, n / layers
    return row
