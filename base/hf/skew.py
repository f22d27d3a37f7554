"""Realistic routing for random-weight models: a per-expert router bias that shrinks the batch union.

A random router routes almost uniformly: at decode batch 16 the union of Qwen3-30B-A3B's top-8
choices is about 82 of 128 experts, where the trained model's is about 49 (OEA paper, mean decode
union at batch <= 16 on reasoning benchmarks: 0.6x the uniform union). Scaling the logits cannot
change that (top-k ignores a temperature); a popularity skew can. Each MoE layer gets a fixed
logit bias b_E = s * std(logits) * g_E, g_E ~ N(0, 1) seeded per layer, with s found by bisection so
that the dense union of 16-token batches of random input is `ratio` times the unbiased union.

The bias is part of the router: each block's router becomes a `SkewedRouter` that holds the
original's weight (the same parameter, under the same name) and the bias as a buffer, and the
Triton route_select path adds `router.logit_bias_E`, so every backend and selector sees the
same skewed routing. Only softmax-then-top-k routers without a bias of their own are skewed.

Shapes: N tokens, E experts, K top-k, G groups of 16 tokens, H hidden.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from base.hf.families import Family, MoeLayer, find_moe_layers

UNION_BATCH = 16


def batch_union(logits_NE: Tensor, k: int, groups_GB: Tensor) -> float:
    """Mean number of distinct top-k experts over the token groups (rows of groups_GB)."""
    idx_NK = logits_NE.topk(k, dim=-1).indices
    E = logits_NE.shape[-1]
    hit_GE = torch.zeros(groups_GB.shape[0], E, device=logits_NE.device)
    hit_GE.scatter_(1, idx_NK[groups_GB].reshape(groups_GB.shape[0], -1), 1.0)
    return float(hit_GE.sum(-1).mean())


def solve_bias(logits_NE: Tensor, k: int, ratio: float, seed: int, iters: int = 30) -> tuple[Tensor, float, float]:
    """(bias_E, unbiased union, biased union) for a target union ratio, by bisection on s."""
    N, E = logits_NE.shape
    gen = torch.Generator().manual_seed(seed)
    g_E = torch.randn(E, generator=gen).to(logits_NE.device)
    groups_GB = torch.randperm(N - N % UNION_BATCH, generator=gen).reshape(-1, UNION_BATCH).to(logits_NE.device)
    u0 = batch_union(logits_NE, k, groups_GB)
    target = ratio * u0
    scale = float(logits_NE.std())
    lo, hi = 0.0, 1.0
    while batch_union(logits_NE + hi * scale * g_E, k, groups_GB) > target and hi < 1e4:
        lo, hi = hi, 2 * hi
    for _ in range(iters):
        mid = (lo + hi) / 2
        if batch_union(logits_NE + mid * scale * g_E, k, groups_GB) > target:
            lo = mid
        else:
            hi = mid
    bias_E = hi * scale * g_E
    return bias_E, u0, batch_union(logits_NE + bias_E, k, groups_GB)


class SkewedRouter(nn.Module):
    """A softmax-then-top-k router with a fixed logit bias: the model's router, skewed. Holds the
    original's weight parameter (state dict keys unchanged) and its routing attributes."""

    def __init__(self, router: nn.Module, norm_topk: bool, bias_E: Tensor) -> None:
        super().__init__()
        self.weight = router.weight
        self.register_buffer("logit_bias_E", bias_E.to(router.weight.dtype), persistent=False)
        self.top_k, self.norm_topk = int(router.top_k), norm_topk
        self.num_experts = int(getattr(router, "num_experts", router.weight.shape[0]))
        self.routed_scaling_factor = float(getattr(router, "routed_scaling_factor", 1.0))

    def forward(self, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        z_TH = hidden_states.reshape(-1, self.weight.shape[-1]).to(self.weight.dtype)
        logits_TE = nn.functional.linear(z_TH, self.weight) + self.logit_bias_E
        probs_TE = torch.softmax(logits_TE, dim=-1, dtype=torch.float32)
        w_TK, idx_TK = probs_TE.topk(self.top_k, dim=-1)
        if self.norm_topk:
            w_TK = w_TK / w_TK.sum(-1, keepdim=True)
        w_TK = w_TK * self.routed_scaling_factor
        return logits_TE, w_TK.to(logits_TE.dtype), idx_TK


@torch.no_grad()
def skew_routing(model: nn.Module, family: Family, norm_topk: bool, ratio: float, seed: int = 0,
                 tokens: int = 1024) -> list[dict[str, float]]:
    """Give every MoE block a SkewedRouter so the dense batch-16 union is `ratio` x the uniform
    one. Returns per layer: the unbiased and biased union on the calibration tokens and the bias scale."""
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"routing skew ratio must be in (0, 1], got {ratio}")
    layers = find_moe_layers(model)
    for layer in layers:
        r = layer.router
        if type(r).__name__ not in family.softmax_topk_routers or getattr(r, "bias", None) is not None:
            raise ValueError(f"routing skew supports softmax/top-k routers without a bias; "
                             f"{type(r).__name__} is not one")
    logits = _router_logits(model, layers, tokens, seed)
    report = []
    for layer in layers:
        bias_E, u0, u1 = solve_bias(logits[layer.index], layer.top_k, ratio, seed + layer.index)
        block = model.get_submodule(layer.name)
        setattr(block, family.router_attr, SkewedRouter(layer.router, norm_topk, bias_E))
        report.append({"layer": layer.index, "union_uniform": u0, "union_skewed": u1,
                       "bias_std": float(bias_E.std())})
    return report


def _router_logits(model: nn.Module, layers: list[MoeLayer], tokens: int, seed: int) -> dict[int, Tensor]:
    """Each router's logits on random tokens (one dense forward), fp32."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    seq = 128
    ids = torch.randint(0, model.config.vocab_size, (max(1, tokens // seq), seq), generator=gen).to(device)
    captured: dict[int, Tensor] = {}
    handles = [
        layer.router.register_forward_hook(
            lambda mod, args, out, i=layer.index: captured.__setitem__(i, out[0].reshape(-1, out[0].shape[-1]).float()))
        for layer in layers
    ]
    try:
        model(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return captured
