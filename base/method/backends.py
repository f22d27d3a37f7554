"""How a policy's selection runs for one MoE layer: the PyTorch reference or the fused kernels.

    sel = make_selection("triton", policy, layer=3, num_experts=128, device=dev, router=SoftmaxTopK(...))
    decision = sel.select(batch)                  # after the model's own router
    batch, decision = sel.route(z_TH, active_T)   # router GEMM + selection in one launch (sel.fused_route)

    torch   base/method/routing.py with the selector's `keep`: every selector, branch-free, so a
            step that uses it can be captured in a CUDA graph too
    triton  kernels/select.py: one launch per layer for every selector that declares how the kernel
            ranks it (`kernel_term` or `static_score`, and `kernel_tier`: base/method/selectors.py),
            coverage and every reassign mode included. With a softmax-then-top-k router
            (`SoftmaxTopK`) it replaces what the router does after its GEMM (for `base` the GEMM
            runs over [router; predictor] rows, so the predictor costs no launch), else it follows
            the model's router. Only `oracle` (true norms) and selectors without a kernel
            declaration run the reference.

`DenseRoute` is the dense baseline on the same kernels: the router's GEMM, then softmax, top-k and
the union in one launch, and the kept list handed to the experts kernel.

One object per layer, built when a model is budgeted: it holds that layer's tensors on the layer's
device (predictor, the fused [router; predictor] weight, energies, static scores, similarity), so a
step copies nothing. Everything here takes plain tensors; the MoE
block (base/hf/moe_block.py) says what its router is (`SoftmaxTopK`).

Shapes: T tokens, H hidden, E experts, K top-k.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from base.method.policy import Decision, Policy
from base.method.routing import RoutedBatch, reassign

# Above this many tokens (prefill) the fused route is not used: its selection runs in one program.
FUSED_ROUTE_MAX_TOKENS = 128


@dataclass(frozen=True)
class SoftmaxTopK:
    """A router that computes softmax(z W^T + b) -> top-k (-> renormalise) (* scale): what the
    kernel reproduces. gemm_bias_E is the router's own bias (GPT-OSS), added in its GEMM as the
    model's F.linear adds it; bias_E is a skew (base/hf/skew.py), added in the kernel as the skewed
    router adds it; either may be None."""

    weight_EH: Tensor
    top_k: int
    norm_topk: bool
    scale: float = 1.0
    bias_E: Tensor | None = None
    gemm_bias_E: Tensor | None = None


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

    def routes(self, T: int) -> bool:
        return False

    def route(self, z_TH: Tensor, active_T: Tensor) -> tuple[RoutedBatch, Decision]:
        raise NotImplementedError("the reference selects after the model's router (fused_route is False)")


def _fused_call(router: SoftmaxTopK, weight_CH: Tensor, bias_C: Tensor | None, z_TH: Tensor, active_T: Tensor,
                budget: int | None, layer: int, **kw) -> tuple[RoutedBatch, Decision]:
    """The router's GEMM (for `base` over [router; predictor] rows, so g comes with the logits),
    then softmax, top-k and the selection in one kernel. The GEMM is cuBLAS's, or
    kernels/skinny.py's where this GPU's tuned table says that beat cuBLAS for the shape and token
    count (`python -m tools.bench_skinny --install`: its "router+pred" and "router" shapes). The
    one-launch form with the GEMM inside (`kernels.select.route_select_gemv`) measured slower on an
    H200: 19.1 against 17.3 us per layer at 16 tokens (benchmarks/kernels/v3/run1_bench.log,
    `gemv_rsum` against `route_rsum`), and on an H100 with its GEMM in 8 shares of H: base 19.8
    against 17.0 at 16 tokens, 86 against 20 at 64 (results/roofline/grid_2026-12-06e/, section 3:
    `python -m tools.bench_select --forms gemv`). `bias_C`: the GEMM's bias (the router's own, zeros
    for the predictor's rows), or None; with one the GEMM is cuBLAS's (the skinny kernel has none)."""
    from kernels.select import route_select
    from kernels.skinny import skinny_launch, skinny_linear

    E = router.weight_EH.shape[0]
    C, H = weight_CH.shape
    gemm = skinny_launch(C, H, z_TH.shape[0], z_TH.device) if bias_C is None else None
    if gemm is not None and z_TH.dtype == weight_CH.dtype:
        out_TC = skinny_linear(z_TH, weight_CH, gemm)
    else:
        out_TC = F.linear(z_TH, weight_CH, bias_C)
    logits_TE, g_TE = (out_TC[:, :E], out_TC[:, E:]) if weight_CH.shape[0] == 2 * E else (out_TC, None)
    # a skew's bias is added inside the kernel, in the weight dtype as the skewed router adds it (no launch)
    routing, out = route_select(logits_TE, router.top_k, active_T, budget, norm_topk=router.norm_topk,
                                scale=router.scale, g_TE=g_TE, logit_bias_E=router.bias_E, **kw)  # fmt: skip
    batch = RoutedBatch(z_TH, routing.probs_TE, routing.topk_idx_TK, routing.topk_w_TK, active_T, layer)
    return batch, Decision(out.keep_E, out.topk_idx_TK, out.topk_w_TK, out.keep_M)


class TritonSelection(TorchSelection):
    """kernels/select.py: one launch per layer; `route` also does the router's GEMM."""

    def __init__(self, policy: Policy, layer: int, num_experts: int, device: torch.device,
                 router: SoftmaxTopK | None) -> None:
        super().__init__(policy, layer, device)
        from kernels.score import fuse_router_predictor
        from kernels.select import Rule

        sel = policy.selector
        self.term = sel.kernel_term  # None for a static score
        self.rule = Rule(tier=sel.kernel_tier, k0=sel.k0 or 1, coverage=sel.coverage,
                         reassign_mode=policy.reassign, renormalize=policy.renormalize)
        self.router = router
        self.fused_route = router is not None
        self.extra: dict[str, Tensor] = {}  # per-layer kernel inputs, on the layer's device
        if self.sim_EE is not None:
            self.extra["sim_EE"] = self.sim_EE.float().contiguous()
        self.weight_CH = router.weight_EH if router is not None else None  # the router GEMM's rows
        self.bias_C = router.gemm_bias_E if router is not None else None  # and its bias
        if sel.static_score:
            self.extra["score_E"] = sel.static_score_E(layer, num_experts, device)
            return
        inputs = {k: v.to(device) for k, v in sel.kernel_inputs(layer).items()}
        if self.term == "base":
            self.extra["pred_b_E"] = inputs["pred_b_E"]
            if self.fused_route:  # the predictor rides in the router's GEMM (no bias on its rows)
                self.weight_CH = fuse_router_predictor(router.weight_EH, inputs["pred_w_HE"])
                if self.bias_C is not None:
                    self.bias_C = torch.cat([self.bias_C, self.bias_C.new_zeros(self.weight_CH.shape[0] - num_experts)])
            else:  # select_step after the router gathers predictor rows
                from kernels.score import prepare_predictor

                self.extra["pred_w_EH"] = prepare_predictor(inputs["pred_w_HE"].float())
        else:
            self.extra.update(inputs)

    def routes(self, T: int) -> bool:
        """Whether `route` serves a forward of T tokens (decode batches; prefill keeps the model's router)."""
        return self.fused_route and T <= FUSED_ROUTE_MAX_TOKENS

    def select(self, batch: RoutedBatch) -> Decision:
        from kernels.step import select_step

        kw = dict(self.extra)
        if "score_E" in kw:  # a static score: select_step's `calib_freq` path takes it as freq_E
            kind, kw = "calib_freq", {"freq_E": kw.pop("score_E"), **kw}
        else:
            kind = self.term
        budget = self.budget if self.policy.selector.uses_budget else None
        out = select_step(batch.probs_TE, batch.topk_idx_TK, batch.topk_w_TK, batch.active_T, kind, budget,
                          z_TH=batch.z_TH, rule=self.rule, **kw)
        return Decision(out.keep_E, out.topk_idx_TK, out.topk_w_TK, out.keep_M)

    def route(self, z_TH: Tensor, active_T: Tensor) -> tuple[RoutedBatch, Decision]:
        """The router's GEMM (for `base` over [router; predictor]), softmax/top-k and the
        selection in one launch. Returns the model's own routing (for statistics) and the decision."""
        from kernels.select import union_fits

        budget = self.budget if self.policy.selector.uses_budget else None
        E = self.router.weight_EH.shape[0]
        if union_fits(self.rule, budget, z_TH.shape[0], self.router.top_k, E):
            # nothing can be dropped: dense's route (no predictor rows, no score), the same decision
            sim = {"sim_EE": self.extra["sim_EE"]} if "sim_EE" in self.extra else {}
            return _fused_call(self.router, self.router.weight_EH, self.router.gemm_bias_E, z_TH, active_T, budget,
                               self.layer, rule=self.rule, **sim)
        return _fused_call(self.router, self.weight_CH, self.bias_C, z_TH, active_T, budget, self.layer,
                           kind=self.term or "router_sum", rule=self.rule, **self.extra)


