"""The second embedded model (models/mini_olmoe) and train.py's family option: an OLMoE that does
not renormalise its top-k, built by the same training code, small enough to ship."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from experiments.mini.data import make_test_sets
from experiments.mini.evaluate import greedy_answers
from experiments.mini.model_config import MiniModelConfig
from experiments.mini.train import TrainConfig, model_config

REPO = Path(__file__).resolve().parents[1]
MODEL_DIR = REPO / "models" / "mini_olmoe"


def test_family_option_builds_an_olmoe():
    cfg = TrainConfig(out="unused", device="cpu", family="olmoe", num_experts=32, top_k=8, expert_width=48,
                      hidden_size=128, layers=4, heads=4)
    hf = model_config(cfg).to_hf()
    assert hf.model_type == "olmoe" and not hf.norm_topk_prob
    assert (hf.num_experts, hf.num_experts_per_tok, hf.intermediate_size) == (32, 8, 48)
    assert hf.num_key_value_heads == hf.num_attention_heads == 4 and hf.hidden_size == 128
    assert model_config(TrainConfig(out="unused", device="cpu")).to_hf().model_type == "qwen3_moe"


def test_unknown_family_fails_with_the_choices():
    with pytest.raises(ValueError, match="choose one of qwen3_moe, olmoe"):
        TrainConfig(out="unused", device="cpu", family="mixtral")
    with pytest.raises(ValueError, match="choose one of qwen3_moe, olmoe"):
        MiniModelConfig(family="deepseek")


@pytest.fixture(scope="module")
def mini_olmoe():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (MODEL_DIR / "model.safetensors").exists():
        pytest.skip("models/mini_olmoe has no checkpoint")
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(MODEL_DIR)


def test_checkpoint_is_an_olmoe_without_renormalisation(mini_olmoe):
    from base.hf.families import FAMILIES

    model, tok = mini_olmoe
    assert model.config.model_type == "olmoe" and not FAMILIES.get("olmoe").renormalizes(model.config)
    assert tok.pad_token_id is not None and tok.padding_side == "left"
    size = sum(f.stat().st_size for f in MODEL_DIR.iterdir() if f.is_file())
    assert size <= 25 * 2**20, f"models/mini_olmoe is {size / 2**20:.1f} MiB"


def test_it_learned_a_domain(mini_olmoe):
    """Reversal, in one left-padded batch of 24 held-out prompts."""
    model, tok = mini_olmoe
    samples = make_test_sets(24)["rev"]
    preds = greedy_answers(model, tok, [s.prompt for s in samples], batch_size=24)
    acc = sum(p == s.answer for p, s in zip(preds, samples)) / len(samples)
    assert acc >= 0.8, f"rev: {acc:.2f}; preds {preds[:5]}"
