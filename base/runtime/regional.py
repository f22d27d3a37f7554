"""Regional compilation of the decode step: each decoder layer's attention half (input norm,
attention, residual add, post-attention norm) goes through `torch.compile` as one region,
compiled once and shared by every layer.

    regions = RegionalCompile(model)
    with regions.enabled():                 # decode steps and the continuous engine's packed
        model(...)                          # prefills; else eager
    regions.remove()

Why regions and not the model: compiling the whole forward took minutes per batch size, and the
MoE block (selection hooks, Triton kernels) is already a handful of kernels. The attention and
norms of a decode step are dozens of small element-wise kernels per layer (RMSNorm's casts and
reductions, rotary's slices and concatenations, the mask): in a CUDA graph each still costs a
launch slot, and this is what bounded the non-expert part of the step. Fused by Inductor they are
a few kernels per layer.

Why the attention half and not its three modules: compiled one by one, the residual add between
attention and the post-attention norm ran as an eager kernel of its own; in one region Inductor
fuses it into the norm's reduction (one kernel per layer fewer in the graph). A layer qualifies
when its children are exactly those of the pre-norm decoder layer every supported family uses
(`HALF_LAYER_CHILDREN`); another layer's attention and norms are compiled module by module.
The layer's second residual add goes to the owned MoE block (base/hf/moe_block.py), whose expert
kernel adds it in its last launch where it can: one more launch per layer fewer.
The half is compiled with Inductor's combo kernels (independent kernels of a half, such as the q
and k norm + rotary and the cache writes, in one launch; GPU only). Both other forms lost their
A/Bs and were deleted (`throughput.regions`, issue 42; H200, batch 16, runs in the order a b b a):
with the modules compiled one by one the dense step took 1.015x and base M=16's 1.035x their time
with the half (results/roofline/grid_2026-12-02e), with the half but no combo kernels 1.007x and
1.013x (grid_2026-12-02f).
The half is compiled with `emulate_precision_casts`, so the norm reads the residual rounded to
the model's dtype, as the eager layer does (tests/test_attention.py compares the two).
On a GPU the region runs as three graphs, not one: dynamo stops at the tuned-table read of each
projection's `skinny_launch` (kernels/tuned.py). A constant lookup that made it one graph kept the
launches and lost its A/B (H200, batch 16: base M=16 +1.3 %, dense +0.5 %; Inductor fused the q/k
norm more slowly; kernels/NOTES.md), so the breaks stay.

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
from torch import Tensor, nn

from base.hf.moe_block import BudgetedMoE

# attribute names of the compiled modules: attention and the layer norms around it
REGION_ATTRS = ("self_attn", "input_layernorm", "post_attention_layernorm")
# a decoder layer with exactly these children runs norm -> attention -> add -> norm -> MoE -> add
HALF_LAYER_CHILDREN = frozenset({"input_layernorm", "self_attn", "post_attention_layernorm", "mlp"})
RECOMPILE_LIMIT = 64  # (batch sizes, packed prefill buckets and kinds) x (region kinds: attention, norm; sliding windows)
_COMPILED: dict[type | str, object] = {}  # one compiled forward per module class (and the half), shared
HALF = "half"  # _COMPILED's key of the attention half


def attention_half(layer: nn.Module, hidden_BSH: Tensor, kwargs: dict) -> tuple[Tensor, Tensor]:
    """A pre-norm decoder layer up to its MoE block, in the layer's own order: (the residual stream
    after attention, the MoE block's input)."""
    h_BSH, _ = layer.self_attn(hidden_states=layer.input_layernorm(hidden_BSH), **kwargs)
    hidden_BSH = hidden_BSH + h_BSH
    return hidden_BSH, layer.post_attention_layernorm(hidden_BSH)


# the profiler range of the half (base/runtime/profile.py's class "attention + norms": inside a
# compiled region the modules' own hooks do not run)
HALF_RANGE = "cls:attention + norms"


def half_layer_forward(layer: nn.Module, hidden_BSH: Tensor, kwargs: dict, half=attention_half) -> Tensor:
    """The decoder layer's forward with its attention half as one call (compiled by the engine)."""
    with torch.profiler.record_function(HALF_RANGE):
        hidden_BSH, h_BSH = half(layer, hidden_BSH, kwargs)
    fold = isinstance(layer.mlp, BudgetedMoE)  # the residual add in the expert kernel's last launch
    out = layer.mlp(h_BSH, residual_BSH=hidden_BSH) if fold else layer.mlp(h_BSH)
    out = out[0] if isinstance(out, tuple) else out  # GPT-OSS's block also returns its router scores
    return out if fold else hidden_BSH + out


def _half_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if {n for n, _ in m.named_children()} == HALF_LAYER_CHILDREN]


def _regions(model: nn.Module, skip: set[int]) -> list[nn.Module]:
    """Modules compiled one by one: the final norm, and attention and norms outside `skip`'s layers."""
    found = []
    for name, module in model.named_modules():
        attr = name.rsplit(".", 1)[-1]
        final_norm = attr == "norm" and name.count(".") == 1  # model.norm, not q_norm inside attention
        if (attr in REGION_ATTRS and id(module) not in skip) or final_norm:
            found.append(module)
    return found


class RegionalCompile:
    """Wraps the forward of each region module: compiled while `enabled()`, the original otherwise."""

    def __init__(self, model: nn.Module) -> None:
        for key in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, key):
                setattr(torch._dynamo.config, key, max(getattr(torch._dynamo.config, key), RECOMPILE_LIMIT))
        self.on = False
        self.layers = _half_layers(model)
        in_halves = {id(getattr(layer, attr)) for layer in self.layers for attr in REGION_ATTRS}
        self.modules = _regions(model, in_halves)
        if not self.modules and not self.layers:
            raise ValueError(f"no {REGION_ATTRS} modules to compile in {type(model).__name__}")
        if self.layers and HALF not in _COMPILED:
            _COMPILED[HALF] = torch.compile(attention_half, dynamic=False,
                                            options={"emulate_precision_casts": True, "combo_kernels": True})
        for layer in self.layers:

            def layer_forward(hidden_states, *args, _l=layer, _orig=layer.forward, **kwargs):
                if not self.on or args:
                    return _orig(hidden_states, *args, **kwargs)
                return half_layer_forward(_l, hidden_states, kwargs, _COMPILED[HALF])

            layer.forward = layer_forward
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
        for module in [*self.modules, *self.layers]:
            module.__dict__.pop("forward", None)
        self.modules, self.layers = [], []
