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


@pytest.mark.parametrize(("T", "N", "K", "bn", "bk"), [(1, 48, 64, 16, 32), (5, 40, 72, 16, 32), (16, 32, 64, 32, 16),
                                                       (37, 64, 96, 16, 64)])
def test_skinny_linear_equals_f_linear(T, N, K, bn, bk):
    # ragged T, N and K (masks), one and several token tiles, more than one reduction step
    g = torch.Generator().manual_seed(T * 1000 + N)
    x = torch.randn(T, K, generator=g)
    w = torch.randn(N, K, generator=g)
    y = skinny_linear(x, w, SkinnyLaunch(block_n=bn, block_k=bk, num_stages=2))
    torch.testing.assert_close(y, F.linear(x, w), rtol=1e-5, atol=1e-4)


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


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 16, 64])
def test_gpu_skinny_linear_in_bf16_eagerly_and_replayed(T):
    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(T, 4096, device="cuda", generator=g).bfloat16()
    w = (torch.randn(2048, 4096, device="cuda", generator=g) / 64).bfloat16()
    ref = F.linear(x.float(), w.float())
    y = skinny_linear(x, w)
    torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2)
    replay, out = capture_outputs(lambda: skinny_linear(x, w))
    x.copy_(torch.randn(T, 4096, device="cuda", generator=g).bfloat16())  # the replay reads the new input
    replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, skinny_linear(x, w), rtol=0, atol=0)
