"""A model split over two GPUs decodes exactly as on one: the budget, the Triton kernels (launched on
each layer's GPU) and the engine's cache (beside each layer) on a tiny model whose first half of
layers sits on cuda:0 and second half on cuda:1. Needs two GPUs (experiments/gpu/multi_gpu.sh)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from base.hf.budget import BudgetOptions, install_budget
from base.hf.loading import load_model
from base.hf.placement import model_devices
from base.method.selectors import build_selector
from base.runtime.engine import DecodeEngine
from tests.helpers import model_artifacts, tiny_model_config

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]


def _split(model):
    """The same model dispatched over cuda:0 and cuda:1 (accelerate's hooks move activations)."""
    from accelerate import dispatch_model

    n = model.config.num_hidden_layers
    dmap = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": 1, "lm_head": 1}
    dmap.update({f"model.layers.{i}": 0 if i < n // 2 else 1 for i in range(n)})
    return dispatch_model(model, device_map=dmap)


def _decode(model, method, backend, arts):
    sel = None if method == "dense" else build_selector(method, arts)
    budget = install_budget(model, "qwen3_moe", sel, BudgetOptions(budget=3, backend=backend))
    ids = torch.randint(3, 200, (8, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    try:
        engine = DecodeEngine(model, 8, 40, budget=budget, pad_id=0, graph=False)
        res = engine.generate(ids.cuda(), mask.cuda(), 16, stop_at_eos=False)
        engine.release()
        rows = budget.stats_rows()
    finally:
        budget.remove()
    return res, rows


@pytest.mark.parametrize("method,backend", [("dense", "torch"), ("router_sum", "torch"), ("base", "torch"),
                                            ("base", "triton"), ("router_sum", "triton")])
def test_two_gpus_decode_as_one(method, backend):
    from base.hf.experts_impl import register_base_triton

    register_base_triton()
    cfg = replace(tiny_model_config("qwen3", num_hidden_layers=4), device="cuda")
    one = load_model(cfg, ROOT, seed=0, experts_impl="base_triton")
    arts = model_artifacts(one)
    ref, ref_rows = _decode(one, method, backend, arts)
    two = _split(load_model(cfg, ROOT, seed=0, experts_impl="base_triton"))
    assert [d.index for d in model_devices(two)] == [0, 1]
    got, rows = _decode(two, method, backend, arts)
    assert torch.equal(got.tokens_BN, ref.tokens_BN)
    assert rows == ref_rows
    layer_dev = {m.base_k_cache.device.index for m in two.modules() if hasattr(m, "base_k_cache")}
    assert layer_dev in (set(), {0, 1})  # released; while decoding each half kept its cache beside it


def test_device_map_auto_spreads_a_random_model_and_runs():
    """model.device_map=auto end to end on a tiny model: weights initialised on the GPUs (finite),
    every parameter on a GPU, and a forward whose logits come back to the first GPU."""
    cfg = replace(tiny_model_config("qwen3"), device="cuda", device_map="auto")
    model = load_model(cfg, ROOT, seed=0)
    assert all(d.type == "cuda" for d in model_devices(model))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    ids = torch.randint(3, 200, (2, 5)).cuda()
    assert torch.isfinite(model(input_ids=ids).logits).all()
