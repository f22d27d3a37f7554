"""experiments/routing_stats.py: batch unions counted exactly on a fixed routing, and the
statistics' ranges on tiny random Qwen3-MoE and OLMoE models (one renormalises, one does not)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from experiments.mini.model_config import MiniModelConfig
from experiments.mini.tokenizer import build_tokenizer
from experiments.routing_stats import (
    DecodeRouting,
    Request,
    active_tokens,
    at_step,
    batch_counts,
    decode_routing,
    layer_table,
    load_requests,
    main,
)


def fixed_routing(idx_TK: list[list[int]], seq_T: list[int], step_T: list[int], num_experts: int = 8) -> DecodeRouting:
    idx_1TK = torch.tensor([idx_TK])
    T, K = idx_1TK.shape[1:]
    w_1TK = torch.full((1, T, K), 1.0 / K)
    return DecodeRouting(idx_1TK, w_1TK, torch.full((1, T), 0.5), torch.ones(1, T), torch.tensor(seq_T),
                         torch.tensor(step_T), num_experts)


def test_batch_counts_exact():
    # Requests 0..3; request 0 decodes 2 steps, the others 1. Top-2 each.
    r = fixed_routing(
        idx_TK=[[0, 1], [2, 3], [0, 4], [0, 1], [5, 6]],
        seq_T=[0, 0, 1, 2, 3],
        step_T=[0, 1, 0, 0, 0],
    )
    # B=2: batch {0,1} step 0 -> {0,1,4} = 3, step 1 -> {2,3} = 2; batch {2,3} step 0 -> {0,1,5,6} = 4.
    assert batch_counts(r, 2)[0].tolist() == [3, 2, 4]
    assert batch_counts(r, 2, first_only=True)[0].tolist() == [1, 1, 2]
    assert active_tokens(r, 2).tolist() == [2, 1, 2]
    # B=4: step 0 -> {0,1,4,5,6} = 5, step 1 -> {2,3} = 2. B=1: each token alone keeps K.
    assert batch_counts(r, 4)[0].tolist() == [5, 2]
    assert batch_counts(at_step(r, 0), 2)[0].tolist() == [3, 4]
    assert set(batch_counts(r, 1)[0].tolist()) == {2}
    # Requests beyond the last full batch are left out; a batch larger than the requests fails.
    assert batch_counts(r, 3)[0].tolist() == [3, 2]
    with pytest.raises(ValueError, match="at least 8 requests"):
        batch_counts(r, 8)


@pytest.fixture(scope="module", params=["qwen3_moe", "olmoe"])
def tiny(request):
    torch.manual_seed(0)
    sizes = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2,
                 head_dim=32, moe_intermediate_size=16)
    cfg = MiniModelConfig(family=request.param, num_experts=32, num_experts_per_tok=4, **sizes)
    model = AutoModelForCausalLM.from_config(cfg.to_hf()).eval()
    return request.param, model, build_tokenizer()


def test_statistics_ranges_on_tiny_models(tiny):
    family, model, tok = tiny
    requests = load_requests(seed=1)[:64]
    r = decode_routing(model, tok, requests, chunk=32)
    assert r.topk_idx_LTK.shape[1] == sum(len(q.answer) for q in requests)
    table = layer_table(r, batch_sizes=(1, 2, 4, 8, 16, 32))
    E, K = 32, 4
    unions = table[[f"union_{b}" for b in (1, 2, 4, 8, 16, 32)]].to_numpy()
    assert (unions[:, 0] == K).all()  # one token keeps exactly its K distinct experts
    assert (unions[:, 1:] >= unions[:, :-1] - 1e-9).all(), "union must not shrink as the batch grows"
    assert (unions <= E).all()
    assert table["first_share"].between(1 / K - 1e-6, 1 + 1e-6).all()
    assert table["first_prob"].between(1 / E - 1e-6, 1).all()
    assert table["entropy_frac"].between(0, 1 + 1e-6).all()
    assert (table["distinct_first_16"] <= table["union_16"]).all()
    assert (table["distinct_first_16"] <= table["active_16"] + 1e-9).all()
    assert (table["distinct_first_16_step0"] <= 16).all() and (table["union_16_step0"] <= E).all()
    assert (table["distinct_first_16_step0"] <= table["union_16_step0"]).all()
    if family == "qwen3_moe":  # renormalised: the first choice's weight is its share of the top-k
        w_LTK = r.topk_w_LTK
        assert torch.allclose(w_LTK.sum(-1), torch.ones_like(w_LTK[..., 0]), atol=1e-5)
    else:  # OLMoE: raw softmax probabilities, so the first weight equals the first choice's probability
        assert torch.allclose(r.topk_w_LTK[..., 0], r.first_prob_LT, atol=1e-5)


def test_first_share_is_one_over_k_for_a_uniform_router(tiny):
    _, model, tok = tiny
    model = copy.deepcopy(model)
    zeroed = [p.data.zero_() for name, p in model.named_parameters() if name.endswith("mlp.gate.weight")]
    assert len(zeroed) == 4
    r = decode_routing(model, tok, [Request("add", "add 1+2=", "3")] * 16)
    table = layer_table(r, batch_sizes=(1, 2))
    assert table["first_share"].sub(1 / 4).abs().max() < 1e-5
    assert table["entropy_frac"].sub(1).abs().max() < 1e-5
    assert math.isclose(table["first_prob"].iloc[0], 1 / 32, rel_tol=1e-5)


def test_bad_model_path_fails_with_a_message(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--model", str(tmp_path / "nope"), "--out", str(tmp_path)])
    assert "not a directory" in capsys.readouterr().err
