"""The expert FFN of a prefill (more tokens than the decode kernel takes) as two grouped GEMMs.

    y_TH = grouped_experts_forward(module, x_TH, topk_idx_TK, topk_w_TK)   # None: not applicable

Shapes: T tokens, H hidden, K top-k, P = T*K (token, slot) pairs, E experts, I intermediate.

Why our own: transformers' `grouped_mm_experts_forward` (the fallback `base_triton` used above 128
tokens) masks the rows of expert-parallel "sentinel" pairs around each grouped GEMM, whether or
not the module is expert-parallel in the version on the H200 (transformers 5.17): in the packed
prefill of 2,048 tokens on Qwen3-30B-A3B's shape, three element-wise kernels per layer named
`masked…` took 12.6 of the prefill's 89 ms (results/serve/grid_2026-12-02d/, the step probe's
profile). Here the pairs never name an expert outside [0, E) (the router's top-k, or reassign's
kept experts), so there is nothing to mask: the same operations in the same order without them.

Numerics: transformers' path exactly (sort the pairs by expert, gather, grouped GEMM, the module's
own gate, grouped GEMM, times the routing weight, back to pair order, sum over the K slots in the
model dtype); tests/test_grouped_experts.py compares the two bit for bit.
Graph safety: no host synchronisation (offsets by histc, as transformers does); capturable in bf16
(torch's grouped GEMM). Applies to bf16 weights with `torch.nn.functional.grouped_mm` or
`torch._grouped_mm` available, no post-expert norm and no expert parallelism; else None (the caller
runs transformers' path).
"""
from __future__ import annotations

import torch
from torch import Tensor


def _grouped_mm() -> object | None:
    return getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def applies(module: torch.nn.Module, x_TH: Tensor) -> bool:
    weight = getattr(module, "gate_up_proj", None)
    return (_grouped_mm() is not None and weight is not None and weight.dtype == torch.bfloat16
            and x_TH.dtype == torch.bfloat16 and getattr(module, "has_gate", True)
            and not getattr(module, "has_post_expert_norm", False)
            and not getattr(module, "_is_expert_parallel", False))  # fmt: skip


def _linear(a_PD: Tensor, weight: Tensor, offs_E: Tensor, transposed: bool) -> Tensor:
    """Rows of each expert's group times that expert's weight: (P, D) -> (P, out)."""
    w = weight if transposed else weight.transpose(-2, -1)
    return _grouped_mm()(a_PD, w, offs=offs_E)


def grouped_experts_forward(module: torch.nn.Module, x_TH: Tensor, topk_idx_TK: Tensor,
                            topk_w_TK: Tensor) -> Tensor | None:
    """sum_k w_tk * expert_{idx_tk}(x_t) as transformers computes it, without sentinel masks;
    None where it does not apply (see the module doc)."""
    if not applies(module, x_TH):
        return None
    T, K = topk_idx_TK.shape
    E = module.gate_up_proj.shape[0]
    transposed = bool(getattr(module, "is_transposed", False))
    has_bias = bool(getattr(module, "has_bias", False))
    w_P, idx_P = topk_w_TK.reshape(-1), topk_idx_TK.reshape(-1)
    idx_sorted_P, perm_P = torch.sort(idx_P)
    x_PH = x_TH[perm_P // K]
    w_sorted_P = w_P[perm_P]
    count_E = torch.histc(idx_sorted_P.float() if x_TH.device.type in ("cpu", "mps") else idx_sorted_P.int(),
                          bins=E, min=0, max=E - 1)
    offs_E = torch.cumsum(count_E, dim=0, dtype=torch.int32)
    h_P2I = _linear(x_PH, module.gate_up_proj, offs_E, transposed)
    if has_bias:
        h_P2I.add_(module.gate_up_proj_bias[idx_sorted_P])
    a_PI = module._apply_gate(h_P2I)
    y_PH = _linear(a_PI, module.down_proj, offs_E, transposed)
    if has_bias:
        y_PH.add_(module.down_proj_bias[idx_sorted_P])
    y_PH = y_PH * w_sorted_P.unsqueeze(-1)
    inv_P = torch.empty_like(perm_P)
    inv_P[perm_P] = torch.arange(perm_P.numel(), device=perm_P.device)
    return y_PH[inv_P].view(T, K, -1).sum(dim=1).to(x_TH.dtype)
