"""Every supported family, built tiny and random from conf/model/tiny_*.yaml through
`base.hf.loading.load_model`: the MoE blocks are found, the owned blocks hold the budget while generating a
left-padded batch, shared experts still run, and each family's weight convention survives selection
(DeepSeek's routed_scaling_factor, GPT-OSS's renormalisation).

Shapes: B = 4 prompts, T tokens, E experts, K top-k, L MoE layers, M budget.
"""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from base.eval.generate import budgeted_generate
from base.hf.budget import BudgetOptions
from base.hf.families import FAMILIES, find_moe_layers
from base.hf.loading import byte_tokenizer, load_model
from base.method.selectors import build_selector
from tests.helpers import (
    ROOT,
    MoeProbe,
    budgeted,
    one_thread,
    random_artifacts,
    tiny_model_config,
)

NAMES = ["qwen3", "qwen2", "olmoe", "mixtral", "gpt_oss", "deepseek"]
PROMPTS = ["The cat sat", "hi", "A longer prompt here", "ok go"]
NEW = 3


def runnable(name: str) -> dict:
    """Architecture overrides needed to run a config; see test_tiny_config_runs_as_written."""
    if name == "deepseek":
        arch = tiny_model_config(name).arch
        return {"num_key_value_heads": arch["num_attention_heads"]}
    return {}


_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def models():
    """name -> (ModelConfig, model with the eager experts loop), built once per module on demand."""
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cfg = tiny_model_config(name, **runnable(name))
            cache[name] = (cfg, load_model(cfg, ROOT, seed=0, experts_impl="eager"))
        return cache[name]

    return get


def prompts(tok):
    enc = tok(PROMPTS, padding=True, return_tensors="pt")
    assert (enc["attention_mask"][:, 0] == 0).any(), "the batch must be left-padded"
    return enc["input_ids"], enc["attention_mask"]


def experts_of(cfg) -> int:
    return int(cfg.arch[FAMILIES.get(cfg.family).experts_key])


# ---- configs and discovery ---------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_tiny_config_runs_as_written(name, tok):
    cfg = tiny_model_config(name)
    model = load_model(cfg, ROOT, seed=0)
    ids, mask = prompts(tok)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    assert logits.shape == (*ids.shape, cfg.arch["vocab_size"]) and torch.isfinite(logits).all()


@pytest.mark.parametrize(("name", "overrides", "moe_layers"), [
    ("qwen3", {}, 2),
    ("qwen3", {"num_hidden_layers": 3, "mlp_only_layers": [1]}, 2),
    ("qwen2", {"num_hidden_layers": 4, "decoder_sparse_step": 2}, 2),  # layers 1 and 3
    ("olmoe", {"num_hidden_layers": 3}, 3),
    ("mixtral", {"num_hidden_layers": 3}, 3),
    ("gpt_oss", {"num_hidden_layers": 3}, 3),
    ("deepseek", {}, 2),
    ("deepseek", {"num_hidden_layers": 3, "first_k_dense_replace": 1}, 2),  # layer 0 is dense
])
def test_find_moe_layers(name, overrides, moe_layers):
    cfg = dataclasses.replace(tiny_model_config(name, **runnable(name), **overrides), device="meta")
    layers = find_moe_layers(load_model(cfg, ROOT))
    assert [lyr.index for lyr in layers] == list(range(moe_layers))
    assert len({lyr.name for lyr in layers}) == moe_layers
    for lyr in layers:
        assert lyr.num_experts == experts_of(cfg)
        assert lyr.top_k == cfg.arch["num_experts_per_tok"]


def test_find_moe_layers_rejects_a_dense_model():
    with pytest.raises(ValueError, match="no MoE blocks"):
        find_moe_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)))


