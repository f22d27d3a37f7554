"""base/hf/grouped_experts.py: the prefill's grouped-GEMM expert FFN equals transformers'
`grouped_mm_experts_forward` bit for bit (the same operations without the expert-parallel masks),
and steps aside where it does not apply."""
from __future__ import annotations

import pytest
import torch
from transformers import Qwen3MoeConfig
from transformers.integrations.moe import grouped_mm_experts_forward
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from base.hf.grouped_experts import grouped_experts_forward


def _experts(dtype: torch.dtype, E: int = 16):
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(hidden_size=64, moe_intermediate_size=32, num_experts=E, num_experts_per_tok=4)
    experts = Qwen3MoeSparseMoeBlock(cfg).experts.to(dtype)
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=0.05)
    return experts


@pytest.mark.parametrize("T", [1, 37, 300])
def test_prefill_experts_equal_transformers_grouped_mm_bit_for_bit(T):
    experts = _experts(torch.bfloat16)
    g = torch.Generator().manual_seed(T)
    x_TH = torch.randn(T, 64, generator=g).to(torch.bfloat16)
    idx_TK = torch.stack([torch.randperm(16, generator=g)[:4] for _ in range(T)])
    w_TK = torch.rand(T, 4, generator=g).to(torch.bfloat16)
    w_TK[0, 1] = 0  # a reassigned empty slot: weight 0 on a kept expert
    ours = grouped_experts_forward(experts, x_TH, idx_TK, w_TK)
    theirs = grouped_mm_experts_forward(experts, x_TH, idx_TK, w_TK)
    assert ours.dtype == theirs.dtype == torch.bfloat16 and ours.shape == (T, 64)
    assert torch.equal(ours, theirs)


def test_where_it_does_not_apply_it_returns_none():
    experts = _experts(torch.float32)  # fp32: transformers' path (grouped GEMMs are bf16 here)
    x_TH = torch.randn(5, 64)
    idx_TK = torch.zeros(5, 4, dtype=torch.long)
    assert grouped_experts_forward(experts, x_TH, idx_TK, torch.ones(5, 4)) is None
    bf = _experts(torch.bfloat16)
    bf._is_expert_parallel = True  # sentinel pairs possible: transformers masks them
    assert grouped_experts_forward(bf, x_TH.bfloat16(), idx_TK, torch.ones(5, 4, dtype=torch.bfloat16)) is None
