"""The project's own sparse-MoE block: router -> selection -> experts -> shared experts, in one forward.

When a model is budgeted (base/hf/budget.py), each family's sparse-MoE block is replaced by a
`BudgetedMoE` that holds the original's router, experts and shared experts as children under the
same names (state dict keys, device maps and the experts implementation are unchanged) and runs
the block itself, as gpt-fast's MOEFeedForward and vLLM's FusedMoE layer do:

    x_TH = hidden_BSH.reshape(-1, H)
    route: the model's router, or the fused kernel in its place (router GEMM + softmax/top-k
           + selection in one launch; dense too, on method.backend=triton)
    select: the layer's selection (base/method/backends.py), when this forward selects
    record: the step's statistics into the forward's recorder, when it records
    y_TH = experts(x_TH, idx_TK, w_TK)                     # transformers' or base_triton; with the
           kernel's kept list and base_triton, the two-launch expert kernel directly
    the family's shared experts, and the block's shape back: with base_triton at decode sizes, the
           shared MLP as chunks of the routed shape in the same kernel, the routed output its
           residual (base/hf/shared_experts.py); else the family's own combine

What a forward needs comes in explicitly: whoever drives the forward (the decode engine, the
generate loop, the fidelity pass) makes a `StepInputs` and hands it to every block for that
forward (`MoeBudget.bound`). Without one the block is the model's own: its routing, nothing
recorded. Dense is this block with no selection.

Shapes: B sequences, S positions, T = B*S tokens, H hidden, E experts, K top-k.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from base.hf.experts_impl import kept_experts_forward
from base.hf.families import Family
from base.hf.shared_experts import SharedChunks, applies, constant_routing, seat
from base.method.backends import DenseRoute, TorchSelection
from base.method.policy import Decision, dense_decision
from base.method.recorder import StatsRecorder
from base.method.routing import RoutedBatch, step_stats


@dataclass(frozen=True)
class StepInputs:
    """What every MoE block needs to know about one model forward."""

    active_T: Tensor  # bool: rows that score and join the union (not padding, not finished, not ended)
    select: bool  # run the layer's selection (a budgeted decode step; every forward with apply_to=all)
    recorder: StatsRecorder | None  # where this forward's selection statistics go; None: nowhere
    decode: bool = True  # the kind of the recorded row
    observe: Callable[[int, RoutedBatch, Decision], None] | None = None  # sees each layer's routing and
    # the selection's decision (a probe, or a trace of the decode steps: eager only, a CUDA graph replays none)


def expert_norms_TK(experts: nn.Module, z_TH: Tensor, idx_TK: Tensor) -> Tensor:
    """||E_u(z_t)|| for every routed pair, through the experts module's own implementation.

    Each (t, u) pair becomes one row routed to u alone with weight 1, so the output row is E_u(z_t).
    """
    T, K = idx_TK.shape
    x_PH = z_TH.repeat_interleave(K, dim=0)
    w_P1 = torch.ones(T * K, 1, dtype=z_TH.dtype, device=z_TH.device)
    out_PH = experts(x_PH, idx_TK.reshape(-1, 1), w_P1)
    return out_PH.float().norm(dim=-1).reshape(T, K)


def output_error(experts: nn.Module, batch: RoutedBatch, decision: Decision) -> tuple[Tensor, Tensor]:
    """(sum ||y_budget - y_dense||^2, sum ||y_dense||^2) over the active tokens of one layer and step,
    y the routed experts' output (shared experts, equal in both, left out). Runs the experts twice."""
    y_dense_TH = experts(batch.z_TH, batch.topk_idx_TK, batch.topk_w_TK).float()
    active_T1 = batch.active_T[:, None]
    dense = torch.where(active_T1, y_dense_TH, 0.0).pow(2).sum()
    if decision.topk_idx_TK is None:  # the router's own routing: no error
        return dense.new_zeros(()), dense
    y_budget_TH = experts(batch.z_TH, decision.topk_idx_TK, decision.topk_w_TK.to(batch.topk_w_TK.dtype)).float()
    err = torch.where(active_T1, y_budget_TH - y_dense_TH, 0.0).pow(2).sum()
    return err, dense