# ---- budgeted generation -----------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_budgeted_generate_holds_the_budget(name, models, tok):
    M = 2
    cfg, model = models(name)
    E, L, H = experts_of(cfg), len(find_moe_layers(model)), cfg.arch["hidden_size"]
    ids, mask = prompts(tok)
    sel = build_selector("base", random_artifacts(L, E, H, seed=1))
    probe = MoeProbe(model)
    try:
        opts = BudgetOptions(budget=M)
        with budgeted(model, cfg.family, sel, opts) as budget, probe, torch.no_grad():
            out = budgeted_generate(model, budget, ids, mask, (tok.pad_token_id,), max_new_tokens=NEW,
                                    min_new_tokens=NEW, do_sample=False, pad_token_id=tok.pad_token_id,
                                    eos_token_id=tok.eos_token_id)
    finally:
        probe.remove()
    assert out.shape == (4, ids.shape[1] + NEW) and torch.equal(out[:, :ids.shape[1]], ids)
    rows = budget.stats_rows()
    assert len(rows) == (NEW - 1) * L and all(r["decode"] for r in rows)
    assert max(r["union"] for r in rows) > M
    by_key = {(r["step"], r["layer"]): r for r in rows}
    for f, layer in itertools.product(probe.decode_forwards(), range(L)):
        ran = probe.executed[f, layer]
        assert len(ran) == by_key[f, layer]["kept"] <= M
        assert ran <= set(probe.routed[f, layer][0].flatten().tolist())


# ---- shared experts ----------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "attr"), [("qwen2", "shared_expert"), ("deepseek", "shared_experts")])
def test_shared_experts_still_run_in_decode(name, attr, models, tok):
    cfg, model = models(name)
    layers = find_moe_layers(model)
    blocks = dict(model.named_modules())
    probe = MoeProbe(model)
    calls: list[tuple[int, int, int]] = []  # (forward, layer, tokens)
    hooks = [getattr(blocks[lyr.name], attr).register_forward_hook(
        lambda m, a, o, i=lyr.index: calls.append((probe.forward, i, a[0].reshape(-1, a[0].shape[-1]).shape[0])))
        for lyr in layers]
    ids, mask = prompts(tok)
    try:
        with budgeted(model, cfg.family, build_selector("router_sum"), BudgetOptions(budget=1)) as budget:
            budgeted_generate(model, budget, ids, mask, (tok.pad_token_id,), max_new_tokens=NEW,
                              min_new_tokens=NEW, do_sample=False, pad_token_id=tok.pad_token_id,
                              eos_token_id=tok.eos_token_id)
    finally:
        probe.remove()
        for h in hooks:
            h.remove()
    decode = probe.decode_forwards()
    assert len(decode) == NEW - 1 and all(r["kept"] == 1 for r in budget.stats_rows())
    for f in decode:
        assert sorted((i, n) for g, i, n in calls if g == f) == [(i, 4) for i in range(len(layers))]


# ---- weight conventions ------------------------------------------------------------------------
def routed_and_applied(name, models, tok, budget, renormalize="model", reassign="backfill"):
    """One budgeted prefill+decode step; per decode (forward, layer): original vs applied routing;
    and whether the family renormalises its top-k weights for this model."""
    cfg, model = models(name)
    ids, mask = prompts(tok)
    probe = MoeProbe(model)
    opts = BudgetOptions(budget=budget, renormalize=renormalize, reassign=reassign)
    try:
        with budgeted(model, cfg.family, build_selector("router_sum"), opts) as moe:
            budgeted_generate(model, moe, ids, mask, (tok.pad_token_id,), max_new_tokens=2,
                              min_new_tokens=2, do_sample=False, pad_token_id=tok.pad_token_id,
                              eos_token_id=tok.eos_token_id)
    finally:
        probe.remove()
    out = [(probe.routed[f, i], probe.applied[f, i]) for f in probe.decode_forwards()
           for i in range(len(moe.layers))]
    assert out
    return cfg, FAMILIES.get(cfg.family).renormalizes(model.config), out


