"""Varlen attention of a packed token stream over the static cache (kernels/varlen_attention.py):
the Triton kernel (interpreted on the CPU) and the PyTorch path against a per-token loop written
here independently: each token attends its own row, slots up to its own (inside a sliding window),
sinks take their share of the mass, padding tokens (last = -1) get zeros and slots past a token's
own are never read (they hold NaN)."""
from __future__ import annotations

import pytest
import torch

from kernels.varlen_attention import varlen_attention, varlen_attention_reference

# (rows B, query heads, KV heads, slots L, key size D, value size E, window)
SHAPES = [(3, 4, 2, 40, 16, 16, 0), pytest.param(2, 6, 2, 130, 8, 12, 0, marks=pytest.mark.slow),
          pytest.param(3, 4, 4, 70, 16, 16, 9, marks=pytest.mark.slow)]


def by_hand(q_THD, k_BKLD, v_BKLE, row_T, last_T, scaling, window=0, sinks_H=None):
    T, Hq, _ = q_THD.shape
    K = k_BKLD.shape[1]
    out = torch.zeros(T, Hq, v_BKLE.shape[-1])
    for t in range(T):
        last = int(last_T[t])
        if last < 0:
            continue
        first = max(0, last - window + 1) if window else 0
        for h in range(Hq):
            kh = h // (Hq // K)
            keys = k_BKLD[row_T[t], kh, first:last + 1].double()
            s = keys @ q_THD[t, h].double() * scaling
            if sinks_H is not None:
                s = torch.cat([s, sinks_H[h:h + 1].double()])
            p = s.softmax(0)[:last + 1 - first]
            out[t, h] = (p[:, None] * v_BKLE[row_T[t], kh, first:last + 1].double()).sum(0).float()
    return out


def inputs(B, Hq, K, L, D, E, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, K, L, D, generator=g)
    v = torch.randn(B, K, L, E, generator=g)
    # a stream: row 1 from slot 0 (a new prompt), row 0 from slot 5 (a later chunk), one decode
    # token of row 2, and two padding tokens
    row = [1] * 7 + [0] * 4 + [B - 1] + [0, 0]
    last = list(range(7)) + list(range(5, 9)) + [L - 3] + [-1, -1]
    q = torch.randn(len(row), Hq, D, generator=g)
    row_T, last_T = torch.tensor(row), torch.tensor(last)
    for r in range(B):  # slots after every token of a row are never read
        top = int(last_T[row_T == r].max()) if (row_T == r).any() else -1
        k[r, :, top + 1:], v[r, :, top + 1:] = float("nan"), float("nan")
    return q, k, v, row_T, last_T


@pytest.mark.parametrize("B,Hq,K,L,D,E,window", SHAPES)
@pytest.mark.parametrize("impl", [varlen_attention, varlen_attention_reference])
def test_varlen_attention_attends_each_token_to_its_own_row_causally(impl, B, Hq, K, L, D, E, window):
    q, k, v, row_T, last_T = inputs(B, Hq, K, L, D, E)
    out = impl(q, k, v, row_T, last_T, 0.3, window)
    torch.testing.assert_close(out, by_hand(q, k, v, row_T, last_T, 0.3, window), rtol=1e-5, atol=1e-5)
    assert out[-2:].abs().max() == 0  # padding tokens


@pytest.mark.parametrize("impl", [varlen_attention, varlen_attention_reference])
def test_varlen_attention_with_sinks(impl):
    q, k, v, row_T, last_T = inputs(2, 4, 2, 20, 8, 8, seed=1)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(2))
    out = impl(q, k, v, row_T, last_T, 0.3, 0, sinks)
    torch.testing.assert_close(out, by_hand(q, k, v, row_T, last_T, 0.3, 0, sinks), rtol=1e-5, atol=1e-5)


def mixed_stream(B: int, L: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(row_T, last_T) laid out as a mixed step: one decode token per row (some inactive: -1), then
    prompt chunks of random lengths (a row's chunk continuing at a random slot), then padding."""
    g = torch.Generator().manual_seed(seed)
    rows = list(range(B))
    lasts = [int(torch.randint(-1, L // 2, (1,), generator=g)) for _ in range(B)]
    for r in torch.randperm(B, generator=g)[: B // 2].tolist():
        n, start = int(torch.randint(1, 23, (1,), generator=g)), int(torch.randint(0, L // 2, (1,), generator=g))
        rows += [r] * n
        lasts += list(range(start, min(start + n, L)))[:n]
        rows = rows[: len(lasts)]
    rows += [0] * 5
    lasts += [-1] * 5
    return torch.tensor(rows), torch.tensor(lasts)


@pytest.mark.parametrize("Hq,K,window,sinks", [(8, 1, 0, False), pytest.param(4, 4, 0, True, marks=pytest.mark.slow),
                                                (16, 2, 13, False)])
def test_varlen_attention_over_a_mixed_step_stream(Hq, K, window, sinks):
    """Blocks of the tile straddle runs, a row appears twice (its decode token and its chunk),
    tile sizes from 16 to 128 rows."""
    B, L, D = 5, 60, 16
    g = torch.Generator().manual_seed(Hq + K)
    row_T, last_T = mixed_stream(B, L, seed=Hq)
    k, v = torch.randn(B, K, L, D, generator=g), torch.randn(B, K, L, D, generator=g)
    q = torch.randn(len(row_T), Hq, D, generator=g)
    s = torch.randn(Hq, generator=g) if sinks else None
    out = varlen_attention(q, k, v, row_T, last_T, 0.25, window, s)
    torch.testing.assert_close(out, by_hand(q, k, v, row_T, last_T, 0.25, window, s), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_varlen_attention(dtype):
    B, Hq, K, L, D = 16, 32, 4, 641, 128
    g = torch.Generator().manual_seed(3)
    k = torch.randn(B, K, L, D, generator=g).to("cuda", dtype)
    v = torch.randn(B, K, L, D, generator=g).to("cuda", dtype)
    lengths = [300, 17, 129, 1]
    row_T = torch.cat([torch.full((n,), r) for r, n in enumerate(lengths)] + [torch.zeros(9, dtype=torch.long)])
    last_T = torch.cat([torch.arange(n) for n in lengths] + [torch.full((9,), -1)])
    q = torch.randn(len(row_T), Hq, D, generator=g).to("cuda", dtype)
    row_T, last_T = row_T.cuda(), last_T.cuda()
    out = varlen_attention(q, k, v, row_T, last_T, 0.1)
    ref = varlen_attention_reference(q, k, v, row_T, last_T, 0.1)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)
