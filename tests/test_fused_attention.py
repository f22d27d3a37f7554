"""The fused decode attention (kernels/attention.py, NEW): q/k norm, rotary, the K/V write and the
attention of this step's token in one launch, against the op-by-op reference; the owned
attention module that calls it (base/hf/fused_attention.py) against transformers' own attention;
a throughput variant's forms (base/config.py VARIANT_FORMS); and the input norm folded into the
q/k/v GEMM (throughput.fold_input_norm).

Shapes: B rows, Hq query heads, K KV heads, L cache slots, D head size, C = (Hq + 2K) D."""
from __future__ import annotations

import pytest
import torch


def _step_inputs(B, Hq, K, L, D, dtype=torch.float32, device="cpu", shared_pos=False, norm=True, seed=0):
    """Raw q/k/v as views of one (B, C) projection output (the layout the module hands over), rotary
    cos/sin at each row's position, caches with garbage past each row's slot, and each row's slot."""
    g = torch.Generator().manual_seed(seed)
    qkv_BC = torch.randn(B, (Hq + 2 * K) * D, generator=g).to(device, dtype)
    q_BHD = qkv_BC[:, : Hq * D].view(B, Hq, D)
    k_BKD = qkv_BC[:, Hq * D: (Hq + K) * D].view(B, K, D)
    v_BKD = qkv_BC[:, (Hq + K) * D:].view(B, K, D)
    pos_B = torch.full((B,), 37) if shared_pos else torch.randint(0, L - 1, (B,), generator=g)
    angle_BD = pos_B[:, None].float() * torch.rand(D // 2, generator=g).repeat(2)[None, :]
    cos_B1D, sin_B1D = (f(angle_BD)[:, None].to(device, dtype) for f in (torch.cos, torch.sin))
    k_BKLD = torch.randn(B, K, L, D, generator=g).to(device, dtype)
    v_BKLD = torch.randn(B, K, L, D, generator=g).to(device, dtype)
    allowed_BL = torch.rand(B, L, generator=g) > 0.3
    allowed_BL[torch.arange(B), pos_B] = True  # the engine marks the slot it writes
    q_norm, k_norm = (1 + 0.1 * torch.randn(D, generator=g)).to(device, dtype), (1 + 0.1 * torch.randn(D, generator=g)).to(device, dtype)
    from kernels.attention import NewToken

    pos = pos_B[:1] if shared_pos else pos_B
    new = NewToken(k_BKD, v_BKD, cos_B1D, sin_B1D, pos.to(device), q_norm if norm else None,
                   k_norm if norm else None, 1e-6)
    return q_BHD, new, k_BKLD, v_BKLD, allowed_BL.to(device), int(pos_B.max())


@pytest.mark.parametrize("shared_pos", [False, True])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("block_n,target", [(64, 264), (16, 64)])
def test_fused_decode_attention_matches_the_op_by_op_reference(shared_pos, norm, block_n, target):
    """Interpreted on the CPU, one share per (row, KV head) or many (only share 0 writes; the others
    take the new slot from registers): the output as the reference's, and both caches written at
    each row's slot and nowhere else."""
    from kernels.attention import (
        AttentionLaunch,
        fused_decode_attention,
        fused_decode_attention_reference,
    )

    q, new, k_cache, v_cache, allowed, last = _step_inputs(3, 8, 2, 48, 32, shared_pos=shared_pos, norm=norm)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    launch = AttentionLaunch(block_n=block_n, num_warps=2, target_programs=target)
    out = fused_decode_attention(q, new, k_cache, v_cache, allowed, torch.tensor([last]), 0.3, launch=launch)
    ref = fused_decode_attention_reference(q, new, k_ref, v_ref, allowed, last, 0.3)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_cache, k_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(v_cache, v_ref)


def test_in_half_precision_the_written_key_rounds_as_transformers_ops_round():
    """float16 (the interpreter gets bfloat16 wrong): the key the kernel writes, normed and rotated
    in one pass, equals bit for bit the one transformers' ops make one rounding at a time; the
    output within float16's resolution."""
    from kernels.attention import (
        fused_decode_attention,
        fused_decode_attention_reference,
    )

    q, new, k_cache, v_cache, allowed, last = _step_inputs(3, 8, 2, 48, 32, dtype=torch.float16)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    out = fused_decode_attention(q, new, k_cache, v_cache, allowed, torch.tensor([last]), 0.3)
    ref = fused_decode_attention_reference(q, new, k_ref, v_ref, allowed, last, 0.3)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    torch.testing.assert_close(out, ref, rtol=2e-3, atol=2e-3)


def test_fused_decode_attention_reads_the_new_slot_from_registers_not_the_stale_cache():
    """Every share attends to the new token's rotated key even where the cache still holds the old
    one: with the slot's old key set to NaN, a share that read memory would return NaN."""
    from kernels.attention import (
        AttentionLaunch,
        fused_decode_attention,
        fused_decode_attention_reference,
    )

    q, new, k_cache, v_cache, allowed, last = _step_inputs(2, 4, 2, 64, 16, shared_pos=True)
    k_cache[:, :, 37], v_cache[:, :, 37] = float("nan"), float("nan")
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    launch = AttentionLaunch(block_n=16, num_warps=2, target_programs=16)  # 3 shares per (row, head)
    # the reference writes first, then reads: its answer has no NaN
    ref = fused_decode_attention_reference(q, new, k_ref, v_ref, allowed, last, 0.3)
    out = fused_decode_attention(q, new, k_cache, v_cache, allowed, torch.tensor([last]), 0.3, launch=launch)
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_a_slot_outside_the_cache_is_not_written():
    """As kernels/kv_write.py: a row whose slot lies past the cache writes nothing (and attends as
    the reference does, over what the cache holds)."""
    from dataclasses import replace

    from kernels.attention import (
        fused_decode_attention,
        fused_decode_attention_reference,
    )

    q, new, k_cache, v_cache, allowed, _ = _step_inputs(3, 4, 2, 40, 16)
    new = replace(new, pos_B=torch.tensor([3, 40, 7]))
    allowed[0, 3] = allowed[2, 7] = True
    k_ref, v_ref, k_before = k_cache.clone(), v_cache.clone(), k_cache.clone()
    out = fused_decode_attention(q, new, k_cache, v_cache, allowed, torch.tensor([7]), 0.3)
    ref = fused_decode_attention_reference(q, new, k_ref, v_ref, allowed, 7, 0.3)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(k_cache[1], k_before[1]) and torch.equal(v_cache, v_ref)
    assert not torch.equal(k_cache[0], k_before[0])


def test_fused_decode_attention_refuses_partial_rotary_and_one_norm():
    from dataclasses import replace

    from kernels.attention import fused_decode_attention

    q, new, k_cache, v_cache, allowed, last = _step_inputs(2, 4, 2, 16, 16)
    with pytest.raises(ValueError, match="full rotary"):
        fused_decode_attention(q, replace(new, cos_BD=new.cos_BD[..., :8]), k_cache, v_cache, allowed,
                               torch.tensor([last]), 0.3)
    with pytest.raises(ValueError, match="both q and k norm"):
        fused_decode_attention(q, replace(new, k_norm_D=None), k_cache, v_cache, allowed, torch.tensor([last]), 0.3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,shared_pos", [(16, True), (16, False), (64, False)])
def test_gpu_fused_decode_attention(B, shared_pos, dtype):
    """Compiled (Qwen3-30B-A3B's heads): the caches as the reference writes them (bf16: the rotated
    key within one rounding), the output as the reference's, and the same again when replayed in a
    CUDA graph."""
    from kernels.attention import (
        fused_decode_attention,
        fused_decode_attention_reference,
    )

    q, new, k_cache, v_cache, allowed, last = _step_inputs(B, 32, 4, 1024, 128, dtype, "cuda", shared_pos)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    last_1 = torch.tensor([last], device="cuda")
    out = fused_decode_attention(q, new, k_cache, v_cache, allowed, last_1, 0.1)
    ref = fused_decode_attention_reference(q, new, k_ref, v_ref, allowed, last, 0.1)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(k_cache.float(), k_ref.float(), rtol=tol, atol=tol)
    assert torch.equal(v_cache, v_ref)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = fused_decode_attention(q, new, k_cache, v_cache, allowed, last_1, 0.1)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(replayed, out)


# ---- the owned module (base/hf/fused_attention.py) ----------------------------------------------
QUALIFY = {"qwen3": 2, "qwen2": 2, "mixtral": 2, "olmoe": 0, "gpt_oss": 0, "deepseek": 0}


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow) if f in ("deepseek", "gpt_oss") else f
                                    for f in sorted(QUALIFY)])  # the slow two: seconds to build
