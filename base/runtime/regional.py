"""Regional compilation of the decode step: each decoder layer's attention and norms go through
`torch.compile`, compiled once and shared by every layer.

    regions = RegionalCompile(model)
    with regions.enabled():                 # decode steps only; prefill stays eager
        model(...)
    regions.remove()

Why regions and not the model: compiling the whole forward took minutes per batch size, and the
MoE block (selection hooks, Triton kernels) is already a handful of kernels. The attention and
norms of a decode step are dozens of small element-wise kernels per layer (RMSNorm's casts and
reductions, rotary's slices and concatenations, the mask): in a CUDA graph each still costs a
launch slot, and this is what bounded the non-expert part of the step. Fused by Inductor they are
a few kernels per layer.

Compiled once: transformers' decoder layers share one class, so every layer's attention runs the
same code object; dynamo guards on its inputs' shapes, not on the module. What would make a layer
different (a cache object indexed by `layer_idx`) is kept out: the engine's attention
(base/hf/attention.py) reads its K/V from the module's own buffers. A new batch size compiles again
(static shapes), hence the raised recompile limit.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

# attribute names of the compiled modules: attention and the layer norms around it
REGION_ATTRS = ("self_attn", "input_layernorm", "post_attention_layernorm")
RECOMPILE_LIMIT = 64  # (batch sizes) x (region kinds: attention, norm; sliding-window layers)
_COMPILED: dict[type, object] = {}  # one compiled forward per module class, shared by engines


def _regions(model: nn.Module) -> list[nn.Module]:
    found = []
    for name, module in model.named_modules():
        attr = name.rsplit(".", 1)[-1]
        final_norm = attr == "norm" and name.count(".") == 1  # model.norm, not q_norm inside attention
        if attr in REGION_ATTRS or final_norm:
            found.append(module)
    return found


class RegionalCompile:
    """Wraps the forward of each region module: compiled while `enabled()`, the original otherwise."""

    def __init__(self, model: nn.Module) -> None:
        for key in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, key):
                setattr(torch._dynamo.config, key, max(getattr(torch._dynamo.config, key), RECOMPILE_LIMIT))
        self.on = False
        self.modules = _regions(model)
        if not self.modules:
            raise ValueError(f"no {REGION_ATTRS} modules to compile in {type(model).__name__}")
        for module in self.modules:
            cls = type(module)
            if cls not in _COMPILED:
                _COMPILED[cls] = torch.compile(cls.forward, dynamic=False)

            def forward(*args, _m=module, _orig=module.forward, _comp=_COMPILED[cls], **kwargs):
                return _comp(_m, *args, **kwargs) if self.on else _orig(*args, **kwargs)

            module.forward = forward

    @contextmanager
    def enabled(self) -> Iterator[None]:
        self.on = True
        try:
            yield
        finally:
            self.on = False

    def remove(self) -> None:
        for module in self.modules:
            module.__dict__.pop("forward", None)
        self.modules = []
