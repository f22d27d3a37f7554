"""Triton kernels of the method, each beside its PyTorch reference (see kernels/README.md).

    score.py    score_experts: per-expert batch score (router_sum ... base), one launch
    select.py   select_reassign: top-M + backfill/renormalise, fixed shapes, one launch;
                route_select: the router's softmax/top-k and the selection in one launch
    experts.py  fused_experts: the kept experts' FFN, each weight byte read once per step
    step.py     select_step: one layer's selection from plain tensors
    attention.py decode_attention: split-KV decode attention over a static cache (the engine's)
    kv_write.py write_kv_rows: each row's new K/V at its own cache slot (continuous batching), one launch
CPU tensors run through Triton's interpreter (slow; tests), CUDA tensors compiled.
"""
from kernels.experts import ExpertsLayout, experts_reference, fused_experts
from kernels.score import (
    fuse_router_predictor,
    fused_router_logits,
    prepare_predictor,
    score_experts,
)
from kernels.select import Routing, Selection, route_select, select_reassign
from kernels.step import select_step

__all__ = [
    "ExpertsLayout",
    "Routing",
    "Selection",
    "experts_reference",
    "fuse_router_predictor",
    "fused_experts",
    "fused_router_logits",
    "prepare_predictor",
    "route_select",
    "score_experts",
    "select_reassign",
    "select_step",
]
