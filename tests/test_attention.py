"""The engine's attention (base/hf/attention.py) and regional compilation (base/runtime/regional.py): grouped
decode attention equals per-head attention over repeated K/V (masks, sliding windows, sinks, key
and value sizes that differ); the engine decodes every family like transformers' generate, eager
and compiled; one compiled graph serves every layer."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from base.config import ModelConfig
from base.hf.attention import StaticKV, engine_attention
from base.hf.loading import load_model
from base.runtime.engine import DecodeEngine

ROOT = Path(__file__).resolve().parents[1]


def _reference(q_BHQD, k_BKLD, v_BKLE, allowed_BQL, scaling, sinks_H=None):
    """Per query head, over K/V repeated for its group; softmax with an optional sink logit."""
    G = q_BHQD.shape[1] // k_BKLD.shape[1]
    k_BHLD, v_BHLE = k_BKLD.repeat_interleave(G, 1), v_BKLE.repeat_interleave(G, 1)
    s_BHQL = torch.einsum("bhqd,bhld->bhql", q_BHQD, k_BHLD) * scaling
    s_BHQL = s_BHQL.masked_fill(~allowed_BQL[:, None], float("-inf"))
    if sinks_H is not None:
        sink_BHQ1 = sinks_H.view(1, -1, 1, 1).expand(*s_BHQL.shape[:3], 1)
        p_BHQL = torch.cat([s_BHQL, sink_BHQ1], -1).softmax(-1)[..., :-1]
    else:
        p_BHQL = s_BHQL.softmax(-1)
    return torch.einsum("bhql,bhle->bqhe", p_BHQL, v_BHLE)


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("heads", [(8, 2), (4, 4)])
@pytest.mark.parametrize("kernel", [False, True])
def test_prefill_then_decode_equals_attention_over_repeated_kv(window, sinks, heads, kernel, monkeypatch):
    """A module's cache filled by a prefill of P tokens then decode steps: each step's output
    equals attention over every key so far (left-padded rows masked, D=12 keys, E=8 values), on
    the PyTorch path and on a GPU's (`kernel`: kernels/attention.py, here through Triton's
    interpreter), attention sinks included."""
    from base.hf import attention

    monkeypatch.setattr(attention, "kernel_decode", lambda query: kernel)
    torch.manual_seed(0)
    Hq, K = heads
    B, P, L, D, E, steps = 3, 6, 16, 12, 8, 5
    module = nn.Module()
    kv = StaticKV(L, torch.device("cpu"))
    sinks_H = torch.randn(Hq) if sinks else None
    pad_B = torch.tensor([0, 2, 5])  # left padding per row
    valid_BL = torch.zeros(B, L, dtype=torch.bool)
    for b in range(B):
        valid_BL[b, pad_B[b]:P] = True
    keys_BKLD, values_BKLE = torch.randn(B, K, L, D), torch.randn(B, K, L, E)
    model = nn.Module()
    model.config = type("C", (), {"_attn_implementation": "sdpa"})()
    with kv.active(model):
        kv.set_write_pos(torch.arange(P))
        causal_BPL = torch.zeros(B, P, L, dtype=torch.bool)
        causal_BPL[:, :, :P] = torch.ones(P, P, dtype=torch.bool).tril() & valid_BL[:, None, :P]
        causal_BPL[:, :, :P] |= torch.eye(P, dtype=torch.bool)
        engine_attention(module, torch.randn(B, Hq, P, D), keys_BKLD[:, :, :P], values_BKLE[:, :, :P],
                         causal_BPL[:, None], scaling=0.3, sliding_window=window, s_aux=sinks_H)
        for t in range(P, P + steps):
            kv.set_write_pos(torch.tensor([t]))
            valid_BL[:, t] = True
            q_BH1D = torch.randn(B, Hq, 1, D)
            out = engine_attention(module, q_BH1D, keys_BKLD[:, :, t:t + 1], values_BKLE[:, :, t:t + 1],
                                   valid_BL[:, None, None], scaling=0.3, sliding_window=window, s_aux=sinks_H)[0]
            allowed_B1L = valid_BL[:, None].clone()
            if window:
                allowed_B1L[..., : t - window + 1] = False
            ref = _reference(q_BH1D, keys_BKLD[:, :, : t + 1], values_BKLE[:, :, : t + 1],
                             allowed_B1L[..., : t + 1], 0.3, sinks_H)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert model.config._attn_implementation == "sdpa"  # restored


@pytest.mark.slow
def test_per_row_cache_writes_land_in_each_rows_slot_and_compile_in_place():
    """Continuous batching's decode step writes row b's K/V at its own slot pos[b] (one op for both
    caches): the same caches as a scatter along the slots, and inside a compiled function in place,
    with no temporary the size of a cache and no graph break (Inductor compiled a per-row scatter_
    to a copy of the whole cache and a copy back, per layer and per K and V: 2 ms of a 7.9 ms step
    on an H200; run eagerly instead, the write split the layer's compiled region in two)."""
    from base.hf.attention import _write_kv_rows_op

    B, K, L, D, E = 4, 2, 64, 8, 6
    k_BKD, v_BKE, slot_B = torch.randn(B, K, D), torch.randn(B, K, E), torch.tensor([3, 5, 0, 63])

    def scattered(cache, new):
        n = new.shape[-1]
        return cache.clone().scatter_(2, slot_B.view(B, 1, 1, 1).expand(B, K, 1, n), new[:, :, None])

    k_cache, v_cache = torch.randn(B, K, L, D), torch.randn(B, K, L, E)
    want_k, want_v = scattered(k_cache, k_BKD), scattered(v_cache, v_BKE)
    _write_kv_rows_op(k_cache, v_cache, k_BKD, v_BKE, slot_B)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)

    k_got, v_got = _compiled_cache_write(_write_kv_rows_op, (B, K, L, D), (B, K, L, E), k_BKD, v_BKE, slot_B)
    assert torch.equal(k_got, scattered(torch.zeros(B, K, L, D), k_BKD))
    assert torch.equal(v_got, scattered(torch.zeros(B, K, L, E), v_BKE))


