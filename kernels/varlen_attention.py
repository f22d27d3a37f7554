"""Attention of a packed token stream over a static KV cache: each token attends its own cache row,
causally (slots up to its own), grouped query heads.

    out_THE = varlen_attention(q_THD, k_BKLD, v_BKLE, row_T, last_T, scaling, window=0, sinks_H=None)

Why: continuous batching packs the prompts of an admission round (and, in a mixed step, one token
of every decoding row) into one stream of T tokens without padding between them. Token t belongs
to cache row row_T[t] and sits at slot last_T[t] of that row, whose earlier slots hold its own
request's earlier tokens (written by this forward or by an earlier chunk). Attending over the row
up to last_T[t] is therefore varlen causal attention: every request sees only its own tokens.
The forward has already written the stream's keys and values into the cache, so the kernel reads
everything from the cache. A token with last_T = -1 (stream padding) attends to nothing and
gets zeros.

    _varlen_attention  grid (cdiv(T, M), K): program (b, k) takes M consecutive tokens of the
                       stream and KV head k; its tile has M x G rows (token, query head of the
                       group), about 128. The block's tokens fall into runs of one row each (a
                       prompt chunk is one run; the decode tokens of a mixed step one run apiece):
                       for each run the program reads that row's keys once, from the run's first
                       slot (its window) to its last, in N-slot blocks with an online softmax,
                       masking every tile row outside the run and every slot past its own token.
                       Attention sinks (GPT-OSS) join the denominator at the end.

Masking: slots in (last_T[t] - window, last_T[t]] (window 0: all from slot 0). No validity mask:
a packed row is filled from slot 0 without holes (no left padding).

Shapes: T tokens, Hq query heads, K KV heads, G = Hq / K, B cache rows, L cache slots, D key size,
E value size (D != E allowed). Any float dtype; scores and softmax in float32.
Graph safety: no host sync; shapes fixed for given (T, Hq, K, L, D, E); row_T and last_T are read on
the device. Reference: `varlen_attention_reference` (float32, blocks of tokens gathered with their
rows), tested against a per-token loop and the kernel (tests/test_varlen_attention.py; interpreter
on the CPU, compiled on the GPU).
Tuning: BLOCK_N = 64 slots; M = 16 tokens for G <= 8 (128 rows for Qwen3-30B-A3B's G = 8), 8 warps
for 128-row tiles. Not tuned on a GPU yet. A run's tokens share the keys they read; the causal
mask wastes about half of a long run's score tile, as in any tiled causal attention.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels._triton import dual_jit, next_pow2

BLOCK_N = 64


@dual_jit
def _varlen_attention(
    # Pointers
    q_ptr, k_ptr, v_ptr, row_ptr, last_ptr, sinks_ptr, out_ptr,
    # Dimensions
    scaling, T, K, G, D, E, window,
    sq_t, sq_h, sk_b, sk_k, sk_l, sv_b, sv_k, sv_l, so_t, so_h,
    # Meta-parameters
    HAS_SINKS: tl.constexpr, BLOCK_M: tl.constexpr, G_BLOCK: tl.constexpr, D_BLOCK: tl.constexpr,
    E_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
):
    mb = tl.program_id(0)
    kh = tl.program_id(1)
    R: tl.constexpr = BLOCK_M * G_BLOCK
    r = tl.arange(0, R)  # tile row: (token m of the block, query head g of the group)
    m = mb * BLOCK_M + r // G_BLOCK
    g = r % G_BLOCK
    in_T = m < T
    ok_r = in_T & (g < G)
    row_r = tl.load(row_ptr + m, mask=in_T, other=-1)
    last_r = tl.load(last_ptr + m, mask=in_T, other=-1)  # -1: padding, attends to nothing
    lo_r = tl.where(window > 0, tl.maximum(last_r - window + 1, 0), 0)  # a sliding window's first slot
    d = tl.arange(0, D_BLOCK)
    e = tl.arange(0, E_BLOCK)
    q_RD = tl.load(q_ptr + m[:, None] * sq_t + (kh * G + g)[:, None] * sq_h + d[None, :],
                   mask=ok_r[:, None] & (d[None, :] < D), other=0.0)
    m_R = tl.full((R,), float("-inf"), tl.float32)
    l_R = tl.zeros((R,), tl.float32)
    acc_RE = tl.zeros((R, E_BLOCK), tl.float32)
    # runs of consecutive tokens of one row, in order: each run reads its row's keys once
    t = mb * BLOCK_M
    end = tl.minimum(t + BLOCK_M, T)
    while t < end:
        row = tl.load(row_ptr + t)
        stop = tl.min(tl.where((m > t) & in_T & (row_r != row), m, end))  # the next other row's token
        run_r = (m >= t) & (m < stop)
        lo = tl.min(tl.where(run_r, lo_r, 1 << 30))
        hi = tl.max(tl.where(run_r, last_r, -1))
        for blk in range(lo // BLOCK_N, (hi + BLOCK_N) // BLOCK_N):
            slot = blk * BLOCK_N + tl.arange(0, BLOCK_N)
            in_n = (slot >= lo) & (slot <= hi)
            k_ND = tl.load(k_ptr + row * sk_b + kh * sk_k + slot[:, None] * sk_l + d[None, :],
                           mask=in_n[:, None] & (d[None, :] < D), other=0.0)
            s_RN = tl.dot(q_RD, tl.trans(k_ND), input_precision="ieee").to(tl.float32) * scaling
            ok_RN = run_r[:, None] & (slot[None, :] >= lo_r[:, None]) & (slot[None, :] <= last_r[:, None])
            s_RN = tl.where(ok_RN, s_RN, float("-inf"))
            m_new = tl.maximum(m_R, tl.max(s_RN, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing allowed yet: no rescale
            p_RN = tl.exp(s_RN - m_safe[:, None])
            alpha = tl.exp(m_R - m_safe)
            v_NE = tl.load(v_ptr + row * sv_b + kh * sv_k + slot[:, None] * sv_l + e[None, :],
                           mask=in_n[:, None] & (e[None, :] < E), other=0.0)
            acc_RE = acc_RE * alpha[:, None] + tl.dot(p_RN.to(v_NE.dtype), v_NE, input_precision="ieee").to(tl.float32)
            l_R = l_R * alpha + tl.sum(p_RN, axis=1)
            m_R = m_new
        t = stop
    if HAS_SINKS:  # a per-head logit that takes probability mass and contributes no value
        sink_R = tl.load(sinks_ptr + kh * G + g, mask=g < G, other=0.0).to(tl.float32)
        m_fin = tl.maximum(m_R, sink_R)
        alpha = tl.exp(m_R - m_fin)
        l_R = l_R * alpha + tl.exp(sink_R - m_fin)
        acc_RE = acc_RE * alpha[:, None]
    out_RE = acc_RE / tl.where(l_R > 0, l_R, 1.0)[:, None]
    tl.store(out_ptr + m[:, None] * so_t + (kh * G + g)[:, None] * so_h + e[None, :],
             out_RE.to(out_ptr.dtype.element_ty), mask=ok_r[:, None] & (e[None, :] < E))


def tile_tokens(G: int) -> int:
    """Tokens per program: a tile of about 128 (token, query head) rows, at least 16 for tl.dot."""
    return max(16 // next_pow2(G), min(16, max(1, 128 // next_pow2(G))))


def varlen_attention(q_THD: Tensor, k_BKLD: Tensor, v_BKLE: Tensor, row_T: Tensor, last_T: Tensor, scaling: float,
                     window: int = 0, sinks_H: Tensor | None = None) -> Tensor:
    """Token t's query heads over cache row row_T[t], slots (last_T[t] - window, last_T[t]] (window
    0: from slot 0); returns (T, Hq, E) in q's dtype; last_T[t] = -1: zeros. row_T, last_T: integer
    tensors on q's device."""
    T, Hq, D = q_THD.shape
    K, E = k_BKLD.shape[1], v_BKLE.shape[-1]
    if Hq % K or k_BKLD.stride(-1) != 1 or v_BKLE.stride(-1) != 1 or q_THD.stride(-1) != 1:
        raise ValueError("varlen_attention needs Hq divisible by K and unit-stride head dimensions")
    G = Hq // K
    out = torch.empty(T, Hq, E, dtype=q_THD.dtype, device=q_THD.device)
    if T == 0:
        return out
    sinks = sinks_H if sinks_H is not None else out  # a dummy pointer when there are none
    BLOCK_M = tile_tokens(G)
    rows = BLOCK_M * next_pow2(G)
    _varlen_attention.on(q_THD.device)[(triton.cdiv(T, BLOCK_M), K)](
        q_THD, k_BKLD, v_BKLE, row_T, last_T, sinks, out,
        float(scaling), T, K, G, D, E, int(window or 0),
        q_THD.stride(0), q_THD.stride(1), k_BKLD.stride(0), k_BKLD.stride(1), k_BKLD.stride(2),
        v_BKLE.stride(0), v_BKLE.stride(1), v_BKLE.stride(2), out.stride(0), out.stride(1),
        HAS_SINKS=sinks_H is not None, BLOCK_M=BLOCK_M, G_BLOCK=next_pow2(G), D_BLOCK=next_pow2(D, 16),
        E_BLOCK=next_pow2(E, 16), BLOCK_N=BLOCK_N, num_warps=8 if rows >= 128 else 4,
    )  # fmt: skip
    return out


