"""Shared experts through the expert kernel (base/hf/shared_experts.py): a dense SwiGLU MLP in
chunks of the routed shape equals the MLP; the owned block runs it there, the model's logits as before.

On CPU the kernels run through Triton's interpreter (fp32, tiny shapes)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

import base.hf.shared_experts as shared_mod
from base.config import ModelConfig
from base.hf.budget import BudgetOptions, install_budget
from base.hf.loading import load_model
from base.hf.shared_experts import SharedChunks, _adjacent, constant_routing, seat
from kernels.experts import ExpertsLayout, fused_experts

ROOT = Path(__file__).resolve().parents[1]


def mlp_reference(x_TH, gate_IH, up_IH, down_HI, w_T, residual_TH):
    """residual + w * down(silu(gate x) * up x), float64, the MLP as written (no chunks)."""
    x = x_TH.double()
    a = F.silu(x @ gate_IH.double().T) * (x @ up_IH.double().T)
    return residual_TH.double() + w_T.double()[:, None] * (a @ down_HI.double().T)


# fast tier: three chunks on the kept path (the step's); the rest under make test-all
@pytest.mark.parametrize("kept,C", [(True, 3), pytest.param(True, 1, marks=pytest.mark.slow),
                                    pytest.param(False, 1, marks=pytest.mark.slow),
                                    pytest.param(False, 3, marks=pytest.mark.slow)])
def test_a_dense_mlp_in_chunks_equals_the_mlp(kept, C):
    """C chunks of I rows of one (2 I_s, H) [gate; up] block (up_offset = I_s) and strided down
    columns, every token on every chunk with its weight, the residual added: the MLP's output."""
    T, H, I = 5, 48, 24
    I_s = C * I
    g = torch.Generator().manual_seed(C)
    gate_up = torch.randn(2 * I_s, H, generator=g) / H**0.5
    down_HI = torch.randn(H, I_s, generator=g) / I_s**0.5
    x_TH = torch.randn(T, H, generator=g)
    residual_TH = torch.randn(T, H, generator=g)
    w_T = torch.rand(T, generator=g) + 0.5
    gate_CIH = gate_up.as_strided((C, I, H), (I * H, H, 1))
    down_CHI = down_HI.as_strided((C, H, I), (I, I_s, 1))
    idx_TC = torch.arange(C).expand(T, C).contiguous()
    w_TC = w_T[:, None].expand(T, C).contiguous()
    keep_C = torch.arange(C) if kept else None
    out = fused_experts(x_TH, gate_CIH, down_CHI, idx_TC, w_TC, keep_M=keep_C, residual_TH=residual_TH, up_offset=I_s)
    ref = mlp_reference(x_TH, gate_up[:I_s], gate_up[I_s:], down_HI, w_T, residual_TH)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    if C > 1:  # the offset is what finds up: each chunk's own [gate; up] is not this MLP
        other = fused_experts(x_TH, gate_CIH, down_CHI, idx_TC, w_TC, keep_M=keep_C, residual_TH=residual_TH)
        assert not torch.allclose(other.double(), ref, rtol=1e-3, atol=1e-3)


def test_up_offset_is_refused_for_the_interleaved_layout():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="concatenated"):
        fused_experts(x, torch.randn(1, 8, 8), torch.randn(1, 4, 8), torch.zeros(2, 1, dtype=torch.long),
                      torch.ones(2, 1), layout=ExpertsLayout(transposed=True, interleaved=True), up_offset=4)


def _mlp(H=16, I_s=12):
    mlp = torch.nn.Module()
    mlp.gate_proj, mlp.up_proj = torch.nn.Linear(H, I_s, bias=False), torch.nn.Linear(H, I_s, bias=False)
    mlp.down_proj, mlp.act_fn = torch.nn.Linear(I_s, H, bias=False), torch.nn.SiLU()
    return mlp


def test_seating_keeps_the_weights_and_shares_one_block():
    """gate and up become the halves of one block: same values, no second copy; a seated MLP
    gives chunks of the routed size where it divides I_s, one chunk where it does not."""
    mlp = _mlp()
    gate, up = mlp.gate_proj.weight.detach().clone(), mlp.up_proj.weight.detach().clone()
    assert not _adjacent(mlp.gate_proj.weight, mlp.up_proj.weight)
    assert SharedChunks.of(mlp, 4) is None  # not seated: the kernel would read the wrong rows
    assert seat(mlp)
    assert torch.equal(mlp.gate_proj.weight, gate) and torch.equal(mlp.up_proj.weight, up)
    assert mlp.gate_proj.weight.untyped_storage().data_ptr() == mlp.up_proj.weight.untyped_storage().data_ptr()
    assert SharedChunks.of(mlp, 4).C == 3 and SharedChunks.of(mlp, 5).C == 1
    with_bias = _mlp()
    with_bias.up_proj = torch.nn.Linear(16, 12, bias=True)
    assert not seat(with_bias) and SharedChunks.of(with_bias, 4) is None

    class QuantisedLinear(torch.nn.Linear):  # a subclass computes something else: left alone
        pass

    quantised = _mlp()
    quantised.gate_proj = QuantisedLinear(16, 12, bias=False)
    weight = quantised.gate_proj.weight
    assert not seat(quantised) and quantised.gate_proj.weight is weight