class BudgetedMoE(nn.Module):
    """A family's sparse-MoE block, owned (see the module doc). `selection` None: dense."""

    def __init__(self, block: nn.Module, index: int, family: Family, selection: TorchSelection | None,
                 dense_route: DenseRoute | None = None) -> None:
        super().__init__()
        missing = [n for n in family.block_children if not isinstance(getattr(block, n, None), nn.Module)]
        if missing:
            raise ValueError(f"{type(block).__name__} has no {', '.join(missing)}: not a {family.model_type} MoE block")
        for name, child in block.named_children():  # the original's parts, in its order, under their names
            setattr(self, name, child)
        self.index, self.family, self.selection = index, family, selection
        self.dense_route = dense_route  # dense on the kernels (selection None, backend triton)
        self.step: StepInputs | None = None  # this forward's inputs (MoeBudget.bound)
        self._seat_shared()

    def _seat_shared(self) -> None:
        """The shared MLP's gate and up as one block (same values, keys and memory), and the
        constant routing its kernel call reads (buffers outside the state dict)."""
        chunks = None
        if self.family.shared_mlp is not None and seat(getattr(self, self.family.shared_mlp)):
            chunks = self._shared_chunks()
        self.shared_C = 0 if chunks is None else chunks.C
        if chunks is not None:
            idx_TC, ones_TC, keep_C = constant_routing(chunks.C, chunks.gate_CIH.device, chunks.gate_CIH.dtype)
            self.register_buffer("shared_idx_TC", idx_TC, persistent=False)
            self.register_buffer("shared_ones_TC", ones_TC, persistent=False)
            self.register_buffer("shared_keep_C", keep_C, persistent=False)

    def _shared_chunks(self) -> SharedChunks | None:
        experts = self.experts
        I = experts.down_proj.shape[1 if getattr(experts, "is_transposed", False) else 2]
        gate = getattr(self, self.family.shared_gate) if self.family.shared_gate else None
        return SharedChunks.of(getattr(self, self.family.shared_mlp), I, gate)

    def forward(self, hidden_BSH: Tensor, residual_BSH: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """The block's output; with `residual_BSH` (the decoder layer's residual stream, what
        base/runtime/regional.py passes), residual + output, in the expert kernel's last launch
        where it can (the kernel's kept list; with shared experts, only when they run in the kernel
        too, base/hf/shared_experts.py), else as the layer would add it."""
        x_TH = hidden_BSH.reshape(-1, hidden_BSH.shape[-1])
        idx_TK, w_TK, keep_M = self.route(x_TH, self.step)
        shared = self._shared_chunks() if self.shared_C and applies(self.experts, x_TH.shape[0]) else None
        fold = residual_BSH is not None and (not self.family.shared or shared is not None)
        y_TH = self.run_experts(x_TH, idx_TK, w_TK, keep_M, residual_BSH.reshape(x_TH.shape) if fold else None)
        if shared is not None:
            y_TH = self.run_shared(shared, x_TH, y_TH)
        if fold or shared is not None:
            out_BSH = y_TH.view(hidden_BSH.shape)
        else:
            out_BSH = self.family.combine(self, hidden_BSH, x_TH, y_TH)
            if residual_BSH is not None:
                out_BSH = residual_BSH + out_BSH
        return (out_BSH, w_TK) if self.family.returns_router_scores else out_BSH

    def run_experts(self, x_TH: Tensor, idx_TK: Tensor, w_TK: Tensor, keep_M: Tensor | None,
                    residual_TH: Tensor | None = None) -> Tensor:
        """The routed experts' output: with the kernel's kept list and base_triton, the expert kernel
        (kernels/experts.py) directly; else the experts module as the model runs it. With
        `residual_TH`, residual + output (added in the kernel's last launch when it runs)."""
        y_TH = None if keep_M is None else kept_experts_forward(self.experts, x_TH, idx_TK, w_TK, keep_M, residual_TH)
        if y_TH is not None:
            return y_TH
        y_TH = self.experts(x_TH, idx_TK, w_TK)
        return y_TH if residual_TH is None else residual_TH + y_TH

    def run_shared(self, shared: SharedChunks, x_TH: Tensor, routed_TH: Tensor) -> Tensor:
        """routed_TH (the routed output, the residual added where it was) + the shared experts'
        output, added in the shared kernel's last launch."""
        return shared.forward(x_TH, routed_TH, self.shared_idx_TC, self.shared_ones_TC, self.shared_keep_C)

    def route(self, x_TH: Tensor, step: StepInputs | None) -> tuple[Tensor, Tensor, Tensor | None]:
        """(topk_idx_TK, topk_w_TK, keep_M) the experts run: the router's own, or the selection's;
        keep_M the kernel's kept list (None when no kernel made one)."""
        router = self._modules[self.family.router_attr]
        T = x_TH.shape[0]
        if step is None:
            _, w_TK, idx_TK = router(x_TH)
            return idx_TK, w_TK, None
        active_T = step.active_T.to(x_TH.device)  # a layer on another GPU of a spread model; no-op on one
        if step.select and self.selection.routes(T):
            batch, decision = self.selection.route(x_TH.to(router.weight.dtype), active_T)
        elif not step.select and self.dense_route is not None and self.dense_route.routes(T):
            batch, decision = self.dense_route.route(x_TH.to(router.weight.dtype), active_T)
        elif not (step.select or step.recorder is not None or step.observe is not None):
            _, w_TK, idx_TK = router(x_TH)
            return idx_TK, w_TK, None
        else:
            logits_TE, w_TK, idx_TK = router(x_TH)
            probs_TE = torch.softmax(logits_TE.reshape(x_TH.shape[0], -1).float(), dim=-1)
            batch = RoutedBatch(x_TH, probs_TE, idx_TK, w_TK, active_T, self.index)
            energy = step.recorder is not None and step.recorder.energy
            if energy or (step.select and self.selection.policy.selector.needs_norms):
                batch.norms_TK = expert_norms_TK(self.experts, x_TH, idx_TK)
            decision = self.selection.select(batch) if step.select else dense_decision(batch)
        if step.observe is not None:
            step.observe(self.index, batch, decision)
        if step.recorder is not None:
            self._record(step, batch, decision)
        if decision.topk_idx_TK is None:
            return batch.topk_idx_TK, batch.topk_w_TK, None
        return decision.topk_idx_TK, decision.topk_w_TK, decision.keep_M

    def _record(self, step: StepInputs, batch: RoutedBatch, decision: Decision) -> None:
        """The step's statistics; with the recorder's fidelity, also the MoE-output error against dense."""
        stats = step_stats(batch, decision.keep_E, decision.topk_idx_TK)
        if step.recorder.fidelity:
            stats.out_err, stats.out_dense = output_error(self.experts, batch, decision)
        step.recorder.record(self.index, stats, step.decode)