class DenseRoute:
    """Dense on the kernels: the router in one launch, the whole union kept (no selection)."""

    fused_route = True

    def __init__(self, layer: int, router: SoftmaxTopK, device: torch.device) -> None:
        self.layer, self.router = layer, router

    def routes(self, T: int) -> bool:
        return T <= FUSED_ROUTE_MAX_TOKENS

    def route(self, z_TH: Tensor, active_T: Tensor) -> tuple[RoutedBatch, Decision]:
        return _fused_call(self.router, self.router.weight_EH, self.router.gemm_bias_E, z_TH, active_T, None,
                           self.layer)


BACKENDS = ("torch", "triton")


def runs_on_kernels(policy: Policy) -> bool:
    """Can the kernels run this policy (its selector declares how the kernel ranks it)?"""
    sel = policy.selector
    if sel is None or not (sel.kernel_term is not None or sel.static_score):
        return False
    return policy.reassign != "similar" or sel.artifacts.sim_LEE is not None


def make_selection(backend: str, policy: Policy, layer: int, num_experts: int, device: torch.device,
                   router: SoftmaxTopK | None = None) -> TorchSelection:
    """The selection of one layer under `backend`. `router`: the layer's router when the kernel may
    replace it (a plain softmax/top-k router, and no statistics that need the model's own router
    call); None keeps the model's router."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if backend == "triton" and runs_on_kernels(policy):
        return TritonSelection(policy, layer, num_experts, device, router)
    return TorchSelection(policy, layer, device)


def make_dense_route(backend: str, layer: int, device: torch.device, router: SoftmaxTopK | None) -> DenseRoute | None:
    """Dense's route on the kernels (backend triton with a softmax/top-k router), else None (the model's own)."""
    return DenseRoute(layer, router, device) if backend == "triton" and router is not None else None