def test_constant_routing_puts_chunk_c_at_slot_c():
    idx_TC, ones_TC, keep_C = constant_routing(3, torch.device("cpu"), torch.float32)
    assert idx_TC.is_contiguous() and torch.equal(idx_TC[5], torch.arange(3))
    assert torch.equal(ones_TC[:2], torch.ones(2, 3)) and torch.equal(keep_C, torch.arange(3))


def _logits_with_and_without(name, monkeypatch, *, unseat=False):
    cfg = ModelConfig(**yaml.safe_load((ROOT / f"conf/model/{name}.yaml").read_text()))
    model = load_model(cfg, ROOT, seed=0, experts_impl="base_triton")
    ids_BS = torch.randint(3, 250, (3, 4), generator=torch.Generator().manual_seed(2))
    calls = []
    kernel = shared_mod.fused_experts
    monkeypatch.setattr(shared_mod, "fused_experts", lambda *a, **kw: calls.append(kw["up_offset"]) or kernel(*a, **kw))
    with torch.no_grad():
        expected = model(ids_BS).logits
        state = {k: v.clone() for k, v in model.state_dict().items()}
        moe = install_budget(model, cfg.family, None, BudgetOptions(budget=None))
        try:
            if unseat:  # a weight replaced after install: no longer one block with gate
                for block in moe.blocks:
                    mlp = getattr(block, block.family.shared_mlp)
                    mlp.up_proj.weight = torch.nn.Parameter(mlp.up_proj.weight.detach().clone())
            assert state.keys() == model.state_dict().keys()
            assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
            got = model(ids_BS).logits
            n_blocks = len(moe.blocks)
        finally:
            moe.remove()
    return cfg, expected, got, calls, n_blocks


def test_the_shared_call_takes_the_kept_path_whatever_the_routed_entry_says(monkeypatch):
    """A table whose routed entry keeps the four-launch path (kept bound 0, as DeepSeek-V2-Lite's
    H100 entry at 16 tokens): the shared chunks still run the two-launch kept path."""
    import kernels.experts as ke
    from kernels.experts import ExpertsConfig

    monkeypatch.setattr(shared_mod, "get_config", lambda H, I, T, device: ExpertsConfig(use_kept=False, kept_max=0))
    kept = []
    inner = ke._fused_experts_kept
    monkeypatch.setattr(ke, "_fused_experts_kept", lambda *a, **kw: kept.append(1) or inner(*a, **kw))
    mlp = _mlp(H=16, I_s=12)
    assert seat(mlp)
    chunks = SharedChunks.of(mlp, 4)
    x_TH, y_TH = torch.randn(3, 16), torch.randn(3, 16)
    out = chunks.forward(x_TH, y_TH, *constant_routing(chunks.C, torch.device("cpu"), torch.float32))
    assert kept == [1]
    with torch.no_grad():
        torch.testing.assert_close(out, y_TH + mlp.down_proj(F.silu(mlp.gate_proj(x_TH)) * mlp.up_proj(x_TH)),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["tiny_deepseek", pytest.param("tiny_qwen2", marks=pytest.mark.slow)])
