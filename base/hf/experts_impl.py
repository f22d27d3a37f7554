"""`base_triton`: the fused expert FFN as a transformers experts implementation.

    from base.hf.experts_impl import register_base_triton
    register_base_triton()                       # idempotent
    model.set_experts_implementation("base_triton")

Every experts module built with transformers' `use_experts_implementation` (Qwen2/3-MoE,
DeepSeek-V2/3, GPT-OSS, ...) then calls `base_triton_experts_forward(self, x_TH, idx_TK, w_TK)`.
Budgeted decoding needs nothing more: the MoE block passes reassign's (idx_TK, w_TK), whose empty
slots carry weight 0, and only experts with a nonzero-weight pair are read.

Falls back to two grouped GEMMs (base/hf/grouped_experts.py: transformers' `grouped_mm` path
without its expert-parallel masks; transformers' own where that does not apply, e.g. fp32) where
the kernel is not the right tool or does not apply: more than DECODE_MAX_TOKENS tokens (prefill: dense-ish GEMMs),
an activation other than SiLU / GPT-OSS's clamped SwiGLU, no gate, a post-expert norm, expert
parallelism. The choice depends on shapes and module flags only (no host sync).
"""
from __future__ import annotations

import torch
from torch import Tensor

from base.hf.grouped_experts import grouped_experts_forward
from kernels.experts import V3_MAX_TOKENS, ExpertsLayout, fused_experts

DECODE_MAX_TOKENS = 128
NAME = "base_triton"


def _layout(module: torch.nn.Module) -> ExpertsLayout | None:
    """The kernel's view of a transformers experts module, or None if it does not apply."""
    from transformers.integrations.moe import _default_apply_gate

    if not getattr(module, "has_gate", True) or getattr(module, "has_post_expert_norm", False):
        return None
    if getattr(module, "_is_expert_parallel", False):
        return None
    transposed = bool(getattr(module, "is_transposed", False))
    interleaved = not bool(getattr(module, "is_concatenated", True))
    if type(module)._apply_gate is _default_apply_gate:
        if type(module.act_fn).__name__ not in ("SiLUActivation", "SiLU"):
            return None
        return ExpertsLayout(transposed=transposed, interleaved=interleaved)
    if hasattr(module, "alpha") and hasattr(module, "limit") and interleaved:  # GPT-OSS
        return ExpertsLayout(transposed, interleaved, "gptoss", float(module.alpha), float(module.limit))
    return None


def base_triton_experts_forward(
    self: torch.nn.Module, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor
) -> Tensor:
    layout = _layout(self)
    if layout is None or hidden_states.shape[0] > DECODE_MAX_TOKENS:
        out = grouped_experts_forward(self, hidden_states, top_k_index, top_k_weights)
        if out is not None:
            return out
        from transformers.integrations.moe import grouped_mm_experts_forward

        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    has_bias = getattr(self, "has_bias", False)
    return fused_experts(
        hidden_states,
        self.gate_up_proj,
        self.down_proj,
        top_k_index,
        top_k_weights,
        layout=layout,
        gate_up_bias=self.gate_up_proj_bias if has_bias else None,
        down_bias=self.down_proj_bias if has_bias else None,
    )


def kept_experts_forward(module: torch.nn.Module, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor,
                         keep_M: Tensor, residual: Tensor | None = None) -> Tensor | None:
    """The two-launch kernel with the selection's kept list (kernels/experts.py v3) when the module
    runs `base_triton` and the kernel applies (decode-sized batches); None otherwise (the caller
    then runs the module as usual). With `residual`, residual + the experts' output, added in the
    kernel's last launch."""
    if getattr(getattr(module, "config", None), "_experts_implementation", None) != NAME:
        return None
    layout = _layout(module)
    if layout is None or hidden_states.shape[0] > V3_MAX_TOKENS:
        return None
    has_bias = getattr(module, "has_bias", False)
    return fused_experts(hidden_states, module.gate_up_proj, module.down_proj, top_k_index, top_k_weights,
                         layout=layout, gate_up_bias=module.gate_up_proj_bias if has_bias else None,
                         down_bias=module.down_proj_bias if has_bias else None, keep_M=keep_M,
                         residual_TH=residual)


def register_base_triton() -> str:
    """Register `base_triton` with transformers' experts interface (idempotent); returns the name."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(NAME, base_triton_experts_forward)
    return NAME


# transformers' implementations that load a compiled kernel from the Hugging Face hub through the
# `kernels` package (transformers.integrations.hub_kernels), and what else they need
HUB_KERNEL_IMPLS = {"deepgemm": "bfloat16 weights on a CUDA GPU", "sonicmoe": "a CUDA GPU"}


def experts_implementations() -> list[str]:
    """Every value model.experts_impl may take: transformers' own for unquantised weights (its FP8
    functions serve FP8 checkpoints only) and base_triton."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    return sorted({"eager", NAME, *ALL_EXPERTS_FUNCTIONS.keys()})


def unavailable_reason(impl: str, dtype: str, cuda: bool) -> str | None:
    """Why `impl` cannot run here (None: it can): the hub-kernel implementations need the `kernels`
    package and their device and dtype; without them they fail at the first forward."""
    from transformers.utils import is_kernels_available

    if impl not in HUB_KERNEL_IMPLS:
        return None
    if not is_kernels_available():
        return f"{impl} loads its kernel from the Hugging Face hub through the `kernels` package, not installed here"
    if not cuda or (impl == "deepgemm" and dtype != "bfloat16"):
        return f"{impl} needs {HUB_KERNEL_IMPLS[impl]}"
    return None
