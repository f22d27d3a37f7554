"""base/hf/fused_qkv.py: one GEMM for q, k and v gives the model's own outputs in every family, shares
the weights' storage, and restores the original projections."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from base.hf.fused_qkv import FusedQKV
from tests.test_attention import FAMILIES, _model


@pytest.mark.parametrize("name", FAMILIES)
def test_fused_projections_give_the_same_logits_in_every_family(name):
    model = _model(name)
    ids = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        before = sum(p.numel() for p in model.parameters())
        fused = FusedQKV(model)
        n_fused = fused.layers
        try:
            out = model(input_ids=ids).logits
        finally:
            fused.remove()
        after = model(input_ids=ids).logits
    n_attn = sum(1 for m in model.modules() if all(type(getattr(m, f"{p}_proj", None)) is nn.Linear for p in "qkv"))
    assert n_fused == n_attn  # MLA (DeepSeek) has no q/k/v trio: nothing fused there, still equal
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(after, ref, rtol=0, atol=0)
    assert sum(p.numel() for p in model.parameters()) == before  # originals back, nothing added


def test_fused_weight_is_the_originals_storage_and_bias_gaps_are_zero():
    attn = nn.Module()
    attn.q_proj, attn.k_proj, attn.v_proj = nn.Linear(8, 8, bias=True), nn.Linear(8, 4, bias=False), nn.Linear(8, 4)
    holder = nn.Sequential(attn)
    x = torch.randn(3, 8)
    with torch.no_grad():
        ref = [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)]
        q_lin = attn.q_proj
        fused = FusedQKV(holder)
        got = [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)]
    assert q_lin.weight.data_ptr() == attn.q_proj.weight.data_ptr()  # a view, not a copy
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r)
    fused.remove()
    assert attn.q_proj is q_lin


def test_k_before_q_is_a_clear_error():
    attn = nn.Module()
    attn.q_proj, attn.k_proj, attn.v_proj = nn.Linear(4, 4), nn.Linear(4, 2), nn.Linear(4, 2)
    fused = FusedQKV(nn.Sequential(attn))
    with pytest.raises(RuntimeError, match="k_proj was called before q_proj"):
        attn.k_proj(torch.randn(1, 4))
    fused.remove()