def varlen_attention_reference(q_THD: Tensor, k_BKLD: Tensor, v_BKLE: Tensor, row_T: Tensor, last_T: Tensor,
                               scaling: float, window: int = 0, sinks_H: Tensor | None = None) -> Tensor:
    """The same in PyTorch, float32, one row at a time: the tokens of a row against its cache, read
    once per row rather than gathered once per token (a CPU evaluation's packed prefills spent most
    of their time in that gather). Its host loop over rows syncs, so it is not graph-safe: used
    where the kernel is not (CPU) and as the tests' reference."""
    T, Hq, D = q_THD.shape
    K, L, E = k_BKLD.shape[1], k_BKLD.shape[2], v_BKLE.shape[-1]
    G = Hq // K
    slot_L = torch.arange(L, device=q_THD.device)
    out_THE = torch.zeros(T, Hq, E, device=q_THD.device, dtype=torch.float32)
    for row in row_T.unique().tolist():
        t_n = (row_T == row).nonzero().squeeze(1)
        q_nKGD, last_n = q_THD[t_n].float().view(-1, K, G, D), last_T[t_n]
        s_nKGL = torch.einsum("nkgd,kld->nkgl", q_nKGD, k_BKLD[row].float()) * scaling
        ok_nL = slot_L[None, :] <= last_n[:, None]
        if window:
            ok_nL &= slot_L[None, :] > last_n[:, None] - window
        s_nKGL = s_nKGL.masked_fill(~ok_nL[:, None, None, :], float("-inf"))
        if sinks_H is not None:
            sink_nKG1 = sinks_H.float().view(1, K, G, 1).expand(s_nKGL.shape[0], K, G, 1)
            p_nKGL = torch.cat([s_nKGL, sink_nKG1], -1).softmax(-1)[..., :L]
        else:
            p_nKGL = torch.nan_to_num(s_nKGL.softmax(-1), nan=0.0)  # padding: no slot
        v_KLE = v_BKLE[row].float()
        out_THE[t_n] = torch.einsum("nkgl,kle->nkge", p_nKGL, torch.nan_to_num(v_KLE)).reshape(-1, Hq, E)
    return out_THE.to(q_THD.dtype)