def test_the_owned_block_runs_the_shared_experts_in_the_kernel(name, monkeypatch):
    """base_triton at a decode size (12 tokens): each MoE layer's shared MLP goes to the kernel
    (DeepSeek-V2 one chunk of 32 rows here, Qwen2 two, behind its sigmoid gate); the logits are the
    model's own; the state dict's keys and values are unchanged."""
    _, expected, got, calls, n_blocks = _logits_with_and_without(name, monkeypatch)
    assert len(calls) == n_blocks > 0
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_an_mlp_whose_weights_moved_apart_runs_eagerly(monkeypatch):
    """gate and up no longer one block (a weight re-assigned): the family's own combine, not a
    kernel reading rows that are not up's; the same logits."""
    _, expected, got, calls, _ = _logits_with_and_without("tiny_deepseek", monkeypatch, unseat=True)
    assert calls == []
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_the_layers_residual_and_the_shared_experts_in_the_kernel_leave_the_logits_unchanged(monkeypatch):
    """The decode step's layer (base/runtime/regional.py) hands the block its residual stream: the
    routed kernel adds it, the shared kernel adds the routed output; the logits as the model's own."""
    import base.hf.experts_impl as impl
    from tests.helpers import base_step_on_the_kernels, layers_as_halves

    model, moe, ids_BS, step = base_step_on_the_kernels("tiny_deepseek")
    routed, shared = [], []
    kernel = impl.fused_experts
    monkeypatch.setattr(impl, "fused_experts",
                        lambda *a, **kw: routed.append(kw.get("residual_TH") is not None) or kernel(*a, **kw))
    monkeypatch.setattr(shared_mod, "fused_experts", lambda *a, **kw: shared.append(1) or kernel(*a, **kw))
    try:
        with torch.no_grad(), moe.bound(step):
            expected = model(ids_BS).logits
            routed.clear(), shared.clear()
            with layers_as_halves(model):
                got = model(ids_BS).logits
    finally:
        moe.remove()
    n = model.config.num_hidden_layers
    assert routed == [True] * n and len(shared) == n
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("T", [1, 16, 64])
def test_gpu_deepseek_v2_lite_shared_experts_in_bf16(T):
    """DeepSeek-V2-Lite's shared MLP (H 2048, I_s 2 x 1408) as two chunks, with the tuned launches of
    the routed shape, against the float64 MLP."""
    H, I, C = 2048, 1408, 2
    I_s = C * I
    g = torch.Generator(device="cuda").manual_seed(T)
    gate_up = (torch.randn(2 * I_s, H, generator=g, device="cuda") / H**0.5).bfloat16()
    down_HI = (torch.randn(H, I_s, generator=g, device="cuda") / I_s**0.5).bfloat16()
    x_TH = torch.randn(T, H, generator=g, device="cuda").bfloat16()
    residual_TH = torch.randn(T, H, generator=g, device="cuda").bfloat16()
    idx_TC, ones_TC, keep_C = constant_routing(C, torch.device("cuda"), torch.bfloat16)
    out = fused_experts(x_TH, gate_up.as_strided((C, I, H), (I * H, H, 1)), down_HI.as_strided((C, H, I), (I, I_s, 1)),
                        idx_TC[:T], ones_TC[:T], keep_M=keep_C, residual_TH=residual_TH, up_offset=I_s)
    ref = mlp_reference(x_TH, gate_up[:I_s], gate_up[I_s:], down_HI, torch.ones(T, device="cuda"), residual_TH)
    assert ((out.double() - ref).norm() / ref.norm()).item() <= 1e-2


@pytest.mark.slow
def test_the_profile_counts_the_shared_kernel_as_shared_experts():
    """base/runtime/profile.py's ranges: the owned block's shared call is `shared experts`, not the
    routed experts' class or `other` (on a CPU, operators' host time)."""
    from base.runtime.profile import profile_steps

    cfg = ModelConfig(**yaml.safe_load((ROOT / "conf/model/tiny_deepseek.yaml").read_text()))
    model = load_model(cfg, ROOT, seed=0, experts_impl="base_triton")
    moe = install_budget(model, cfg.family, None, BudgetOptions(budget=None))
    ids_BS = torch.randint(3, 250, (2, 3), generator=torch.Generator().manual_seed(1))
    try:
        with torch.no_grad():
            split = profile_steps(model, lambda: model(ids_BS), 1)
    finally:
        moe.remove()
    assert split["shared experts"][1] > 0 and split["expert FFN"][1] > 0


@pytest.mark.slow
def test_the_shared_benchmarks_three_forms_compute_the_same():
    """tools/bench_shared.py times the eager MLP + add against the kernel's two paths: on the CPU
    (fp32, interpreter) the three give the same output, so the benchmark compares like with like."""
    from tools.bench_shared import FORMS, form_call

    T, H, I, C = 3, 32, 16, 2
    g = torch.Generator().manual_seed(5)
    gate_up, down = torch.randn(2 * I * C, H, generator=g) / H**0.5, torch.randn(H, I * C, generator=g) / (I * C)**0.5
    x_TH, y_TH = torch.randn(T, H, generator=g), torch.randn(T, H, generator=g)
    routing = constant_routing(C, torch.device("cpu"), torch.float32)
    outs = [form_call(f, x_TH, y_TH, gate_up, down, I, C, routing)() for f in FORMS]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=1e-5, atol=1e-5)