@pytest.mark.parametrize("name", NAMES)
def test_family_renormalises_as_its_router_does(name, models, tok):
    """FAMILIES' `renormalizes` matches the router: w = p/sum_k p, or p * routed_scaling_factor."""
    cfg, renormalizes, steps = routed_and_applied(name, models, tok, budget=None)
    scale = cfg.arch.get("routed_scaling_factor", 1.0)
    for (idx_TK, w_TK, probs_TE, _), _ in steps:
        p_TK = probs_TE.gather(1, idx_TK)
        want_TK = p_TK / p_TK.sum(-1, keepdim=True) if renormalizes else p_TK * scale
        assert torch.allclose(w_TK.float(), want_TK, rtol=1e-5, atol=1e-6)


def test_deepseek_keeps_routed_scaling_factor(models, tok):
    cfg, renormalizes, steps = routed_and_applied("deepseek", models, tok, budget=experts_of(models("deepseek")[0]))
    assert renormalizes is False and cfg.arch["routed_scaling_factor"] == 2.5
    for (idx_TK, w_TK, probs_TE, _), (new_idx_TK, new_w_TK) in steps:
        assert torch.equal(new_idx_TK, idx_TK) and torch.equal(new_w_TK, w_TK)  # budget >= union
        assert torch.allclose(w_TK, probs_TE.gather(1, idx_TK) * 2.5)  # the scale is in the weights

    # A binding budget without renormalisation: backfilled experts get p * 2.5, kept ones keep w.
    _, _, steps = routed_and_applied("deepseek", models, tok, budget=2)
    backfilled = 0
    for (idx_TK, w_TK, probs_TE, _), (new_idx_TK, new_w_TK) in steps:
        for t in range(idx_TK.shape[0]):
            orig = dict(zip(idx_TK[t].tolist(), w_TK[t].tolist()))
            for u, w in zip(new_idx_TK[t].tolist(), new_w_TK[t].tolist()):
                if w == 0.0:
                    continue
                want = orig[u] if u in orig else float(probs_TE[t, u]) * 2.5
                backfilled += u not in orig
                assert w == pytest.approx(want, rel=1e-5)
    assert backfilled > 0

    # renormalize=always: every token's total is the total it had (which includes the scale).
    _, _, steps = routed_and_applied("deepseek", models, tok, budget=2, renormalize="always")
    for (idx_TK, w_TK, probs_TE, _), (_, new_w_TK) in steps:
        total_T = probs_TE.gather(1, idx_TK).sum(-1) * 2.5
        assert torch.allclose(new_w_TK.sum(-1), total_T, rtol=1e-5)
        assert not torch.allclose(new_w_TK.sum(-1), torch.ones_like(total_T))  # not renormalised to 1


def test_gpt_oss_renormalises(models, tok):
    _, renormalizes, steps = routed_and_applied("gpt_oss", models, tok, budget=2)
    assert FAMILIES.get("gpt_oss").renormalizes(None) and renormalizes
    lost = 0
    for (idx_TK, w_TK, _, _), (new_idx_TK, new_w_TK) in steps:
        assert torch.allclose(w_TK.sum(-1), torch.ones(w_TK.shape[0]))
        assert torch.allclose(new_w_TK.sum(-1), torch.ones(w_TK.shape[0]), rtol=1e-5)
        lost += int((new_idx_TK != idx_TK).any(-1).sum())
    assert lost > 0
    # Contrast: with renormalize=never and drop, a token that lost an expert keeps less than 1.
    _, _, steps = routed_and_applied("gpt_oss", models, tok, budget=2, renormalize="never", reassign="drop")
    assert any((new_w_TK.sum(-1) < 1 - 1e-3).any() for _, (_, new_w_TK) in steps)


def test_deepseek_v2_lite_random_init_uses_its_yarn_rope():
    """init=random must build the real rotary embedding (YaRN), not the default one."""
    import yaml

    from base.config import ModelConfig

    cfg = ModelConfig(**{**yaml.safe_load((ROOT / "conf/model/deepseek_v2_lite.yaml").read_text()),
                         "init": "random", "device": "meta"})
    model = load_model(cfg, ROOT)
    rotary = model.model.rotary_emb
    assert rotary.rope_type == "yarn"
    assert model.config.max_position_embeddings == 40 * model.config.rope_parameters["original_max_position_embeddings"]