def _compiled_cache_write(op, k_shape: tuple, v_shape: tuple, k_new, v_new, *where):
    """`op` (a cache write that mutates both caches) compiled over two zeroed cache buffers and a
    read after it, as attention does; asserts Inductor wrote in place (no cache-sized temporary, no
    clone, the read sees the write) and returns the caches."""
    from torch._inductor.utils import run_and_get_code

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("k_cache", torch.zeros(k_shape))
            self.register_buffer("v_cache", torch.zeros(v_shape))

        def forward(self, k_new, v_new, *where):
            op(self.k_cache, self.v_cache, k_new, v_new, *where)
            # summed in float64: Inductor's vectorised sum and eager's take different orders, whose float32
            # roundings differed by more than allclose allows where the two sums nearly cancel
            return self.k_cache.double().sum() + self.v_cache.double().sum()

    holder = Holder()
    torch._dynamo.reset()
    out, codes = run_and_get_code(torch.compile(holder.forward, dynamic=False, fullgraph=True), k_new, v_new, *where)
    assert torch.allclose(out, k_new.double().sum() + v_new.double().sum())
    code = "\n".join(codes)
    allocated = re.findall(r"empty_strided\w*\(\(([0-9, ]*)\)", code)
    assert ", ".join(map(str, k_shape)) not in allocated and ", ".join(map(str, v_shape)) not in allocated
    assert "clone" not in code
    return holder.k_cache, holder.v_cache


