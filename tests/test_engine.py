"""The decode engine (base/runtime/engine.py): same tokens and statistics as transformers' generate on the
CPU, finished and padding rows inactive, device-side statistics; on a GPU, CUDA-graph replay equals
eager decoding for dense and base. Also the routing skew of random models (base/hf/skew.py)."""
from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
import torch
import yaml

from base.config import ModelConfig
from base.eval.generate import budgeted_generate
from base.hf.budget import BudgetOptions, install_budget
from base.hf.families import find_moe_layers
from base.hf.loading import load_model, load_tokenizer
from base.hf.skew import SkewedRouter
from base.method.selectors import build_selector
from base.runtime.engine import DecodeEngine
from tests.helpers import model_artifacts

ROOT = Path(__file__).resolve().parents[1]


def _cfg(name: str, **over) -> ModelConfig:
    return ModelConfig(**{**yaml.safe_load((ROOT / "conf/model" / f"{name}.yaml").read_text()), **over})


@pytest.fixture(scope="module")
def mini():
    cfg = _cfg("mini")
    return load_model(cfg, ROOT), load_tokenizer(cfg, ROOT)


PROMPTS = ["12+34=", "sort: 3 1 2 ->", "rev: abcdef ->", "9+1=", "cmp 3 4:", "count a in aab:"]


@pytest.mark.parametrize("method", ["dense", "router_sum", "base"])
def test_engine_equals_generate_with_padding_rows(mini, method):
    """6 left-padded prompts in an engine of batch 8: the 2 spare rows are finished from the start,
    so tokens and every selection statistic equal transformers' generate on the 6 prompts."""
    model, tok = mini
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    sel = None if method == "dense" else build_selector(method, model_artifacts(model))
    budget = install_budget(model, "qwen3_moe", sel, BudgetOptions(budget=4))
    try:
        ref = budgeted_generate(model, budget, enc["input_ids"], enc["attention_mask"], (tok.pad_token_id,),
                                max_new_tokens=10, do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=None)
        ref_rows = budget.stats_rows()
        budget.reset()
        engine = DecodeEngine(model, 8, 64, budget=budget, pad_id=tok.pad_token_id)
        res = engine.generate(enc["input_ids"], enc["attention_mask"], 10, stop_at_eos=False)
        rows = budget.stats_rows()
    finally:
        budget.remove()
    assert torch.equal(res.tokens_BN, ref[:, enc["input_ids"].shape[1]:])
    assert res.steps == 9 and res.eager_steps == 9  # CPU: every step eager
    assert len(rows) == len(ref_rows) == 9 * 6
    for a, b in zip(rows, ref_rows):
        assert (a["layer"], a["union"], a["kept"], a["tokens"]) == (b["layer"], b["union"], b["kept"], b["tokens"])
        assert a["tokens"] == 6
        assert a["kept"] <= (4 if method != "dense" else a["union"])


def test_stop_callback_finishes_rows_and_removes_them_from_the_union():
    model = load_model(_cfg("tiny_qwen3"), ROOT)
    budget = install_budget(model, "qwen3_moe", None, BudgetOptions(budget=None))
    ids = torch.randint(3, 90, (4, 5), generator=torch.Generator().manual_seed(0))
    calls = []

    def stop(tokens_bN):  # row 1 ends after its second token, row 3 after its fourth
        calls.append(tokens_bN.shape[1])
        n = tokens_bN.shape[1]
        return torch.tensor([False, n >= 2, False, n >= 4])

    try:
        engine = DecodeEngine(model, 4, 32, budget=budget, pad_id=0)
        res = engine.generate(ids, torch.ones_like(ids), 8, stop_at_eos=False, stop=stop)
        rows = budget.stats_rows()
    finally:
        budget.remove()
    assert calls == list(range(1, 9))  # after the prefill's token, then after every step
    assert (res.tokens_BN[1, 2:] == 0).all() and (res.tokens_BN[3, 4:] == 0).all()  # pad once finished
    tokens_by_step = [r["tokens"] for r in rows if r["layer"] == 0]
    # step s feeds token s-1: row 1 is out from step 2 (it fed its 2nd token), row 3 from step 4
    assert tokens_by_step == [4, 3, 3, 2, 2, 2, 2]


