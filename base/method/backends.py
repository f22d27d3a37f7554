"""How a policy's selection runs for one MoE layer: the PyTorch reference or the fused kernels.

    sel = make_selection("triton", policy, layer=3, num_experts=128, device=dev, router=SoftmaxTopK(...))
    decision = sel.select(batch)                  # after the model's own router
    batch, decision = sel.route(z_TH, active_T)   # router + selection in one launch (sel.fused_route)

    torch   base/method/routing.py with the selector's `keep`: every selector, branch-free, so a
            step that uses it can be captured in a CUDA graph too
    triton  kernels/: `select_step` after the model's router, or `route_select` in place of a
            softmax-then-top-k router's softmax/top-k (one launch per layer). Which selectors it
            runs is what they declare (`kernel_term`, `static_score`, base/method/selectors.py);
            the others, coverage and `reassign=similar` run the reference.

One object per layer, built when a model is budgeted: it holds that layer's tensors on the layer's
device (predictor, the fused [router; predictor] weight, energies, static scores), so a step
copies nothing. Everything here takes plain tensors; the MoE block (base/hf/moe_block.py) says
what its router is (`SoftmaxTopK`).

Shapes: T tokens, H hidden, E experts, K top-k.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from base.method.policy import Decision, Policy
from base.method.routing import RoutedBatch, reassign

KERNEL_REASSIGN = ("backfill", "drop")  # what the kernels reassign; `similar` runs the reference


@dataclass(frozen=True)
class SoftmaxTopK:
    """A router that computes softmax(z W^T + bias) -> top-k (-> renormalise) (* scale), no bias
    of its own: what `route_select` reproduces. bias_E is a skew (base/hf/skew.py), else None."""

    weight_EH: Tensor
    top_k: int
    norm_topk: bool
    scale: float = 1.0
    bias_E: Tensor | None = None


class TorchSelection:
    """The reference: the selector's `keep`, then `reassign`."""

    fused_route = False

    def __init__(self, policy: Policy, layer: int, device: torch.device) -> None:
        self.policy, self.layer, self.budget = policy, layer, policy.budget_of(layer)
        sim_LEE = policy.selector.artifacts.sim_LEE
        self.sim_EE = sim_LEE[layer].to(device) if (policy.reassign == "similar" and sim_LEE is not None) else None

    def select(self, batch: RoutedBatch) -> Decision:
        p, sel = self.policy, self.policy.selector
        keep_E, score_E = sel.keep(batch, self.budget if sel.uses_budget else None)
        idx_TK, w_TK = reassign(batch, keep_E, score_E, p.reassign, p.renormalize, self.sim_EE)
        return Decision(keep_E, idx_TK, w_TK)

    def route(self, z_TH: Tensor, active_T: Tensor) -> tuple[RoutedBatch, Decision]:
        raise NotImplementedError("the reference selects after the model's router (fused_route is False)")


class TritonSelection(TorchSelection):
    """kernels/: one launch per layer; `route` also does the router's softmax/top-k."""

    def __init__(self, policy: Policy, layer: int, num_experts: int, device: torch.device,
                 router: SoftmaxTopK | None) -> None:
        super().__init__(policy, layer, device)
        from kernels.score import fuse_router_predictor, prepare_predictor

        sel = policy.selector
        self.term = sel.kernel_term  # None for a static score
        self.router = router
        self.fused_route = router is not None
        self.extra: dict[str, Tensor] = {}  # per-layer kernel inputs, on the layer's device
        self.wcat_CH: Tensor | None = None  # base with fused_route: [router; predictor] weights
        if sel.static_score:
            self.extra["score_E"] = sel.static_score_E(layer, num_experts, device)
            return
        inputs = {k: v.to(device) for k, v in sel.kernel_inputs(layer).items()}
        if self.term == "base":
            self.extra["pred_b_E"] = inputs["pred_b_E"]
            if self.fused_route:  # the predictor rides in the router's GEMM
                self.wcat_CH = fuse_router_predictor(router.weight_EH, inputs["pred_w_HE"])
            else:  # select_step after the router gathers predictor rows
                self.extra["pred_w_EH"] = prepare_predictor(inputs["pred_w_HE"].float())
        else:
            self.extra.update(inputs)

    def select(self, batch: RoutedBatch) -> Decision:
        from kernels.step import select_step

        p = self.policy
        kw = dict(self.extra)
        if "score_E" in kw:  # a static score: select_step's `calib_freq` path takes it as freq_E
            kind, kw = "calib_freq", {"freq_E": kw["score_E"]}
        else:
            kind = self.term
        out = select_step(batch.probs_TE, batch.topk_idx_TK, batch.topk_w_TK, batch.active_T, kind, self.budget,
                          z_TH=batch.z_TH, reassign_mode=p.reassign, renormalize=p.renormalize, **kw)
        return Decision(out.keep_E, out.topk_idx_TK, out.topk_w_TK)

    def route(self, z_TH: Tensor, active_T: Tensor) -> tuple[RoutedBatch, Decision]:
        """The router's softmax/top-k and the selection in one launch; for `base` the predictor
        rides in the router's GEMM. Returns the model's own routing (for statistics) and the
        decision."""
        from kernels import fused_router_logits, route_select

        r, p = self.router, self.policy
        extra = dict(self.extra)
        if self.wcat_CH is not None:
            logits_TE, g_TE = fused_router_logits(z_TH, self.wcat_CH)
            extra["g_TE"] = g_TE
        else:
            logits_TE = nn.functional.linear(z_TH, r.weight_EH)
        if r.bias_E is not None:
            logits_TE = logits_TE + r.bias_E
        routing, out = route_select(
            logits_TE, r.top_k, active_T, self.budget, norm_topk=r.norm_topk, scale=r.scale,
            kind=self.term or "router_sum",  # a static score_E replaces the in-kernel score
            reassign_mode=p.reassign, renormalize=p.renormalize, **extra,
        )  # fmt: skip
        batch = RoutedBatch(z_TH, routing.probs_TE, routing.topk_idx_TK, routing.topk_w_TK, active_T, self.layer)
        return batch, Decision(out.keep_E, out.topk_idx_TK, out.topk_w_TK)


BACKENDS = ("torch", "triton")


def runs_on_kernels(policy: Policy) -> bool:
    """Can the kernels run this policy (its selector declares a kernel path; no coverage, no
    `similar` re-routing)?"""
    sel = policy.selector
    return (sel is not None and (sel.kernel_term is not None or sel.static_score) and sel.coverage is None
            and policy.reassign in KERNEL_REASSIGN)


def make_selection(backend: str, policy: Policy, layer: int, num_experts: int, device: torch.device,
                   router: SoftmaxTopK | None = None) -> TorchSelection:
    """The selection of one layer under `backend`. `router`: the layer's router when route_select
    may replace it (a plain softmax/top-k router, and no statistics that need the model's own
    router call); None keeps the model's router."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if backend == "triton" and runs_on_kernels(policy):
        return TritonSelection(policy, layer, num_experts, device, router)
    return TorchSelection(policy, layer, device)