@pytest.mark.slow
def test_packed_cache_writes_land_at_each_tokens_row_and_slot_and_compile_in_place():
    """A packed prefill's K/V write (the compiled packed prefill runs it in a compiled region): token
    t's heads at (row_T[t], slot_T[t]) of both caches, and compiled in place, with no temporary the
    size of a cache and no clone (what an index_copy_ into a view of the cache became on an H200)."""
    from base.hf.attention import _write_packed_kv_op

    B, K, L, D, E, T = 3, 2, 32, 8, 6, 5
    k_1KTD, v_1KTE = torch.randn(1, K, T, D), torch.randn(1, K, T, E)
    row_T, slot_T = torch.tensor([0, 0, 2, 1, 2]), torch.tensor([0, 1, 7, 31, 8])

    def written(cache, new_1KTN):
        out = cache.clone()
        for t in range(T):
            out[row_T[t], :, slot_T[t]] = new_1KTN[0, :, t]
        return out

    k_got, v_got = _compiled_cache_write(_write_packed_kv_op, (B, K, L, D), (B, K, L, E), k_1KTD, v_1KTE, row_T,
                                         slot_T)
    assert torch.equal(k_got, written(torch.zeros(B, K, L, D), k_1KTD))
    assert torch.equal(v_got, written(torch.zeros(B, K, L, E), v_1KTE))


def test_per_row_writes_follow_the_positions_the_cache_refreshes_each_step():
    """Continuous batching's decode step: each row writes its K/V at its own slot; moving the
    positions in place and calling sync() (what the engine does at the start of every step) moves
    the writes with them, and the last slot decode attention reads (the largest position) with them."""
    B, K, L, D, Hq = 3, 2, 8, 4, 4
    module, model = nn.Module(), nn.Module()
    model.config = type("C", (), {"_attn_implementation": "sdpa"})()
    kv = StaticKV(L, torch.device("cpu"), batch=B)
    pos_B1 = torch.tensor([[0], [2], [5]])
    valid_BL = torch.ones(B, L, dtype=torch.bool)
    with kv.active(model):
        kv.set_write_pos(pos_B1)
        for step in range(2):
            k_BK1D, v_BK1D = torch.randn(B, K, 1, D), torch.randn(B, K, 1, D)
            engine_attention(module, torch.randn(B, Hq, 1, D), k_BK1D, v_BK1D, valid_BL[:, None, None], scaling=0.5)
            for b in range(B):
                assert torch.equal(module.base_k_cache[b, :, pos_B1[b, 0]], k_BK1D[b, :, 0])
                assert torch.equal(module.base_v_cache[b, :, pos_B1[b, 0]], v_BK1D[b, :, 0])
            assert module.base_last_slot.tolist() == [int(pos_B1.max())]
            pos_B1.add_(1)  # the step moves every row on, in place
            kv.sync()


def test_the_last_slot_read_is_the_largest_of_the_active_rows():
    """sync(active_B): decode attention reads up to the largest slot of a row still decoding; an
    ended row's old slot (kept until its next admission) and the spare slot past the cache (a row
    between prompt chunks) do not count; with no row active nothing past slot 0."""
    B, K, L, D, Hq = 4, 2, 16, 4, 4
    module, model = nn.Module(), nn.Module()
    model.config = type("C", (), {"_attn_implementation": "sdpa"})()
    kv = StaticKV(L + 1, torch.device("cpu"), batch=B)  # slot L: the spare one, as the continuous engine has
    pos_B1 = torch.tensor([[3], [12], [7], [L]])  # row 1 ended at 12, row 3 writes the spare slot
    with kv.active(model):
        kv.set_write_pos(pos_B1)
        engine_attention(module, torch.randn(B, Hq, 1, D), torch.randn(B, K, 1, D), torch.randn(B, K, 1, D),
                         torch.ones(B, 1, 1, L + 1, dtype=torch.bool), scaling=0.5)
        kv.sync()
        assert module.base_last_slot.tolist() == [L]  # every row, as before
        kv.sync(torch.tensor([True, False, True, False]))
        assert module.base_last_slot.tolist() == [7]
        kv.sync(torch.zeros(B, dtype=torch.bool))
        assert module.base_last_slot.tolist() == [0]


def test_attention_outside_an_engine_is_refused():
    with pytest.raises(RuntimeError, match="StaticKV.active"):
        engine_attention(nn.Module(), torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4),
                         torch.ones(1, 1, 1, 4, dtype=torch.bool))


