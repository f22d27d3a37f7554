"""Backends that execute a selection policy for one MoE layer and one step.

A policy is what to keep and how tokens are rerouted (selector, budget, reassign, renormalise);
a backend is how that runs:
    torch   base/method/routing.py, the reference; every selector
    triton  kernels/: `select_step` after the model's router, or `route_select` in place of a
            softmax-then-top-k router's own softmax/top-k (one launch per layer)
Everything a backend needs per layer is moved to the model's device when it is built (predictor
weights, the fused [router; predictor] weight, energies, frequencies): a step copies nothing. On a
model spread over GPUs (model.device_map=auto) the Triton backend's per-layer tensors sit on each
layer's own GPU; the torch backend's selectors move their layer's row per step.

Shapes: T tokens, H hidden, E experts, K top-k, L MoE layers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from base.hf.families import MoeLayer
from base.method.routing import RoutedBatch, pair_counts_E, reassign
from base.method.selectors import Selector

# Selectors with a Triton path (kernels.select_step); the others run the PyTorch reference.
TRITON_SELECTORS = ("router_sum", "router_sq", "count", "calib_freq", "calib_energy", "base", "fixed")
# ... all of which can also replace the router's own softmax/top-k (kernels.route_select).
ROUTE_SELECT_KINDS = TRITON_SELECTORS
# Selectors whose score is a fixed per-layer vector (the kernels take it as score_E).
STATIC_SCORES = ("calib_freq", "fixed")
# Routers route_select reproduces: softmax -> top-k (-> renormalise, scale), no bias.
ROUTE_SELECT_ROUTERS = ("Qwen3MoeTopKRouter", "Qwen2MoeTopKRouter", "OlmoeTopKRouter", "MixtralTopKRouter",
                        "DeepseekV2TopkRouter")


@dataclass
class Policy:
    """What a budgeted step keeps and how tokens are rerouted; `selector=None` is dense."""

    selector: Selector | None
    budget: int | None
    reassign: str = "backfill"
    renormalize: bool = True  # resolved for the model (renormalize=model|always|never)
    layer_budgets: dict[int, int] | None = None  # per-layer budgets (base/method/budget_split.py), else `budget`

    def budget_of(self, layer: int) -> int | None:
        return self.layer_budgets.get(layer, self.budget) if self.layer_budgets else self.budget


@dataclass
class Decision:
    keep_E: Tensor  # bool kept set
    topk_idx_TK: Tensor | None  # rerouted experts, None = the router's own
    topk_w_TK: Tensor | None


def dense_decision(batch: RoutedBatch) -> Decision:
    return Decision(pair_counts_E(batch.topk_idx_TK, batch.active_T, batch.num_experts) > 0, None, None)


class TorchBackend:
    """The PyTorch reference (base/method/routing.py); branch-free, so it can be captured too."""

    name = "torch"

    def __init__(self, policy: Policy, layers: list[MoeLayer], device: torch.device, energy: bool = False) -> None:
        self.policy, self.energy = policy, energy
        if policy.selector is not None:
            policy.selector.artifacts = policy.selector.artifacts.to(device)

    def select(self, batch: RoutedBatch) -> Decision:
        p = self.policy
        if p.selector is None:
            return dense_decision(batch)
        keep_E, score_E = p.selector.keep(batch, p.budget_of(batch.layer) if p.selector.uses_budget else None)
        sim_LEE = p.selector.artifacts.sim_LEE
        sim_EE = sim_LEE[batch.layer].to(batch.z_TH.device) if (p.reassign == "similar" and sim_LEE is not None) else None
        idx_TK, w_TK = reassign(batch, keep_E, score_E, p.reassign, p.renormalize, sim_EE)
        return Decision(keep_E, idx_TK, w_TK)

    def routes(self, layer: MoeLayer) -> bool:
        return False


class TritonBackend(TorchBackend):
    """kernels/ where the selector has a kernel; the PyTorch reference otherwise (oracle, oea)."""

    name = "triton"

    def __init__(self, policy: Policy, layers: list[MoeLayer], device: torch.device, energy: bool = False) -> None:
        super().__init__(policy, layers, device, energy)
        from kernels.score import fuse_router_predictor, prepare_predictor

        sel = policy.selector
        # coverage (an adaptive count) and `similar` re-routing have no kernel: PyTorch runs them
        kernel_ok = sel is not None and sel.coverage is None and policy.reassign in ("backfill", "drop")
        self.kind = sel.name if kernel_ok and sel.name in TRITON_SELECTORS else None
        self.per_layer: dict[int, dict[str, Tensor]] = {}
        self.wcat_CH: dict[int, Tensor] = {}  # base: [router; predictor] weights for route_select
        if self.kind is None:
            return
        art = sel.artifacts
        for layer in layers:
            L, row = layer.index, {}
            dev = layer.router.weight.device  # its own GPU when the model is spread over several
            if self.kind == "calib_freq":
                row["freq_E"] = art.freq_LE[L].float().to(dev)
            if self.kind == "fixed":  # lower id first, as base.method.selectors.Fixed
                row["freq_E"] = -torch.arange(layer.num_experts, dtype=torch.float32, device=dev)
            if self.kind == "calib_energy":
                row["energy_E"] = art.energy_LE[L].float().to(dev)
            if self.kind == "base":
                row["pred_b_E"] = art.pred_b_LE[L].float().to(dev)
                if self.routes(layer):  # the predictor rides in the router's GEMM
                    self.wcat_CH[L] = fuse_router_predictor(layer.router.weight, art.pred_w_LHE[L].to(dev))
                else:  # select_step after the router gathers predictor rows
                    row["pred_w_EH"] = prepare_predictor(art.pred_w_LHE[L].float().to(dev))
            self.per_layer[L] = row

    def select(self, batch: RoutedBatch) -> Decision:
        if self.kind is None:
            return super().select(batch)
        from kernels.step import select_step

        p, row = self.policy, self.per_layer[batch.layer]
        kind = "calib_freq" if self.kind in STATIC_SCORES else self.kind  # a static score_E
        out = select_step(batch.probs_TE, batch.topk_idx_TK, batch.topk_w_TK, batch.active_T, kind,
                          p.budget_of(batch.layer),
                          z_TH=batch.z_TH, reassign_mode=p.reassign, renormalize=p.renormalize, **row)
        return Decision(out.keep_E, out.topk_idx_TK, out.topk_w_TK)

    def routes(self, layer: MoeLayer) -> bool:
        """Can this layer's router forward be replaced by route_select (one launch)?"""
        router = layer.router
        return (
            self.kind in ROUTE_SELECT_KINDS and not self.energy and getattr(router, "bias", None) is None
            and getattr(router, "topk_method", "greedy") == "greedy"
            and type(router).__name__ in ROUTE_SELECT_ROUTERS
        )

    def route(self, layer: MoeLayer, z_TH: Tensor, active_T: Tensor,
              norm_topk: bool) -> tuple[RoutedBatch, Decision, Tensor]:
        """The router's softmax/top-k and the selection in one launch; for `base` the predictor
        rides in the router's GEMM. Returns the model's own routing (for statistics), the decision
        and the router logits."""
        from kernels import fused_router_logits, route_select

        router, L, p = layer.router, layer.index, self.policy
        row = self.per_layer[L]
        extra: dict[str, Tensor] = {}
        bias_E = getattr(router, "logit_bias_E", None)  # a skewed random router (base/hf/skew.py)
        if self.kind == "base":
            logits_TE, g_TE = fused_router_logits(z_TH, self.wcat_CH[L])
            extra = {"g_TE": g_TE, "pred_b_E": row["pred_b_E"]}
        else:
            logits_TE = nn.functional.linear(z_TH, router.weight)
            if self.kind == "calib_energy":
                extra = {"energy_E": row["energy_E"]}
            if self.kind in STATIC_SCORES:
                extra = {"score_E": row["freq_E"]}
        if bias_E is not None:
            logits_TE = logits_TE + bias_E
        routing, out = route_select(
            logits_TE, layer.top_k, active_T, p.budget_of(L), norm_topk=norm_topk,
            scale=float(getattr(router, "routed_scaling_factor", 1.0)),
            kind="router_sum" if self.kind in STATIC_SCORES else self.kind,
            reassign_mode=p.reassign, renormalize=p.renormalize, **extra,
        )  # fmt: skip
        batch = RoutedBatch(z_TH, routing.probs_TE, routing.topk_idx_TK, routing.topk_w_TK, active_T, L)
        return batch, Decision(out.keep_E, out.topk_idx_TK, out.topk_w_TK), logits_TE


BACKENDS = {"torch": TorchBackend, "triton": TritonBackend}