def test_eos_ends_a_row_inside_the_step():
    model = load_model(_cfg("tiny_qwen3"), ROOT)
    ids = torch.randint(3, 90, (2, 5), generator=torch.Generator().manual_seed(1))
    free = DecodeEngine(model, 2, 32).generate(ids, torch.ones_like(ids), 6, stop_at_eos=False).tokens_BN
    eos = int(free[0, 2])  # make row 0's third token an EOS
    out = DecodeEngine(model, 2, 32, eos_ids=(eos,), pad_id=0).generate(ids, torch.ones_like(ids), 6).tokens_BN
    assert out[0, 2] == eos and (out[0, 3:] == 0).all()
    first = int((free[1] == eos).nonzero()[0]) if (free[1] == eos).any() else 6
    assert torch.equal(out[1, : first + 1], free[1, : first + 1])


def test_recorder_grows_past_its_capacity_in_eager_decoding(mini):
    model, _ = mini
    budget = install_budget(model, "qwen3_moe", None, BudgetOptions(budget=None))
    try:
        cap = budget.recorder.capacity
        ids = torch.full((2, 3), 5)
        DecodeEngine(model, 2, cap + 16, budget=budget).generate(ids, torch.ones_like(ids), cap + 10, stop_at_eos=False)
        rows = budget.stats_rows()
    finally:
        budget.remove()
    L = len(find_moe_layers(model))
    assert len(rows) == (cap + 9) * L and rows[-1]["step"] == cap + 9


@pytest.mark.slow
def test_a_graph_is_captured_again_when_the_recorder_grows(mini, monkeypatch):
    """Chunked decoding (a host stop check per step, as in evaluation) past the recorder's capacity:
    the statistics buffer is reallocated, so the step must be captured again. On a CPU a stand-in
    graph replays the step eagerly; the rows must equal eager decoding's."""
    model, _ = mini
    ids = torch.full((2, 3), 5)

    def run(graph: bool) -> tuple[list[dict], int]:
        budget = install_budget(model, "qwen3_moe", None, BudgetOptions(budget=None))
        engine = DecodeEngine(model, 2, 128, budget=budget, graph=graph)
        captures = []

        class Replay:  # what a CUDA graph would do: run the step's device work, no host bookkeeping
            def replay(self):
                with mock.patch("base.method.recorder._capturing", return_value=True):
                    engine._step()

        def capture():
            captures.append(budget.recorder.capacity)
            engine._step()  # the warm-up step the real capture runs eagerly
            engine._graph, engine._graph_version = Replay(), budget.recorder.version

        monkeypatch.setattr(engine, "_capture", capture)
        try:
            n = budget.recorder.capacity + 10
            engine.generate(ids, torch.ones_like(ids), n, stop_at_eos=False, stop=lambda t: torch.zeros(2, dtype=bool))
            return budget.stats_rows(), captures
        finally:
            budget.remove()

    eager_rows, none = run(graph=False)
    graph_rows, captures = run(graph=True)
    assert none == [] and len(captures) == 2 and captures[1] > captures[0]
    assert graph_rows == eager_rows


@pytest.mark.parametrize("name", ["tiny_qwen3", "tiny_olmoe", "tiny_deepseek"])
def test_skewed_routing_hits_its_union_and_survives_a_budget(name):
    cfg = _cfg(name, routing="skewed", skew_ratio=0.6)
    model = load_model(cfg, ROOT, seed=0)
    for r in model.base_skew_report:
        assert r["union_skewed"] == pytest.approx(0.6 * r["union_uniform"], abs=0.6)
    router = find_moe_layers(model)[0].router
    assert isinstance(router, SkewedRouter)
    budget = install_budget(model, cfg.family, build_selector("router_sum"), BudgetOptions(budget=2, backend="torch"))
    assert budget.layers[0].router is router  # the owned block routes through the skewed router
    budget.remove()
    assert find_moe_layers(model)[0].router is router  # and it stays after the budget is removed