def test_which_attention_modules_take_the_fused_form_and_remove_restores_them(family):
    """Per-head q/k norm (Qwen3) or none (Qwen2-MoE, Mixtral): wrapped; OLMoE's q/k norm over all
    heads, GPT-OSS's sinks and DeepSeek's MLA: left as they are."""
    from base.config import FUSED_ATTENTION_FAMILIES
    from base.hf.fused_attention import FusedAttention, FusedDecodeAttention
    from base.hf.loading import load_model
    from tests.helpers import ROOT, tiny_model_config

    cfg = tiny_model_config(family)
    model = load_model(cfg, ROOT, seed=0)
    before = [type(layer.self_attn) for layer in model.model.layers]
    fused = FusedAttention(model)
    assert fused.layers == QUALIFY[family] * (len(before) // 2)
    assert (fused.layers > 0) == (cfg.family in FUSED_ATTENTION_FAMILIES)  # what the config refuses
    assert sum(isinstance(layer.self_attn, FusedDecodeAttention) for layer in model.model.layers) == fused.layers
    fused.remove()
    assert [type(layer.self_attn) for layer in model.model.layers] == before


def _decode(model, fused: bool, continuous: bool = False):
    from base.runtime.continuous import ContinuousEngine
    from base.runtime.engine import DecodeEngine
    from base.runtime.scheduler import Request, serve
    from tests.helpers import left_padded

    if continuous:  # per-row write slots, refills: 7 requests through 3 slots
        g = torch.Generator().manual_seed(3)
        reqs = [Request(torch.randint(3, 200, (int(n),), generator=g).tolist(), 5)
                for n in torch.randint(2, 9, (7,), generator=g)]
        engine = ContinuousEngine(model, 3, 32, pad_id=0, fused_attention=fused)
        try:
            done, _ = serve(engine, reqs, pad_id=0, stop_at_eos=False)
            return [d.tokens for d in done]
        finally:
            engine.release()
    ids, mask = left_padded([5, 3, 7], 200, 0, seed=1)
    engine = DecodeEngine(model, 4, 32, pad_id=0, fused_attention=fused)
    try:
        return engine.generate(ids, mask, 8, stop_at_eos=False).tokens_BN.tolist()
    finally:
        engine.release()


@pytest.mark.parametrize("family,continuous", [("qwen3", False), ("qwen3", True), ("mixtral", False), ("qwen2", False)])
def test_the_engine_decodes_the_same_tokens_through_the_fused_op(family, continuous, monkeypatch):
    """On the CPU (the op's reference): the same greedy tokens as the unfused attention, in the
    static engine (one write slot for every row, left padding) and the continuous one (a slot per
    row, refills), and every decode step of every layer went through the op."""
    from base.hf.loading import load_model
    from kernels import attention
    from tests.helpers import ROOT, tiny_model_config, torch_threads

    calls = []
    reference = attention.fused_decode_attention_reference
    monkeypatch.setattr(attention, "fused_decode_attention_reference",
                        lambda *a, **k: calls.append(1) or reference(*a, **k))
    with torch_threads(1):
        model = load_model(tiny_model_config(family), ROOT, seed=0)
        plain = _decode(model, False, continuous)
        assert not calls
        assert _decode(model, True, continuous) == plain
    assert len(calls) % 2 == 0 and len(calls) >= 2 * 7  # 2 layers, at least 7 decode steps


@pytest.mark.gpu
@pytest.mark.parametrize("method,fold", [("dense", False), ("base", False), ("base", True)])
@pytest.mark.parametrize("continuous", [False, True])
def test_gpu_compiled_graph_with_the_fused_op_equals_eager(method, fold, continuous):
    """The compiled, graph-replayed step with the fused attention (float32, Triton experts and
    selection), and with the input norm folded into the q/k/v GEMM: the same tokens and selections
    as uncompiled eager decoding without either."""
    from base.hf.budget import BudgetOptions
    from base.hf.experts_impl import register_base_triton
    from base.hf.loading import load_model
    from base.method.selectors import build_selector
    from base.runtime.continuous import ContinuousEngine
    from base.runtime.engine import DecodeEngine
    from base.runtime.scheduler import Request, serve
    from tests.helpers import (
        ROOT,
        budgeted,
        left_padded,
        model_artifacts,
        tiny_model_config,
    )

    register_base_triton()
    cfg = tiny_model_config("qwen3")
    cfg.device, cfg.experts_impl = "cuda", "base_triton"
    model = load_model(cfg, ROOT, seed=0, experts_impl="base_triton")
    results = []
    for fast in (False, True):
        sel = None if method == "dense" else build_selector(method, model_artifacts(model))
        with budgeted(model, "qwen3_moe", sel, BudgetOptions(budget=3, backend="triton")) as budget:
            kw = {"budget": budget, "pad_id": 0, "graph": fast, "compile": fast, "fused_attention": fast,
                  "fold_input_norm": fast and fold}
            if continuous:
                g = torch.Generator().manual_seed(4)
                reqs = [Request(torch.randint(3, 200, (int(n),), generator=g).tolist(), 6)
                        for n in torch.randint(2, 9, (9,), generator=g)]
                engine = ContinuousEngine(model, 4, 32, **kw)
                try:
                    tokens = [d.tokens for d in serve(engine, reqs, pad_id=0, stop_at_eos=False)[0]]
                finally:
                    engine.release()
            else:
                ids, mask = left_padded([7, 4, 7, 6] * 4, 200, 0, seed=2)
                engine = DecodeEngine(model, 16, 48, **kw)
                try:
                    tokens = engine.generate(ids.cuda(), mask.cuda(), 20, stop_at_eos=False).tokens_BN.tolist()
                finally:
                    engine.release()
            results.append((tokens, [(r["layer"], r["union"], r["kept"], r["tokens"]) for r in budget.stats_rows()]))
    assert results[1] == results[0]


@pytest.mark.slow
def test_the_fused_op_compiles_in_place_inside_a_region():
    """Inside torch.compile (as in the engine's compiled attention half) the op writes the caches it
    declares mutated in place: no cache-sized temporary, no clone, no graph break; the output and
    the caches as eager."""
    import re

    from torch._inductor.utils import run_and_get_code

    from base.hf.fused_attention import _fused_op

    B, Hq, K, L, D = 3, 8, 2, 24, 16
    q, new, k_cache, v_cache, allowed, last = _step_inputs(B, Hq, K, L, D)

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("k_cache", k_cache.clone())
            self.register_buffer("v_cache", v_cache.clone())

        def forward(self, q, k, v, cos, sin):
            out = _fused_op(q * 1, k, v, cos, sin, new.pos_B, new.q_norm_D, new.k_norm_D, new.eps, self.k_cache,
                            self.v_cache, allowed, torch.tensor([last]), 0.3)
            return out + 0

    eager = Holder()
    expected = eager(q, new.k_BKD, new.v_BKE, new.cos_BD, new.sin_BD)
    holder = Holder()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    out, codes = run_and_get_code(torch.compile(holder.forward, dynamic=False, fullgraph=True),
                                  q, new.k_BKD, new.v_BKE, new.cos_BD, new.sin_BD)
    code = "\n".join(codes)
    allocated = re.findall(r"empty_strided\w*\(\(([0-9, ]*)\)", code)
    assert "fused_decode_attention" in code  # the op itself, kept whole
    assert f"{B}, {K}, {L}, {D}" not in allocated and "clone" not in code
    torch.testing.assert_close(out, expected)
    assert torch.equal(holder.k_cache, eager.k_cache) and torch.equal(holder.v_cache, eager.v_cache)
    assert not torch.equal(holder.k_cache, k_cache)  # written


def test_compiled_regions_with_the_fused_op_decode_like_the_unfused_engine(monkeypatch):
    """The engine's compiled attention halves (Inductor on the CPU) with the fused op: the same
    tokens as the unfused eager engine, one compiled half for all four layers, and every decode
    step of every layer through the op."""
    from base.hf.loading import load_model
    from base.runtime.engine import DecodeEngine
    from kernels import attention
    from tests.helpers import ROOT, left_padded, tiny_model_config, torch_threads

    calls = []
    reference = attention.fused_decode_attention_reference
    monkeypatch.setattr(attention, "fused_decode_attention_reference",
                        lambda *a, **k: calls.append(1) or reference(*a, **k))
    with torch_threads(1):
        model = load_model(tiny_model_config("qwen3", num_hidden_layers=4), ROOT, seed=0)
        ids, mask = left_padded([5, 3], 200, 0, seed=1)
        tokens = []
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        for fused in (False, True):
            engine = DecodeEngine(model, 3, 32, pad_id=0, compile=fused, regions="layer", fused_attention=fused)
            try:
                tokens.append(engine.generate(ids, mask, 10, stop_at_eos=False).tokens_BN)
                assert fused is False or len(engine.regions.layers) == 4
            finally:
                engine.release()
    assert torch.equal(tokens[1], tokens[0])
    assert len(calls) == 4 * 9  # 4 layers, 9 decode steps
    assert 0 < torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2  # the half and the final norm


# ---- forms of a throughput variant (base/config.py VARIANT_FORMS) --------------------------------
def test_method_specs_take_engine_forms_and_refuse_unknown_ones():
    from base.config import ConfigError, parse_method_spec

    assert parse_method_spec("base+fused")["forms"] == ("fused",)
    assert parse_method_spec("oea:1+skinny+fused") == {"method": "oea", "k0": 1, "impl": None,
                                                       "forms": ("fused", "skinny")}
    assert parse_method_spec("dense")["forms"] == ()
    assert parse_method_spec("base+fold")["forms"] == ("fold",)
    with pytest.raises(ConfigError, match="form='fast' is not valid; choose one of: fused, skinny, fold, compile_prefill"):
        parse_method_spec("base+fast")


def test_a_variant_with_a_form_runs_its_own_engine_beside_the_plain_one(monkeypatch):
    """In one throughput measurement (CPU, two interleaved rounds) `dense` and `dense+fused` are two
    rows: the second's engine takes the fused attention, the first's does not, and its speed-up is
    against plain dense."""
    from base.config import ThroughputConfig
    from base.hf.loading import load_model
    from base.runtime.throughput import Variant, measure
    from kernels import attention
    from tests.helpers import ROOT, tiny_model_config, torch_threads

    calls = []
    reference = attention.fused_decode_attention_reference
    monkeypatch.setattr(attention, "fused_decode_attention_reference",
                        lambda *a, **k: calls.append(1) or reference(*a, **k))
    cfg = ThroughputConfig(batch_sizes=[2], prompt_len=4, gen_tokens=4, stats_steps=2, repeats=2, profile_batch=None)
    with torch_threads(1):
        model = load_model(tiny_model_config("qwen3"), ROOT, seed=0)
        measure(model, lambda v, stats: None, [Variant("dense")], cfg, seed=0)
        assert not calls
        rows, _, _ = measure(model, lambda v, stats: None, [Variant("dense"), Variant("dense", forms=("fused",))],
                             cfg, seed=0)
    assert calls
    assert [(r["variant"], r["fused_attention"], r["regions"]) for r in rows] == \
        [("dense", False, "layer_combo"), ("dense+fused", True, "layer_combo")]
    assert rows[0]["speedup_vs_dense"] == 1.0 and rows[1]["speedup_vs_dense"] > 0
    assert all(r["repeats"] == 2 for r in rows)


# ---- the input norm folded into the q/k/v GEMM (throughput.fold_input_norm, METHOD+fold) ---------
@pytest.mark.slow
def test_the_folded_input_norm_decodes_like_the_unfused_engine(monkeypatch):
    """Compiled attention halves (Inductor on the CPU) with the fused attention and the input norm
    inside the q/k/v projection, the projection forced onto kernels/skinny.py's norm form (the
    interpreter; on a CPU it would otherwise keep the norm module and F.linear): the unfused
    engine's tokens, and every decode step of every layer through the norm form."""
    import kernels.skinny as ks
    from base.hf.loading import load_model
    from base.runtime.engine import DecodeEngine
    from tests.helpers import ROOT, left_padded, tiny_model_config, torch_threads

    norm_launches = []
    kernel = ks.skinny_linear
    monkeypatch.setattr(ks, "skinny_launch", lambda N, K, T, device, tuned_either_way=False:
                        ks.SkinnyLaunch(block_n=16, block_k=16, num_stages=1) if tuned_either_way else None)
    monkeypatch.setattr(ks, "skinny_linear", lambda x, w, la, norm_K=None, eps=1e-6:
                        (norm_K is not None and norm_launches.append(la)) or kernel(x, w, la, norm_K, eps))
    with torch_threads(1):
        model = load_model(tiny_model_config("qwen3", num_hidden_layers=4), ROOT, seed=0)
        ids, mask = left_padded([5, 3], 200, 0, seed=1)
        tokens = []
        torch._dynamo.reset()
        for fold in (False, True):
            engine = DecodeEngine(model, 3, 32, pad_id=0, compile=fold, regions="layer", fused_attention=fold,
                                  fold_input_norm=fold)
            try:
                tokens.append(engine.generate(ids, mask, 10, stop_at_eos=False).tokens_BN)
            finally:
                engine.release()
    assert torch.equal(tokens[1], tokens[0])
    assert len(norm_launches) == 4 * 9  # 4 layers, 9 decode steps; the prefill keeps the norm module


def test_the_fold_needs_the_fused_attention():
    from base.hf.loading import load_model
    from base.runtime.engine import DecodeEngine
    from tests.helpers import ROOT, tiny_model_config

    model = load_model(tiny_model_config("qwen3"), ROOT, seed=0)
    with pytest.raises(ValueError, match="it needs fused_attention=True"):
        DecodeEngine(model, 2, 16, fold_input_norm=True)
