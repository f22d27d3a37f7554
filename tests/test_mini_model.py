"""The embedded "mini" model (models/mini) and its corpus: shape of the config, a dense greedy
accuracy floor with batched left-padded generation, and held-out hygiene of the data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from experiments.mini.data import (
    check_disjoint,
    held_out_prompts,
    make_test_sets,
    make_train_corpus,
)
from experiments.mini.evaluate import greedy_answers
from experiments.mini.tokenizer import build_tokenizer, char_table, encode_fast

REPO = Path(__file__).resolve().parents[1]
MODEL_DIR = REPO / "models" / "mini"
ACC_FLOOR = 0.8


@pytest.fixture(scope="module")
def mini():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (MODEL_DIR / "model.safetensors").exists():
        pytest.skip("models/mini has no checkpoint")
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    return model, tok


def test_config_is_a_real_moe(mini):
    model, tok = mini
    cfg = model.config
    assert cfg.model_type == "qwen3_moe"
    assert cfg.num_experts >= 32 and cfg.num_experts_per_tok >= 4 and cfg.num_hidden_layers >= 4
    assert cfg.decoder_sparse_step == 1 and list(cfg.mlp_only_layers) == [] and cfg.norm_topk_prob
    assert tok.pad_token_id is not None and tok.padding_side == "left"
    size = sum(f.stat().st_size for f in MODEL_DIR.iterdir() if f.is_file())
    assert size <= 25 * 2**20, f"models/mini is {size / 2**20:.1f} MiB"


@pytest.mark.parametrize("domain", ["add", "sort"])
def test_dense_greedy_accuracy_floor(mini, domain):
    """24 held-out prompts of mixed lengths in one left-padded batch, like a decode batch."""
    model, tok = mini
    samples = make_test_sets(24)[domain]
    preds = greedy_answers(model, tok, [s.prompt for s in samples], batch_size=24)
    acc = sum(p == s.answer for p, s in zip(preds, samples)) / len(samples)
    assert acc >= ACC_FLOOR, f"{domain}: {acc:.2f} < {ACC_FLOOR}; preds {preds[:5]}"


def test_left_padding_matches_unpadded(mini):
    """Batched (left-padded) greedy answers equal one-at-a-time answers."""
    model, tok = mini
    prompts = [s.prompt for s in make_test_sets(6)["lookup"]] + ["rev abcd="]
    batched = greedy_answers(model, tok, prompts, batch_size=len(prompts))
    single = [greedy_answers(model, tok, [p], batch_size=1)[0] for p in prompts]
    assert batched == single


def test_corpus_is_deterministic_and_held_out():
    a, b = make_test_sets(50), make_test_sets(50)
    assert a == b
    train_a = make_train_corpus(300, held_out_prompts(a))
    assert train_a == make_train_corpus(300, held_out_prompts(a))
    assert check_disjoint(train_a, a)["disjoint"]
    assert not held_out_prompts(a) & {s.prompt for s in train_a}
    # A different seed gives a different corpus (the seed is really used).
    assert make_train_corpus(300, held_out_prompts(a), seed=1) != train_a


def test_tasks_jsonl_are_the_test_sets():
    tests = make_test_sets(200)
    for domain, samples in tests.items():
        rows = [json.loads(line) for line in (REPO / "tasks" / "mini" / f"{domain}.jsonl").read_text().splitlines()]
        assert [(r["prompt"], r["answer"]) for r in rows] == [(s.prompt, s.answer) for s in samples]


def test_fast_encoding_matches_tokenizer():
    tok = build_tokenizer()
    texts = [s.text for samples in make_test_sets(5).values() for s in samples]
    fast = encode_fast(texts, char_table(tok))
    assert [list(x) for x in fast] == [tok(t).input_ids for t in texts]
    assert tok.decode(tok(texts[0]).input_ids) == texts[0]