def test_skew_needs_random_weights():
    from base.config import ConfigError

    with pytest.raises(ConfigError, match="model.init=random"):
        _cfg("mini", routing="skewed")


# ---- GPU: graph replay equals eager ------------------------------------------------------------
def _decode_gpu(model, family, method, backend, graph, compile=False):
    sel = None if method == "dense" else build_selector(method, model_artifacts(model))
    budget = install_budget(model, family, sel, BudgetOptions(budget=3, backend=backend))
    ids = torch.randint(3, 90, (16, 7), generator=torch.Generator().manual_seed(2)).cuda()
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    try:
        engine = DecodeEngine(model, 16, 48, budget=budget, pad_id=0, graph=graph, compile=compile)
        res = engine.generate(ids, mask, 20, stop_at_eos=False)
        rows = budget.stats_rows()
    finally:
        budget.remove()
    return res, rows


@pytest.mark.gpu
@pytest.mark.parametrize("experts_impl", ["grouped_mm", "base_triton"])
@pytest.mark.parametrize("method,backend", [("dense", "torch"), ("base", "torch"), ("base", "triton"),
                                            ("router_sum", "triton")])
def test_gpu_graph_replay_equals_eager(method, backend, experts_impl):
    from base.hf.experts_impl import register_base_triton

    register_base_triton()
    # grouped_mm is captured in bf16 only (its fp32 path copies from the host); same kernels either
    # way, so graph and eager must agree exactly in either dtype
    dtype = "bfloat16" if experts_impl == "grouped_mm" else "float32"
    model = load_model(_cfg("tiny_qwen3", device="cuda", dtype=dtype), ROOT, experts_impl=experts_impl)
    eager, eager_rows = _decode_gpu(model, "qwen3_moe", method, backend, graph=False)
    graph, graph_rows = _decode_gpu(model, "qwen3_moe", method, backend, graph=True)
    assert graph.eager_steps == 1 and eager.eager_steps == 19  # the graph path: one warm-up step
    assert torch.equal(graph.tokens_BN, eager.tokens_BN)
    assert graph_rows == eager_rows
    assert all(r["kept"] <= 3 for r in graph_rows) or method == "dense"


