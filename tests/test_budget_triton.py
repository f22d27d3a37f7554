"""method.backend=triton: the budgeted model routes exactly as the PyTorch reference.

On CPU the kernels run through Triton's interpreter, so the models are tiny (fp32)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from base.config import ModelConfig
from base.eval.generate import budgeted_generate
from base.hf.budget import BudgetOptions, install_budget
from base.hf.families import find_moe_layers
from base.hf.loading import load_model
from base.hf.moe_block import BudgetedMoE
from base.method.selectors import build_selector
from tests.helpers import model_artifacts

ROOT = Path(__file__).resolve().parents[1]


def _model(name: str):
    cfg = ModelConfig(**yaml.safe_load((ROOT / "conf/model" / f"{name}.yaml").read_text()))
    return cfg, load_model(cfg, ROOT, seed=0, experts_impl="eager")


def _decode(model, family, selector, backend, ids_BS, mask_BS, budget, new_tokens=4, **options):
    moe = install_budget(model, family, selector, BudgetOptions(budget=budget, backend=backend, **options))
    try:
        out = budgeted_generate(model, moe, ids_BS, mask_BS, (), max_new_tokens=new_tokens, do_sample=False,
                                output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        kept = [r["kept"] for r in moe.stats_rows() if r["decode"]]
        fused = all(getattr(block.selection or block.dense_route, "fused_route", False) for block in moe.blocks)
    finally:
        moe.remove()
    return out, kept, fused


# Every family route_select reproduces (qwen3, deepseek, mixtral, and gpt_oss, whose router's bias
# goes into the route's GEMM), every way a selector runs on the kernels (an in-kernel term, base's
# predictor, a static score); the fast tier keeps qwen3 with each selector and gpt_oss with base.
FAST_PAIRS = {("tiny_qwen3", "router_sum"), ("tiny_qwen3", "base"), ("tiny_qwen3", "fixed"), ("tiny_gpt_oss", "base")}
PAIRS = [pytest.param(n, s, marks=() if (n, s) in FAST_PAIRS else pytest.mark.slow)
         for n in ("tiny_qwen3", "tiny_deepseek", "tiny_mixtral", "tiny_gpt_oss") for s in ("router_sum", "base", "fixed")]


@pytest.mark.parametrize("name,selector", PAIRS)
def test_triton_backend_matches_torch(name, selector):
    cfg, model = _model(name)
    torch.manual_seed(1)
    ids_BS = torch.randint(3, 250, (5, 6))
    mask_BS = torch.ones_like(ids_BS)
    mask_BS[0, :2] = 0  # a left-padded row
    sel = build_selector(selector, model_artifacts(model))
    budget = 3 if name != "tiny_mixtral" else 2
    ref, kept_ref, _ = _decode(model, cfg.family, sel, "torch", ids_BS, mask_BS, budget)
    out, kept, fused = _decode(model, cfg.family, sel, "triton", ids_BS, mask_BS, budget)
    assert fused  # the router's GEMM, softmax, top-k and the selection on the kernels (a bias in the GEMM)
    assert torch.equal(out.sequences, ref.sequences)
    for a, b in zip(out.logits, ref.logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert kept == kept_ref and max(kept) <= budget
    # After remove() the blocks are the model's own again.
    assert not any(isinstance(m, BudgetedMoE) for m in model.modules())
    assert all(type(layer.router).__module__.startswith("transformers.") for layer in find_moe_layers(model))


# Every other rule on the kernel path (issue 25): anchored tiers, top1_union, oea, coverage and
# `similar` re-routing; the fast tier keeps base_anchor and oea.
RULES = [  # selector, k0, coverage, reassign
    pytest.param("base_anchor", 1, None, "backfill"), pytest.param("oea", 1, None, "backfill"),
    pytest.param("xshare", 1, None, "backfill", marks=pytest.mark.slow),
    pytest.param("lynx", 1, None, "drop", marks=pytest.mark.slow),
    pytest.param("top1_union", None, None, "backfill", marks=pytest.mark.slow),
    pytest.param("router_sum", None, 0.9, "backfill", marks=pytest.mark.slow),
    pytest.param("base", None, None, "similar", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("selector,k0,coverage,mode", RULES)
def test_every_rule_runs_on_the_kernels_as_the_reference(selector, k0, coverage, mode):
    cfg, model = _model("tiny_qwen3")
    torch.manual_seed(2)
    ids_BS = torch.randint(3, 250, (5, 6))
    mask_BS = torch.ones_like(ids_BS)
    arts = model_artifacts(model)
    layers = find_moe_layers(model)
    E = layers[0].num_experts
    arts.sim_LEE = torch.rand(len(layers), E, E, generator=torch.Generator().manual_seed(0))
    sel = build_selector(selector, arts, k0=k0, coverage=coverage)
    budget = None if selector == "oea" else 3
    ref, kept_ref, _ = _decode(model, cfg.family, sel, "torch", ids_BS, mask_BS, budget, reassign=mode)
    moe = install_budget(model, cfg.family, sel, BudgetOptions(budget=budget, backend="triton", reassign=mode))
    assert all(type(b.selection).__name__ == "TritonSelection" for b in moe.blocks)
    moe.remove()
    out, kept, fused = _decode(model, cfg.family, sel, "triton", ids_BS, mask_BS, budget, reassign=mode)
    assert fused and torch.equal(out.sequences, ref.sequences)
    for a, b in zip(out.logits, ref.logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert kept == kept_ref


@pytest.mark.parametrize("selector,k0", [("base", None), ("base_anchor", 1), ("top1_union", None)])
@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_a_batch_whose_choices_fit_the_budget_decodes_as_the_reference(selector, k0):
    """One row, budget = top-k: every decode step's union fits, so the budgeted layer runs dense's
    route (kernels.select.union_fits: router rows only, no reassignment, no tier) and decodes as
    the reference and as dense."""
    cfg, model = _model("tiny_qwen3")
    torch.manual_seed(3)
    ids_BS = torch.randint(3, 250, (1, 6))
    mask_BS = torch.ones_like(ids_BS)
    sel = build_selector(selector, model_artifacts(model), k0=k0)
    budget = model.config.num_experts_per_tok
    ref, kept_ref, _ = _decode(model, cfg.family, sel, "torch", ids_BS, mask_BS, budget)
    out, kept, fused = _decode(model, cfg.family, sel, "triton", ids_BS, mask_BS, budget)
    dense, _, _ = _decode(model, cfg.family, None, "triton", ids_BS, mask_BS, None)
    assert fused and torch.equal(out.sequences, ref.sequences) and torch.equal(out.sequences, dense.sequences)
    for a, b in zip(out.logits, ref.logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert kept == kept_ref and max(kept) == budget


@pytest.mark.parametrize("selector", [None, "base"])
@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_a_skewed_router_routes_on_the_kernels_as_its_own_forward(selector):
    """The skew's logit bias (base/hf/skew.py) is added inside the selection kernel: decoding on
    the kernels equals the reference, which calls the skewed router's own forward."""
    raw = yaml.safe_load((ROOT / "conf/model/tiny_qwen3.yaml").read_text())
    cfg = ModelConfig(**{**raw, "routing": "skewed", "skew_ratio": 0.6})
    model = load_model(cfg, ROOT, seed=0, experts_impl="eager")
    torch.manual_seed(4)
    ids_BS = torch.randint(3, 250, (5, 6))
    mask_BS = torch.ones_like(ids_BS)
    sel = build_selector(selector, model_artifacts(model)) if selector else None
    budget = 3 if selector else None
    ref, kept_ref, _ = _decode(model, cfg.family, sel, "torch", ids_BS, mask_BS, budget)
    out, kept, fused = _decode(model, cfg.family, sel, "triton", ids_BS, mask_BS, budget)
    assert fused and torch.equal(out.sequences, ref.sequences) and kept == kept_ref
    for a, b in zip(out.logits, ref.logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # fast representatives: tests/test_route_kernel.py (dense route), tests/test_kernels.py (v3)
def test_dense_on_the_kernels_equals_the_model_with_the_two_launch_experts():
    """Dense with backend triton: the router in one launch, the union kept, and base_triton's
    two-launch expert kernel fed the kept list; the same tokens and logits as the model's own."""
    from base.hf.experts_impl import register_base_triton

    cfg, model = _model("tiny_qwen3")
    torch.manual_seed(3)
    ids_BS = torch.randint(3, 250, (4, 5))
    mask_BS = torch.ones_like(ids_BS)
    mask_BS[1, :2] = 0
    ref, _, _ = _decode(model, cfg.family, None, "torch", ids_BS, mask_BS, None)
    register_base_triton()
    model.set_experts_implementation("base_triton")
    try:
        out, _, fused = _decode(model, cfg.family, None, "triton", ids_BS, mask_BS, None)
    finally:
        model.set_experts_implementation("eager")
    assert fused and torch.equal(out.sequences, ref.sequences)
    for a, b in zip(out.logits, ref.logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tiny_qwen3", "tiny_deepseek"])
@pytest.mark.parametrize("selector", ["router_sum", "base"])
def test_gpu_triton_backend_and_base_triton_match_torch(name, selector):
    """Compiled kernels (route_select + base_triton experts) against the eager PyTorch path, fp32;
    one decode step (prefill + 1), since tf32 dots may flip later greedy choices of a random model."""
    from base.hf.experts_impl import register_base_triton

    cfg, model = _model(name)
    model = model.cuda()
    torch.manual_seed(1)
    ids_BS = torch.randint(3, 250, (16, 6), device="cuda")
    mask_BS = torch.ones_like(ids_BS)
    mask_BS[0, :2] = 0
    sel = build_selector(selector, model_artifacts(model))
    ref, kept_ref, _ = _decode(model, cfg.family, sel, "torch", ids_BS, mask_BS, 5, new_tokens=2)
    register_base_triton()
    model.set_experts_implementation("base_triton")
    try:
        out, kept, fused = _decode(model, cfg.family, sel, "triton", ids_BS, mask_BS, 5, new_tokens=2)
    finally:
        model.set_experts_implementation("eager")
    assert fused
    assert torch.equal(out.sequences[:, :-1], ref.sequences[:, :-1])
    rel = (out.logits[-1] - ref.logits[-1]).norm() / ref.logits[-1].norm()
    assert rel < 1e-2, rel
    assert kept == kept_ref and max(kept) <= 5


@pytest.mark.slow
def test_the_layers_residual_add_in_the_expert_kernel_leaves_the_logits_unchanged(monkeypatch):
    """The compiled decode step runs each layer as its attention half, then the budgeted block with
    the residual stream (base/runtime/regional.py): the expert kernel adds it in its last launch.
    Run eagerly here, a budgeted step gives the model's own layer forward's logits bit for bit, and
    every layer's add went to the kernel."""
    import base.hf.experts_impl as impl
    from tests.helpers import base_step_on_the_kernels, layers_as_halves

    model, moe, ids_BS, step = base_step_on_the_kernels("tiny_qwen3")
    folded = []
    fused = impl.fused_experts
    monkeypatch.setattr(impl, "fused_experts",
                        lambda *a, **kw: folded.append(kw.get("residual_TH") is not None) or fused(*a, **kw))
    try:
        with torch.no_grad(), moe.bound(step):
            expected = model(ids_BS).logits
            assert folded and not any(folded)
            folded.clear()
            with layers_as_halves(model):
                got = model(ids_BS).logits
    finally:
        moe.remove()
    assert folded == [True] * model.config.num_hidden_layers
    assert torch.equal(got, expected)