def _model(name: str, layers: int | None = None):
    raw = yaml.safe_load((ROOT / "conf/model" / f"{name}.yaml").read_text())
    if layers:
        raw["arch"] = {**raw["arch"], "num_hidden_layers": layers}
        raw["arch"].pop("layer_types", None)
    return load_model(ModelConfig(**raw), ROOT, seed=0).eval()


def _generate_ref(model, ids, mask, n):
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[:, ids.shape[1]:]


def _engine_tokens(model, ids, mask, n, compile: bool, halves: int | None = None):
    """Greedy tokens of the decode engine (batch one row larger than the prompts), then released;
    `halves`: the compiled attention halves the engine must hold."""
    engine = DecodeEngine(model, ids.shape[0] + 1, 32, compile=compile)
    if halves is not None:
        assert len(engine.regions.layers) == halves
    try:
        return engine.generate(ids, mask, n, stop_at_eos=False).tokens_BN
    finally:
        engine.release()


FAMILIES = ["tiny_qwen3", "tiny_qwen2", "tiny_olmoe", "tiny_deepseek", "tiny_mixtral", "tiny_gpt_oss"]


@pytest.mark.parametrize("name", FAMILIES)
def test_engine_decodes_every_family_like_generate(name):
    """Left-padded prompts, 14 new tokens (past GPT-OSS's sliding window of 16): same tokens."""
    model = _model(name)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 100, (3, 7), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    mask[2, :4] = 0
    assert torch.equal(_engine_tokens(model, ids, mask, 14, compile=False), _generate_ref(model, ids, mask, 14))
    assert not any(hasattr(m, "base_k_cache") for m in model.modules())  # released


@pytest.mark.parametrize("name", ["tiny_gpt_oss", pytest.param("tiny_qwen3", marks=pytest.mark.slow)])
def test_the_gpu_decode_path_decodes_like_generate(name, monkeypatch):
    """The one-token step a GPU runs (kernels/attention.py's launch), here through Triton's
    interpreter: same tokens as generate, left padding included; GPT-OSS has attention sinks and
    sliding windows."""
    from base.hf import attention

    model = _model(name, layers=2)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 100, (3, 7), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    want = _generate_ref(model, ids, mask, 12)
    calls = []
    monkeypatch.setattr(attention, "kernel_decode", lambda query: calls.append(1) or True)
    assert torch.equal(_engine_tokens(model, ids, mask, 12, compile=False), want)
    assert calls  # the decode steps took the kernel path


def test_the_continuous_engines_kernel_path_serves_gpt_oss_as_generate(monkeypatch):
    """Continuous batching's one-token steps (each row its own slot) on the GPU's attention path,
    here through Triton's interpreter, with GPT-OSS's sinks and sliding window: every request gets
    generate's tokens for it alone, with more requests than slots."""
    from base.config import SchedulerConfig
    from base.hf import attention
    from base.runtime.continuous import ContinuousEngine
    from base.runtime.scheduler import Request, serve

    model = _model("tiny_gpt_oss", layers=2)
    g = torch.Generator().manual_seed(4)
    reqs = [Request(torch.randint(3, 100, (int(n),), generator=g).tolist(), 9) for n in (5, 8, 3, 6)]
    want = [_generate_ref(model, torch.tensor([r.ids]), torch.ones(1, len(r.ids), dtype=torch.long), r.max_new)[0]
            for r in reqs]
    calls = []
    monkeypatch.setattr(attention, "kernel_decode", lambda query: calls.append(1) or True)
    policy = SchedulerConfig()
    engine = ContinuousEngine(model, 2, 32, pad_id=0, buckets=policy.buckets)
    try:
        done, _ = serve(engine, reqs, pad_id=0, stop_at_eos=False, policy=policy)
    finally:
        engine.release()
    assert calls
    for d, w in zip(done, want, strict=True):
        assert d.tokens == w.tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("compile", [False, True])
