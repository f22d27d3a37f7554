"""Decode throughput: time decode steps of the patched model for several batch sizes and budgets.

On CPU this is a smoke test of the whole decode path; GPU numbers come from `kernels/bench.py` and
the GPU throughput experiments. Timing: warm-up steps first, then device-synchronised wall time
over `steps` decode steps (CUDA events on a GPU).
Shapes: B sequences, P prompt length, V vocabulary.
"""
from __future__ import annotations

import inspect
import time
from collections.abc import Callable

import torch
from torch import nn
from transformers import DynamicCache

from base.config import ThroughputConfig
from base.patch import BudgetPatch


class _Timer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __enter__(self) -> _Timer:
        if self.cuda:
            torch.cuda.synchronize()
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self.end.record()
            torch.cuda.synchronize()
            self.seconds = self.start.elapsed_time(self.end) / 1e3
        else:
            self.seconds = time.perf_counter() - self.t0


def cache_kwarg(model: nn.Module) -> str:
    """transformers renamed `past_key_values` to `cache` (5.2x); accept both versions."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def time_decode(model: nn.Module, batch_size: int, cfg: ThroughputConfig, seed: int) -> float:
    """Seconds for `cfg.steps` greedy decode steps after a prefill and `cfg.warmup` untimed steps."""
    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    ids_BP = torch.randint(0, vocab, (batch_size, cfg.prompt_len), generator=gen).to(device)
    mask = torch.ones(batch_size, cfg.prompt_len + cfg.warmup + cfg.steps + 1, dtype=torch.long, device=device)
    kv = {cache_kwarg(model): DynamicCache(config=model.config)}
    out = model(input_ids=ids_BP, attention_mask=mask[:, : cfg.prompt_len], use_cache=True, **kv)
    pos = cfg.prompt_len
    nxt = out.logits[:, -1:].argmax(-1)

    def step() -> None:
        nonlocal pos, nxt
        pos += 1
        o = model(input_ids=nxt, attention_mask=mask[:, :pos], use_cache=True, **kv)
        nxt = o.logits[:, -1:].argmax(-1)

    for _ in range(cfg.warmup):
        step()
    with _Timer(device) as timer:
        for _ in range(cfg.steps):
            step()
    return timer.seconds


def measure(model: nn.Module, make_patch: Callable[[int | None], BudgetPatch], cfg: ThroughputConfig,
            seed: int) -> list[dict]:
    """One row per (batch size, budget): tokens/s, ms per step, mean union and kept experts."""
    rows = []
    for bs in cfg.batch_sizes:
        for budget in cfg.budgets:
            patch = make_patch(budget)
            # Fixed-length decoding: every row stays active, whatever tokens it emits.
            patch.ctx.pad_token_id, patch.ctx.eos_token_ids = None, ()
            try:
                seconds = time_decode(model, bs, cfg, seed)
                stats = [r for r in patch.stats_rows() if r["decode"]]
            finally:
                patch.remove()
            mean = lambda k: sum(r[k] for r in stats) / max(1, len(stats))
            rows.append({
                "batch_size": bs, "budget": budget, "steps": cfg.steps,
                "tokens_per_s": bs * cfg.steps / seconds, "ms_per_step": 1e3 * seconds / cfg.steps,
                "union_mean": mean("union"), "kept_mean": mean("kept"),
            })
    return rows
