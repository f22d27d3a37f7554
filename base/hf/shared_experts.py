"""Shared experts (DeepSeek-V2, Qwen1.5/2-MoE) through the expert kernel, as chunks of the routed shape.

A family's shared experts are one SwiGLU MLP of I_s = C * I rows (I the routed experts' intermediate
size: DeepSeek-V2-Lite 2 x 1408, Qwen1.5-MoE-A2.7B 4 x 1408, Qwen2-57B-A14B 8 x 2560). SwiGLU acts
row by row and `down` sums over rows, so the MLP equals the sum of C experts of the routed shape,
chunk c taking rows [c*I, (c+1)*I) of gate, up and down's columns. Run as those C experts, every
token routed to each with the shared weight (1, or Qwen2's sigmoid gate), they take the expert
kernel's two launches (its kept-list path) with the tuned launches of the routed shape, the routed
output as the kernel's residual, in place of the MLP's six eager launches and the add. Timed alone
(tools/bench_shared.py, H100, 7 rounds, results/roofline/branches_2026-12-06h/): DeepSeek-V2-Lite's
layer at 16 tokens 28.99 us eager -> 20.99 kept (0.723x; the four-launch path 0.822x), at 64 0.884x
(four-launch 1.599x); Qwen1.5-MoE-A2.7B's 0.861x at 16 but 1.142x at 64. So the kept path always,
whatever the routed entry's kept bound says (DeepSeek-V2-Lite's H100 entry at 16 tokens takes the
four-launch path for routed experts).

    seat(mlp)                          # at install: gate and up re-seated as views of one (2 I_s, H)
    SharedChunks.of(mlp, I, gate)      # None where the kernel does not apply
    chunks.forward(x_TH, routed_TH)    # routed + shared, (T, H)

No weight is copied twice: `seat` concatenates gate and up once and re-seats the two Linear weights
as views of the result (state-dict keys, values and memory as before); the kernel's (C, I, H) gate
view and (C, H, I) down view are strided views of the live parameters, made at each forward, so a
model moved after install has no stale copy (its weights no longer adjacent: the eager MLP runs).

Shapes: T tokens, H hidden, I routed intermediate size, C chunks (I_s = C * I).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernels.experts import V3_MAX_TOKENS, ExpertsConfig, fused_experts, get_config


def _plain_swiglu(mlp: nn.Module) -> bool:
    """gate_proj, up_proj, down_proj plain Linear layers (not a quantised subclass) with float
    weights and no bias, SiLU: what the kernel computes."""
    parts = [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    act = getattr(mlp, "act_fn", None)
    return (all(type(p) is nn.Linear and p.bias is None and type(p.weight) is nn.Parameter
                and p.weight.dtype.is_floating_point for p in parts)
            and type(act).__name__ in ("SiLUActivation", "SiLU"))  # fmt: skip


def seat(mlp: nn.Module) -> bool:
    """Re-seat gate_proj's and up_proj's weights as the two halves of one (2 I_s, H) tensor (no
    second copy: the originals are released). False where the MLP is not a plain SwiGLU."""
    if not _plain_swiglu(mlp):
        return False
    gate, up = mlp.gate_proj.weight, mlp.up_proj.weight
    if _adjacent(gate, up):
        return True
    gate_up = torch.cat([gate.detach(), up.detach()])
    I_s = gate.shape[0]
    mlp.gate_proj.weight = nn.Parameter(gate_up[:I_s], requires_grad=gate.requires_grad)
    mlp.up_proj.weight = nn.Parameter(gate_up[I_s:], requires_grad=up.requires_grad)
    return True


def _adjacent(gate: Tensor, up: Tensor) -> bool:
    """up's rows follow gate's in one storage: [gate; up] is one (2 I_s, H) block."""
    return (gate.shape == up.shape and gate.is_contiguous() and up.is_contiguous() and gate.dtype == up.dtype
            and gate.device == up.device
            and up.untyped_storage().data_ptr() == gate.untyped_storage().data_ptr()
            and up.storage_offset() == gate.storage_offset() + gate.numel())  # fmt: skip


@dataclass(frozen=True)
class SharedChunks:
    """A seated shared MLP as C chunks of the routed shape, for one forward."""

    gate_CIH: Tensor  # (C, I, H) view: chunk c's gate rows; its up rows are I_s rows further
    down_CHI: Tensor  # (C, H, I) view of down_proj's (H, I_s) weight
    I_s: int
    gate_weight: Tensor | None  # Qwen2's shared_expert_gate (1, H): the shared weight sigmoid(x . g)

    @staticmethod
    def of(mlp: nn.Module, I: int, gate: nn.Module | None = None) -> SharedChunks | None:
        """The chunks of `mlp` (seated) at the routed size I (one chunk of I_s where I does not
        divide I_s); None where the MLP is not seated (see the module doc)."""
        if not _plain_swiglu(mlp):
            return None
        g, u, d = mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight
        if not _adjacent(g, u) or not d.is_contiguous():
            return None
        I_s, H = g.shape
        I_c = I if I_s % I == 0 else I_s
        C = I_s // I_c
        gate_CIH = g.as_strided((C, I_c, H), (I_c * H, H, 1))
        down_CHI = d.as_strided((C, H, I_c), (I_c, I_s, 1))
        gate_weight = None if gate is None else gate.weight
        return SharedChunks(gate_CIH, down_CHI, I_s, gate_weight)

    @property
    def C(self) -> int:
        return self.gate_CIH.shape[0]

    def forward(self, x_TH: Tensor, routed_TH: Tensor, idx_TC: Tensor, ones_TC: Tensor, keep_C: Tensor) -> Tensor:
        """routed_TH + the shared experts' output, in the expert kernel (the add in its last launch).
        idx_TC, ones_TC, keep_C: the constant routing (chunk c at slot c, weight 1, every chunk kept)
        of at least T rows."""
        T = x_TH.shape[0]
        if self.gate_weight is None:
            w_TC = ones_TC[:T]
        else:  # Qwen1.5/2: one weight a token, the same for every chunk
            w_TC = torch.sigmoid(F.linear(x_TH, self.gate_weight)).expand(T, self.C)
        return fused_experts(x_TH, self.gate_CIH, self.down_CHI, idx_TC[:T], w_TC, keep_M=keep_C,
                             residual_TH=routed_TH, up_offset=self.I_s, config=self.config(T, x_TH.device))

    def config(self, T: int, device: torch.device) -> ExpertsConfig:
        """The routed shape's tuned launches, on the kept-list path (see the module doc)."""
        _, I, H = self.gate_CIH.shape
        return replace(get_config(H, I, T, device), use_kept=True, kept_max=None)


def applies(experts: nn.Module, T: int) -> bool:
    """The routed experts run the kernel (`base_triton`) at this many tokens: the shared ones may too."""
    from base.hf.experts_impl import NAME

    return (getattr(getattr(experts, "config", None), "_experts_implementation", None) == NAME
            and T <= V3_MAX_TOKENS)  # fmt: skip


def constant_routing(C: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """(idx_TC, ones_TC, keep_C) for up to V3_MAX_TOKENS tokens: made once, sliced per forward (no
    launch in the step)."""
    idx_TC = torch.arange(C, device=device, dtype=torch.int64).expand(V3_MAX_TOKENS, C).contiguous()
    ones_TC = torch.ones(V3_MAX_TOKENS, C, device=device, dtype=dtype)
    keep_C = torch.arange(C, device=device, dtype=torch.int64)
    return idx_TC, ones_TC, keep_C