def test_gpu_gpt_oss_decodes_like_generate_on_the_kernel(compile):
    """On a GPU, tiny GPT-OSS's one-token steps run kernels/attention.py with its attention sinks
    (replayed in a CUDA graph; `compile`: in the compiled attention half): generate's tokens."""
    # base_triton, as a CUDA run loads it: transformers' grouped_mm in fp32 copies from the host,
    # which a CUDA graph cannot capture
    raw = yaml.safe_load((ROOT / "conf/model/tiny_gpt_oss.yaml").read_text())
    model = load_model(ModelConfig(**{**raw, "device": "cuda"}), ROOT, seed=0, experts_impl="base_triton").eval()
    ids = torch.randint(3, 100, (3, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    ids, mask = ids.cuda(), mask.cuda()
    want = _generate_ref(model, ids, mask, 14).cpu()
    assert torch.equal(_engine_tokens(model, ids, mask, 14, compile=compile).cpu(), want)


@pytest.mark.parametrize("name", ["tiny_qwen3", pytest.param("tiny_gpt_oss", marks=pytest.mark.slow),
                                  pytest.param("tiny_deepseek", marks=pytest.mark.slow)])
def test_compiled_regions_decode_like_generate_with_one_graph_for_all_layers(name):
    """Regional compilation (Inductor on the CPU here; its combo kernels apply to GPU kernels only)
    of a 4-layer model: same tokens, and the
    layers share the compiled attention half and the final norm (no recompilation per layer: one graph per region
    kind and attention type, whatever the depth)."""
    model = _model(name, layers=4)
    ids = torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    assert torch.equal(_engine_tokens(model, ids, mask, 14, compile=True, halves=4), _generate_ref(model, ids, mask, 14))
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    attention_types = len(set(getattr(model.config, "layer_types", None) or ["full"]))
    assert 0 < graphs <= 1 + attention_types  # the final norm, and the attention half per type
    assert all("forward" not in m.__dict__ for m in model.modules())  # original forwards restored
    assert all(type(m.k_proj) is torch.nn.Linear for m in model.modules() if hasattr(m, "k_proj"))  # q/k/v unfused


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_layer_runs_as_one_attention_half_with_the_same_output(name):
    """The compiled region is a decoder layer's attention half (base/runtime/regional.py): every
    supported family's layers qualify, and the layer run as half + MoE block + add gives the model's
    logits bit for bit (eagerly here; what Inductor makes of the half is the compiled test's)."""
    from tests.helpers import layers_as_halves

    model = _model(name)
    ids = torch.randint(3, 100, (2, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
        with layers_as_halves(model) as n_halves:
            got = model(input_ids=ids, attention_mask=mask).logits
    assert n_halves == model.config.num_hidden_layers
    assert torch.equal(got, expected)


@pytest.mark.slow
def test_the_default_regions_decode_like_generate_through_the_skinny_kernel(monkeypatch):
    """The compiled halves' q/k/v and output projections through the custom op and
    kernels/skinny.py inside the compiled halves (forced on here: on the CPU, and on a GPU without a
    winning entry in its tuned table, they keep F.linear), and o_proj restored at release; the same
    tokens as generate."""
    import kernels.skinny as ks

    calls = []
    real = ks.skinny_linear
    monkeypatch.setattr(ks, "skinny_launch", lambda N, K, T, device: ks.SkinnyLaunch(block_k=32, num_stages=1))
    monkeypatch.setattr(ks, "skinny_linear", lambda *a, **kw: calls.append(a[1].shape) or real(*a, **kw))
    model = _model("tiny_qwen3", layers=2)
    ids = torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(2))
    torch._dynamo.reset()
    got = _engine_tokens(model, ids, torch.ones_like(ids), 6, compile=True, halves=2)
    assert torch.equal(got, _generate_ref(model, ids, torch.ones_like(ids), 6))
    attn = model.model.layers[0].self_attn
    fused = attn.q_proj.out_features + attn.k_proj.out_features + attn.v_proj.out_features
    assert {tuple(s) for s in calls} == {(attn.o_proj.out_features, attn.o_proj.in_features),
                                         (fused, attn.q_proj.in_features)}  # both projections, decode only
    assert all(type(m.o_proj) is torch.nn.Linear for m in model.modules() if hasattr(m, "o_proj"))
