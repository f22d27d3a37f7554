"""kernels/skinny.py against F.linear: CPU through the interpreter (fp32), GPU in bf16 and replayed."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernels._triton as kt
from base.runtime.graphs import capture_outputs
from kernels.skinny import SkinnyLaunch, skinny_linear

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    monkeypatch.setattr(kt, "POISON", True)  # an unwritten output element shows as NaN


@pytest.mark.parametrize(("T", "N", "K", "bn", "bk", "split"), [
    (1, 48, 64, 16, 32, 1), (5, 40, 72, 16, 32, 1), (16, 32, 64, 32, 16, 1), (37, 64, 96, 16, 64, 1),
    # K in shares, the last share of each column block summing them: shares of unequal length, one
    # share empty (K = 72 in steps of 16 over 8 shares), ragged N
    (5, 40, 72, 16, 16, 2), (16, 48, 72, 32, 16, 8), (64, 32, 128, 16, 32, 4)])
def test_skinny_linear_equals_f_linear(T, N, K, bn, bk, split):
    # ragged T, N and K (masks), one and several token tiles, more than one reduction step
    g = torch.Generator().manual_seed(T * 1000 + N + split)
    x = torch.randn(T, K, generator=g)
    w = torch.randn(N, K, generator=g)
    y = skinny_linear(x, w, SkinnyLaunch(block_n=bn, block_k=bk, num_stages=2, split=split))
    torch.testing.assert_close(y, F.linear(x, w), rtol=1e-5, atol=1e-4)


def test_a_split_launch_leaves_its_counters_at_zero_and_repeats_bit_for_bit():
    from kernels._triton import arrival_counters

    g = torch.Generator().manual_seed(9)
    x, w = torch.randn(8, 64, generator=g), torch.randn(48, 64, generator=g)
    la = SkinnyLaunch(block_n=16, block_k=16, num_stages=1, split=4)
    first = skinny_linear(x, w, la)
    assert (arrival_counters(3, x.device, "skinny")[:3] == 0).all()  # reset by each block's last share
    assert torch.equal(skinny_linear(x, w, la), first)  # the shares summed in a fixed order


def test_skinny_linear_reads_strided_inputs():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 80, generator=g)[:, :64]  # row stride 80
    w = torch.randn(32, 64, generator=g).t().contiguous().t()  # a transposed view: made contiguous
    torch.testing.assert_close(skinny_linear(x, w, SkinnyLaunch(block_k=32)), F.linear(x, w), rtol=1e-5, atol=1e-4)


def test_bad_shapes_and_launches_are_refused():
    with pytest.raises(ValueError, match="do not multiply"):
        skinny_linear(torch.zeros(2, 8), torch.zeros(4, 9))
    with pytest.raises(ValueError, match="dtypes differ"):
        skinny_linear(torch.zeros(2, 8), torch.zeros(4, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="block_n must be a power of two >= 16"):
        SkinnyLaunch(block_n=24)
    with pytest.raises(ValueError, match="num_stages must be in"):
        SkinnyLaunch(num_stages=0)
    with pytest.raises(ValueError, match="split must be one of 1, 2, 4, 8"):
        SkinnyLaunch(split=3)
    with pytest.raises(ValueError, match="a split launch takes one token tile: at most 64 tokens"):
        skinny_linear(torch.zeros(65, 16), torch.zeros(16, 16), SkinnyLaunch(split=2))


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize(("T", "split"), [(1, 1), (16, 1), (64, 1), (16, 4)])
def test_gpu_skinny_linear_in_bf16_eagerly_and_replayed(T, split):
    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(T, 4096, device="cuda", generator=g).bfloat16()
    w = (torch.randn(2048, 4096, device="cuda", generator=g) / 64).bfloat16()
    ref = F.linear(x.float(), w.float())
    la = SkinnyLaunch(block_n=64 if split > 1 else 16, split=split)
    y = skinny_linear(x, w, la)
    torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2)
    replay, out = capture_outputs(lambda: skinny_linear(x, w, la))
    x.copy_(torch.randn(T, 4096, device="cuda", generator=g).bfloat16())  # the replay reads the new input
    replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, skinny_linear(x, w, la), rtol=0, atol=0)


@cuda
@pytest.mark.gpu
def test_gpu_every_tuned_skinny_launch_of_this_gpu_matches_fp32_eagerly_and_replayed():
    """Each `skinny:` entry of this GPU's committed table that the engine would use (`use`: it beat
    cuBLAS), at its own N, K and T in bf16: the launch `skinny_launch` reads matches F.linear in
    fp32 and a CUDA-graph replay gives the eager result bit for bit; in float32 the same entry runs
    (shrunk to what the device holds) and matches F.linear. So a tuned entry gets a GPU run of its
    own before it reaches the default path."""
    from kernels.skinny import skinny_launch
    from kernels.tuned import device_name, load_configs

    dev = torch.device("cuda")
    table = load_configs(device_name(dev))
    keys = sorted(k for k in table if k.startswith("skinny:") and table[k].get("use", False))
    if not keys:
        pytest.skip(f"{device_name(dev)}'s table uses no skinny launch")
    for key in keys:
        N, K, T = (int(part.split("=")[1]) for part in key.split(":")[1].split(","))
        la = skinny_launch(N, K, T, dev)
        assert la is not None, key
        g = torch.Generator(device="cuda").manual_seed(N + T)
        x = torch.randn(T, K, device="cuda", generator=g).bfloat16()
        w = (torch.randn(N, K, device="cuda", generator=g) / K**0.5).bfloat16()
        y = skinny_linear(x, w, la)
        torch.testing.assert_close(y.float(), F.linear(x.float(), w.float()), rtol=2e-2, atol=2e-2, msg=key)
        replay, out = capture_outputs(lambda x=x, w=w, la=la: skinny_linear(x, w, la))
        replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, y, rtol=0, atol=0, msg=key)
        # the same entry run in float32 (twice bf16's shared memory a tile): fitted to the device, F.linear's product
        y32 = skinny_linear(x.float(), w.float(), la)
        torch.testing.assert_close(y32, F.linear(x.float(), w.float()), rtol=1e-4, atol=1e-4, msg=f"{key} float32")


def _table(monkeypatch, entries: dict) -> None:
    import kernels.skinny as ks

    monkeypatch.setattr(ks, "tuned_entry", lambda prefix, device, T: entries.get((prefix, T), {}))


def test_the_launch_is_the_tuned_winner_and_cublas_elsewhere(monkeypatch):
    """The one question of the router's GEMM and the attention's projections: a won entry -> its
    launch; a lost entry, nothing tuned (a GPU without entries runs as before), prefill or the CPU
    -> cuBLAS / F.linear (None)."""
    from kernels.skinny import skinny_launch

    gpu = torch.device("cuda", 0)
    won = {"block_n": 32, "block_k": 128, "num_stages": 3, "num_warps": 4, "use": True}
    _table(monkeypatch, {("skinny:N=2048,K=4096", 16): won, ("skinny:N=2048,K=4096", 1): {**won, "use": False}})
    assert skinny_launch(2048, 4096, 16, gpu) == SkinnyLaunch(block_n=32, block_k=128, num_stages=3, num_warps=4)
    assert skinny_launch(2048, 4096, 1, gpu) is None  # lost to cuBLAS there
    assert skinny_launch(2048, 4096, 65, gpu) is None  # prefill-sized: cuBLAS
    assert skinny_launch(2048, 4096, 16, torch.device("cpu")) is None  # the CPU keeps F.linear
    assert skinny_launch(64, 64, 16, gpu) is None  # nothing tuned: cuBLAS


def test_skinny_projections_swap_o_proj_and_the_fused_qkv_and_restore_them():
    from base.hf.fused_qkv import _QKV, FusedQKV
    from base.hf.skinny_proj import SkinnyLinear, SkinnyProjections

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(16, n, bias=False) for n in (32, 8, 8))
            self.o_proj = torch.nn.Linear(32, 16, bias=False)

    model = torch.nn.Sequential(Attn(), Attn())
    x = torch.randn(3, 16)
    before = [(m.q_proj(x), m.o_proj(torch.randn(3, 32, generator=torch.Generator().manual_seed(1)))) for m in model]
    fused = FusedQKV(model)
    skinny = SkinnyProjections(model)
    assert skinny.layers == 2
    for m, (q, o) in zip(model, before, strict=True):
        assert isinstance(m.o_proj, SkinnyLinear) and isinstance(m.q_proj, _QKV)
        # on the CPU the projections keep F.linear (skinny_launch: None): the same numbers
        torch.testing.assert_close(m.q_proj(x), q)
        torch.testing.assert_close(m.o_proj(torch.randn(3, 32, generator=torch.Generator().manual_seed(1))), o)
    skinny.remove()
    fused.remove()
    assert all(type(m.o_proj) is torch.nn.Linear and type(m.q_proj) is torch.nn.Linear for m in model)


def test_the_custom_op_computes_the_kernels_product():
    from base.hf.skinny_proj import _skinny_linear_op

    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(4, 64, generator=g), torch.randn(32, 64, generator=g)
    torch.testing.assert_close(_skinny_linear_op(x, w, 16, 32, 2, 4, 1), F.linear(x, w), rtol=1e-5, atol=1e-4)


def _launches_seen(monkeypatch, launch: SkinnyLaunch) -> list:
    """skinny_launch answers `launch` for any shape (CPU tensors too); the launches the kernel then
    gets are recorded."""
    import kernels.skinny as ks

    seen = []
    kernel = ks.skinny_linear
    monkeypatch.setattr(ks, "skinny_launch", lambda N, K, T, device: launch)
    monkeypatch.setattr(ks, "skinny_linear", lambda x, w, la: seen.append(la) or kernel(x, w, la))
    return seen


def test_the_projection_runs_the_tuned_launch_as_tuned_split_included(monkeypatch):
    """base/hf/skinny_proj.py's `linear` hands the kernel the whole tuned launch (a split launch
    reached the kernel as split 1 before)."""
    from base.hf.skinny_proj import linear

    launch = SkinnyLaunch(block_n=16, block_k=16, num_stages=1, split=4)
    seen = _launches_seen(monkeypatch, launch)
    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(2, 3, 64, generator=g), torch.randn(48, 64, generator=g)
    torch.testing.assert_close(linear(x, w, None), F.linear(x, w), rtol=1e-5, atol=1e-4)
    assert seen == [launch]


def test_the_fused_selection_runs_its_router_gemm_on_the_kernel_when_told(monkeypatch):
    """base/method/backends.py's `_fused_call`: with a launch from skinny_launch the router's GEMM
    ([router; predictor] rows) goes through the kernel, and the routing and selection are those of
    the F.linear path (same logits up to float rounding: the same routing here)."""
    from base.method.backends import SoftmaxTopK, _fused_call

    g = torch.Generator().manual_seed(8)
    T, H, E, K = 6, 64, 16, 4
    z, w_EH, pred_HE = torch.randn(T, H, generator=g), torch.randn(E, H, generator=g), torch.randn(H, E, generator=g)
    from kernels.score import fuse_router_predictor

    wcat = fuse_router_predictor(w_EH, 0.1 * pred_HE)
    router = SoftmaxTopK(w_EH, K, norm_topk=True)
    active = torch.ones(T, dtype=torch.bool)
    kw = dict(kind="base", pred_b_E=torch.zeros(E))  # noqa: C408
    batch_ref, dec_ref = _fused_call(router, wcat, None, z, active, 5, 0, **kw)  # CPU: skinny_launch None, F.linear
    seen = _launches_seen(monkeypatch, SkinnyLaunch(block_n=16, block_k=32, num_stages=1))
    batch, dec = _fused_call(router, wcat, None, z, active, 5, 0, **kw)
    assert len(seen) == 1
    torch.testing.assert_close(batch.probs_TE, batch_ref.probs_TE, rtol=1e-5, atol=1e-6)
    assert torch.equal(batch.topk_idx_TK, batch_ref.topk_idx_TK) and torch.equal(dec.keep_E, dec_ref.keep_E)
    assert torch.equal(dec.topk_idx_TK, dec_ref.topk_idx_TK)


@pytest.mark.slow
def test_the_benchmark_leaves_out_a_launch_whose_product_differs(monkeypatch, capsys):
    """tools/bench_skinny checks each launch's product against F.linear on the device it times (so
    `--install` never writes an unchecked launch): a launch that computes something else is left
    out with the reason, and the others still run."""
    import sys

    import tools.bench_skinny as bs

    real = bs.skinny_linear

    fits = []

    def wrong_when_split(x, w, launch, fit=True):
        fits.append(fit)
        y = real(x, w, launch, fit=fit)
        return y * 1.5 if launch.split > 1 else y

    monkeypatch.setattr(bs, "skinny_linear", wrong_when_split)
    monkeypatch.setattr(sys, "argv", ["bench_skinny", "--smoke", "--rounds", "1", "--reps", "1", "--sets", "1",
                                      "--ts", "16"])
    bs.main()
    out = capsys.readouterr().out
    assert "left out: smoke T=16" in out and "split=2" in out.split("left out:")[1].splitlines()[0]
    assert "its product differs from F.linear's" in out
    assert "skinny BN=16 BK=32 st=2 split=1" in out and "skinny BN=16 BK=16 st=1 split=2" not in out
    assert fits and not any(fits)  # each launch timed as named: one over the shared memory fails, never shrunk


def test_a_launch_the_device_cannot_hold_sheds_stages_then_halves_bk_until_it_fits(monkeypatch):
    """A tuned entry whose pipelined tiles need more shared memory than the device has (Triton's
    OutOfResources, raised before anything is enqueued; a bf16 entry run in float32): one stage
    fewer at a time, then half the reduction step, until it fits; the product is F.linear's, the
    fitted launch is remembered per shape and dtype, and fit=False runs the launch as named (that
    another error is not swallowed is fit_shared_memory's, tested with decode attention)."""
    from triton.runtime.errors import OutOfResources

    import kernels.skinny as ks

    launcher = ks._skinny_kernel.on(torch.device("cpu"))
    seen = []

    class Limited:  # a device that holds num_stages x BK <= 64 of these tiles
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append((kwargs["num_stages"], kwargs["BK"]))
                if kwargs["num_stages"] * kwargs["BK"] > 64:
                    raise OutOfResources(kwargs["num_stages"] * kwargs["BK"] * 1024, 65536, "shared memory")
                return launcher[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(ks._skinny_kernel, "on", lambda dev: Limited())
    monkeypatch.setattr(ks, "_FITTED", {})
    x, w = torch.randn(5, 96), torch.randn(40, 96)
    tuned = SkinnyLaunch(block_n=16, block_k=64, num_stages=3, split=2)
    torch.testing.assert_close(skinny_linear(x, w, tuned), F.linear(x, w), rtol=1e-5, atol=1e-5)
    assert seen == [(3, 64), (2, 64), (1, 64)]
    assert list(ks._FITTED.values()) == [SkinnyLaunch(block_n=16, block_k=64, num_stages=1, split=2)]
    seen.clear()
    skinny_linear(x, w, SkinnyLaunch(block_n=16, block_k=128, num_stages=1))  # one stage: BK halves
    assert seen == [(1, 128), (1, 64)]
    seen.clear()
    skinny_linear(x, w, tuned)
    assert seen == [(1, 64)]  # straight to the launch that fitted
    seen.clear()
    skinny_linear(x.double(), w.double(), tuned)
    assert seen == [(3, 64), (2, 64), (1, 64)]  # another dtype is fitted on its own
    seen.clear()
    with pytest.raises(OutOfResources, match="shared memory"):  # a benchmark's launch: as named or not at all
        skinny_linear(x, w, tuned, fit=False)
    assert seen == [(3, 64)]


@pytest.mark.parametrize("argv,cuda", [(["--install"], False), (["--install", "--smoke"], True)])
def test_the_benchmark_installs_only_a_gpus_real_shapes(monkeypatch, tmp_path, argv, cuda):
    """`--install` writes the GPU's `skinny:` entries: from the smoke shapes, or from a CPU's
    (interpreter's) timings into kernels/configs/cpu.json, it would write launches no GPU timed.
    Refused before anything is timed or written."""
    import sys

    import tools.bench_skinny as bs
    import tools.tune_kernels as tk

    monkeypatch.setattr(tk, "CONFIG_DIR", tmp_path)
    monkeypatch.setattr(bs.torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(bs, "skinny_linear", lambda *a, **kw: pytest.fail("a launch ran"))
    monkeypatch.setattr(sys, "argv", ["bench_skinny", *argv])
    with pytest.raises(SystemExit) as e:
        bs.main()
    assert e.value.code == 2 and list(tmp_path.iterdir()) == []