GPU_RULES = [  # every rule on the selection kernel (issue 25): selector, k0, coverage, reassign
    ("base_anchor", 1, None, "backfill"), ("xshare", 1, None, "backfill"), ("lynx", 1, None, "drop"),
    ("top1_union", None, None, "backfill"), ("oea", 1, None, "backfill"), ("router_sum", None, 0.9, "backfill"),
    ("base", None, None, "similar"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("method,k0,coverage,mode", GPU_RULES)
def test_gpu_every_rule_on_the_kernel_graph_replay_equals_eager(method, k0, coverage, mode):
    """Each rule the selection kernel runs, in the decode engine on the GPU: graph replay gives the
    eager steps' tokens and statistics (float32, base_triton experts)."""
    from base.hf.experts_impl import register_base_triton
    from base.hf.families import find_moe_layers

    register_base_triton()
    model = load_model(_cfg("tiny_qwen3", device="cuda", dtype="float32"), ROOT, experts_impl="base_triton")
    arts = model_artifacts(model)
    layers = find_moe_layers(model)
    arts.sim_LEE = torch.rand(len(layers), layers[0].num_experts, layers[0].num_experts,
                              generator=torch.Generator().manual_seed(0))
    ids = torch.randint(3, 90, (16, 7), generator=torch.Generator().manual_seed(2)).cuda()
    mask = torch.ones_like(ids)

    def run(graph: bool):
        sel = build_selector(method, arts, k0=k0, coverage=coverage)
        opts = BudgetOptions(budget=None if method == "oea" else 3, backend="triton", reassign=mode)
        budget = install_budget(model, "qwen3_moe", sel, opts)
        try:
            assert all(type(b.selection).__name__ == "TritonSelection" for b in budget.blocks)
            res = DecodeEngine(model, 16, 48, budget=budget, pad_id=0, graph=graph).generate(ids, mask, 12,
                                                                                             stop_at_eos=False)
            return res, budget.stats_rows()
        finally:
            budget.remove()

    eager, eager_rows = run(False)
    graph, graph_rows = run(True)
    assert graph.eager_steps == 1
    assert torch.equal(graph.tokens_BN, eager.tokens_BN)
    _same_stats(graph_rows, eager_rows)


def _same_stats(rows: list[dict], ref: list[dict]) -> None:
    """Counts (union, kept, lost tokens) equal; the weight sums to fp32 rounding: the eager step
    and the replay sum a row's weights in a different order (seen on an H200: 16.0 and 15.999999)."""
    assert len(rows) == len(ref)
    for r, q in zip(rows, ref):
        assert r.keys() == q.keys()
        for key in r:
            if key.startswith("weight_"):
                assert r[key] == pytest.approx(q[key], rel=1e-6), (key, r, q)
            else:
                assert r[key] == q[key], (key, r, q)


@pytest.mark.gpu
@pytest.mark.parametrize("method,skinny", [("dense", False), ("base", False), ("base", True), ("dense", True)])
def test_gpu_compiled_graph_equals_eager(method, skinny, monkeypatch):
    """The default GPU step: compiled attention/norm regions inside the graph (float32, base_triton
    experts, Triton selection): the same tokens and selections as uncompiled eager decoding; also
    with the attention's projections on kernels/skinny.py (`skinny`: the kernel forced for every
    decode shape, the router's GEMM's too, as a tuned table naming the tiny model's shapes would;
    without it they keep cuBLAS)."""
    import kernels.skinny as ks
    from base.hf.experts_impl import register_base_triton

    if skinny:
        monkeypatch.setattr(ks, "skinny_launch", lambda N, K, T, device: ks.SkinnyLaunch()
                            if device.type == "cuda" and T <= ks.MAX_TOKENS else None)

    register_base_triton()
    model = load_model(_cfg("tiny_qwen3", device="cuda", dtype="float32"), ROOT, experts_impl="base_triton")
    eager, eager_rows = _decode_gpu(model, "qwen3_moe", method, "triton", graph=False)
    graph, graph_rows = _decode_gpu(model, "qwen3_moe", method, "triton", graph=True, compile=True)
    assert graph.eager_steps == 1
    assert torch.equal(graph.tokens_BN, eager.tokens_BN)
    key = [(r["layer"], r["union"], r["kept"], r["tokens"]) for r in graph_rows]
    assert key == [(r["layer"], r["union"], r["kept"], r["tokens"]) for r in eager_rows]


@pytest.mark.gpu
def test_gpu_mini_engine_graph_equals_generate():
    """The trained mini model on the GPU: graph-replayed greedy decoding (compiled regions, the
    default) gives generate's tokens."""
    cfg = _cfg("mini", device="cuda")
    from base.hf.experts_impl import register_base_triton

    register_base_triton()
    model, tok = load_model(cfg, ROOT, experts_impl="base_triton"), load_tokenizer(cfg, ROOT)
    enc = tok(PROMPTS, return_tensors="pt", padding=True).to("cuda")
    ref = model.generate(**enc, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=None)
    res = DecodeEngine(model, 8, 64, pad_id=tok.pad_token_id).generate(
        enc["input_ids"], enc["attention_mask"], 12, stop_at_eos=False)
    assert res.eager_steps == 1
    assert torch.equal(res.tokens_BN, ref[:, enc["input_ids"].shape[1]:].cpu())
