"""Budgeted expert FFN for decoding: each routed expert's weights are streamed once per step.

out_t = sum_k w_tk * down[u] @ act(gate_up[u] @ x_t),  u = topk_idx_TK[t, k]; slots with w == 0
(reassign's empty slots, which point at a kept expert) are skipped, so after selection only the
kept experts' weights move. Reference: `experts_reference` below (and transformers' own
implementations, which tests/test_kernels.py also compares against).

Shapes: T tokens, H hidden, I expert intermediate size, E experts, K top-k, P = T*K pairs.
    x_TH          MoE-layer input
    gate_up       (E, 2I, H) [gate; up] concatenated (transformers layout), or GPT-OSS's
                  (E, H, 2I) interleaved [g0, u0, g1, ...] with bias: pass transposed/interleaved
    down          (E, H, I), or (E, I, H) when transposed
    pairs_EP      per expert, the ids p = t*K + k of its pairs with w != 0 (first cnt_E[u])
    act_PI        fused activation of each pair (dtype of x)
    y_PH          w_p * expert output of each pair (fp32), summed per token in slot order

Four launches, all with grids fixed by (T, K, E, H, I) and the GPU: route (grid E: compact
pairs per expert), gate_up (+SwiGLU) and down (+weight) (persistent: PER_SM programs per SM
walk the work items (routed expert, column block), so unrouted experts cost no program), reduce
(sum over K in slot order: deterministic, no atomics on the data). Up to ROUTE_IN_MAX pairs (16
tokens at top-8) the gate_up launch makes the route launch's lists itself, so three launches: on
an H100 the expert FFN took 0.977x its time at 16 tokens and M=16, 0.951x at 1 token, and the
step 0.988x (base M=16) and 0.997x (dense) at batch 16 (results/roofline/route_in_2026-12-07).
Up to ROUTE_IN_MAX pairs gate_up and down are one launch too (`_ffn_kernel`: down's items wait on
their expert's gate_up items, so no launch boundary between the two): on an H100 the expert FFN
took 0.960x the two launches' time at 16 tokens and M=16, the step 0.970x (base M=16) and 0.999x
(dense) at batch 16 and 0.971x dense at batch 1 (results/roofline/fused_ffn_2026-12-07). Above it,
with the route launch's lists, the one launch took 1.147x at 64 tokens, so there the two run.
With the tuned table's `reduce_in_down` the reduce is the down launch's last act for each column
block instead (an arrival counter per block, reset by its last item, which sums the block in the
same order: one launch fewer, the same sums).
Decode is memory-bound (a few tokens per expert): a work item streams a tile of one expert's
weights once and applies it to all of that expert's pairs, so each weight byte is read once per step.
With `residual_TH`, the last launch (reduce, or v3's down) also adds the decoder layer's residual
stream, rounded as the eager add (the layer's own add launch folded in: base/runtime/regional.py).
No host synchronisation (counts stay on the device and bound the device-side loops): a decode
step that calls this can be captured in a CUDA graph.
Interleaved gate_up (GPT-OSS): a gate_up item loads its gate and up rows as ONE tile of 2*BI
adjacent rows and splits gate from up after the dot. Two tiles of every other row step by 2 along
the contiguous dimension, so they load element by element: that streamed gpt-oss-20b's gate_up at
0.39 TB/s on an H100 while its down got 2.42 (results/roofline/grid_2026-12-05c). With the one
tile, gpt-oss-20b's expert FFN streams at 0.91 of copy bandwidth against 0.175-0.187 before, and its
batch-16 step takes 14.70 ms dense, 10.12 base M=16, against 61.03 and 40.30 in the same
interleaved rounds (results/roofline/grid_2026-12-05d/ab_gptoss).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cache

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.errors import OutOfResources

from kernels._triton import (
    arrival_counters,
    counter_buffers,
    dual_jit,
    empty,
    fit_shared_memory,
    next_pow2,
)
from kernels.tuned import CONFIG_DIR, device_name, nearest_key  # noqa: F401 - CONFIG_DIR: tools/tune_kernels.py
from kernels.tuned import load_configs as _load_configs

ACTS = {"silu": 0, "gptoss": 1}


@triton.jit
def _append_pairs(list_ptr, base, hit_P, offs_p):
    """Append the hit pairs (in pair order) to an expert's list at list_ptr, which holds `base`
    of them; return the new length. _route_kernel's step, and _gate_up_kernel's with ROUTE_IN."""
    tl.store(list_ptr + (base + tl.cumsum(hit_P.to(tl.int32), axis=0) - 1), offs_p, mask=hit_P)
    return base + tl.sum(hit_P.to(tl.int32), axis=0)


@dual_jit
def _route_kernel(
    # Pointers
    idx_ptr,  # (T, K) int
    w_ptr,  # (T, K)
    pairs_ptr,  # (E, P) int32 out
    cnt_ptr,  # (E,) int32 out
    # Dimensions
    P,
    # Strides
    stride_pe,
    # Meta-parameters
    PB: tl.constexpr,  # pairs per step
):
    """Grid (E,): program u lists, in pair order, the pairs routed to u with nonzero weight."""
    u = tl.program_id(0)
    base = 0
    for p0 in range(0, P, PB):
        offs_p = p0 + tl.arange(0, PB)
        p_ok = offs_p < P
        i_P = tl.load(idx_ptr + offs_p, mask=p_ok, other=-1)
        w_P = tl.load(w_ptr + offs_p, mask=p_ok, other=0.0)
        base = _append_pairs(pairs_ptr + u * stride_pe, base, (i_P == u) & (w_P != 0), offs_p)
    tl.store(cnt_ptr + u, base)


@triton.jit
def _routed_pairs(idx_ptr, w_ptr, P, E_BLOCK: tl.constexpr, PB: tl.constexpr):
    """ROUTE_IN: all P pairs in one block of PB: their positions, expert ids, which are routed
    (nonzero weight), and the routed pairs per expert (E_BLOCK,), in registers."""
    offs_p = tl.arange(0, PB)
    p_ok = offs_p < P
    i_P = tl.load(idx_ptr + offs_p, mask=p_ok, other=0).to(tl.int32)
    w_P = tl.load(w_ptr + offs_p, mask=p_ok, other=0.0)
    hit_P = p_ok & (w_P != 0)
    return offs_p, i_P, hit_P, tl.histogram(i_P, E_BLOCK, mask=hit_P)


@triton.jit
def _pair_ranks(i_P, hit_P, u):
    """ROUTE_IN: each pair's rank among expert u's routed pairs in pair order (-1: not u's)."""
    hit_u = hit_P & (i_P == u)
    return tl.where(hit_u, tl.cumsum(hit_u.to(tl.int32), axis=0) - 1, -1)


@triton.jit
def _pairs_of_rank(rank_P, offs_j, offs_p):
    """ROUTE_IN: the pair of each rank in offs_j (0 where none): a tile's pairs without a list."""
    return tl.sum(tl.where(rank_P[None, :] == offs_j[:, None], offs_p[None, :], 0), axis=1)


@triton.jit
def _gate_up_tile(
    x_ptr, rows_J, ok_J, stride_xt,  # the tile's tokens: x rows, and which of them are real
    w_base, b_base, ib,  # the expert's gate_up and bias, and the item's column block
    H, I, up_offset, alpha, limit, stride_gn, stride_gk,
    J: tl.constexpr, ROW_MUL: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
    BI: tl.constexpr, BH: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """act(gate) * up (fp32, (J, BI)) for rows [ib*BI, ib*BI + BI) of one expert and J tokens: the
    work item both gate_up kernels share (inlined into each). Interleaved (ROW_MUL=2): the item's
    rows are the 2*BI adjacent rows from 2*ib*BI, one dot over them, gate and up split after it."""
    offs_i = ib * BI + tl.arange(0, BI)
    i_ok = offs_i < I
    if ROW_MUL == 2:
        # interleaved: gate_i and up_i are rows 2i and 2i + 1. The mask is offs_n < 2I, not the
        # equal (offs_n // 2) < I, which the compiler sees constant over 2 rows only: 4-byte copies, not 16
        offs_n = ib * 2 * BI + tl.arange(0, 2 * BI)
        n_ok = offs_n < 2 * I
        acc_JN = tl.zeros((J, 2 * BI), dtype=tl.float32)
        for h0 in range(0, H, BH):
            offs_h = h0 + tl.arange(0, BH)
            h_ok = offs_h < H
            x_JH = tl.load(x_ptr + rows_J[:, None] * stride_xt + offs_h[None, :], mask=ok_J[:, None] & h_ok[None, :],
                           other=0.0)
            w_HN = tl.load(w_base + offs_n[None, :] * stride_gn + offs_h[:, None] * stride_gk,
                           mask=h_ok[:, None] & n_ok[None, :], other=0.0)
            acc_JN = tl.dot(x_JH, w_HN, acc_JN, input_precision=DOT_PRECISION)
        if HAS_BIAS:
            acc_JN += tl.load(b_base + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        acc_g, acc_u = tl.split(tl.reshape(acc_JN, (J, BI, 2)))
    else:
        g_rows = offs_i
        u_rows = offs_i + up_offset
        acc_g = tl.zeros((J, BI), dtype=tl.float32)
        acc_u = tl.zeros((J, BI), dtype=tl.float32)
        for h0 in range(0, H, BH):
            offs_h = h0 + tl.arange(0, BH)
            h_ok = offs_h < H
            x_JH = tl.load(x_ptr + rows_J[:, None] * stride_xt + offs_h[None, :], mask=ok_J[:, None] & h_ok[None, :],
                           other=0.0)
            wmask = h_ok[:, None] & i_ok[None, :]
            wg_HI = tl.load(w_base + g_rows[None, :] * stride_gn + offs_h[:, None] * stride_gk, mask=wmask, other=0.0)
            wu_HI = tl.load(w_base + u_rows[None, :] * stride_gn + offs_h[:, None] * stride_gk, mask=wmask, other=0.0)
            acc_g = tl.dot(x_JH, wg_HI, acc_g, input_precision=DOT_PRECISION)
            acc_u = tl.dot(x_JH, wu_HI, acc_u, input_precision=DOT_PRECISION)
        if HAS_BIAS:
            acc_g += tl.load(b_base + g_rows, mask=i_ok, other=0.0).to(tl.float32)[None, :]
            acc_u += tl.load(b_base + u_rows, mask=i_ok, other=0.0).to(tl.float32)[None, :]
    if ACT == 0:
        a_JI = acc_g * tl.sigmoid(acc_g) * acc_u
    else:
        gate = tl.minimum(acc_g, limit)
        up = tl.minimum(tl.maximum(acc_u, -limit), limit)
        a_JI = (up + 1.0) * (gate * tl.sigmoid(gate * alpha))
    return a_JI


@triton.jit
def _down_tile(
    act_ptr, p_J, j_ok, stride_ap,  # the tile's pairs: act rows, and which of them are real
    w_base, db_base, offs_h, h_ok, w_ptr, y_ptr, I, stride_dh, stride_di, stride_yp,
    TB: tl.constexpr, BHO: tl.constexpr, BI: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_PRECISION: tl.constexpr,
    STAGES: tl.constexpr, ACT_CACHE: tl.constexpr,
):
    """y_p = w_p * (down_u act_p + b_u) for columns offs_h of one expert and a tile of its pairs: the
    work item both down kernels share (inlined into each). STAGES: the I loop's pipeline depth (None:
    the launch's num_stages); ACT_CACHE: act's load cache modifier ("" or ".cg": rows another
    program of the same launch wrote, read from L2)."""
    acc = tl.zeros((TB, BHO), dtype=tl.float32)
    for i0 in tl.range(0, I, BI, num_stages=STAGES):
        offs_i = i0 + tl.arange(0, BI)
        i_ok = offs_i < I
        a_JI = tl.load(act_ptr + p_J[:, None] * stride_ap + offs_i[None, :], mask=j_ok[:, None] & i_ok[None, :],
                       other=0.0, cache_modifier=ACT_CACHE)
        d_IH = tl.load(w_base + offs_h[None, :] * stride_dh + offs_i[:, None] * stride_di,
                       mask=i_ok[:, None] & h_ok[None, :], other=0.0)
        acc = tl.dot(a_JI, d_IH, acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(db_base + offs_h, mask=h_ok, other=0.0).to(tl.float32)[None, :]
    w_J = tl.load(w_ptr + p_J, mask=j_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + p_J[:, None] * stride_yp + offs_h[None, :], acc * w_J[:, None],
             mask=j_ok[:, None] & h_ok[None, :])


@triton.jit
def _reduce_if_last(
    count_ptr, hb, n_work, w_ptr, y_ptr, res_ptr, out_ptr, offs_h, h_ok, T, stride_yp, stride_rt, stride_ot,
    K: tl.constexpr, HAS_RES: tl.constexpr, TR: tl.constexpr, BHO: tl.constexpr,
):
    """The folded reduce both down kernels share: after its item a program counts its arrival at
    column block hb; the block's last item (of n_work) writes out_TH[:, offs_h], the sum over each
    token's K slots of y in slot order (bit for bit _reduce_kernel's), plus the residual."""
    tl.debug_barrier()  # every thread's stores precede the release below
    arrived = tl.atomic_add(count_ptr + hb, 1, sem="acq_rel", scope="gpu")
    if arrived == n_work - 1:  # the block's last item: every expert's rows of it are written
        tl.store(count_ptr + hb, 0)  # back to 0 for the next launch (a graph replays it)
        for t0 in range(0, T, TR):
            offs_t = t0 + tl.arange(0, TR)
            t_ok = offs_t < T
            sum_TH = tl.zeros((TR, BHO), dtype=tl.float32)
            for k in tl.static_range(K):
                w_T = tl.load(w_ptr + offs_t * K + k, mask=t_ok, other=0.0)
                # slots with weight 0 were never computed: their rows hold garbage
                ok = (t_ok & (w_T != 0))[:, None] & h_ok[None, :]
                sum_TH += tl.load(y_ptr + (offs_t * K + k)[:, None] * stride_yp + offs_h[None, :], mask=ok,
                                  other=0.0, cache_modifier=".cg")
            o_ok = t_ok[:, None] & h_ok[None, :]
            if HAS_RES:  # as _reduce_kernel: the sum rounded to the dtype, then the add
                r_TH = tl.load(res_ptr + offs_t[:, None] * stride_rt + offs_h[None, :], mask=o_ok, other=0.0)
                sum_TH = sum_TH.to(out_ptr.dtype.element_ty).to(tl.float32) + r_TH.to(tl.float32)
            tl.store(out_ptr + offs_t[:, None] * stride_ot + offs_h[None, :],
                     sum_TH.to(out_ptr.dtype.element_ty), mask=o_ok)


@dual_jit
def _gate_up_kernel(
    # Pointers
    x_ptr,  # (T, H)
    gu_ptr,  # gate_up weights, any strides
    gub_ptr,  # (E, 2I) bias (HAS_BIAS)
    idx_ptr,  # (P,) expert ids (the (T, K) tensor, contiguous) (ROUTE_IN)
    w_ptr,  # (P,) routing weights (ROUTE_IN)
    pairs_ptr,  # (E, P) int32: read, or with ROUTE_IN written for the down launch
    cnt_ptr,  # (E,) int32: likewise
    act_ptr,  # (P, I) out
    # Dimensions
    E,
    H,
    I,
    K,  # top-k (runtime: one compiled variant serves every model)
    P,  # pairs, T * K (ROUTE_IN)
    up_offset,  # concatenated: row of up_i = i + up_offset (= I); unused when interleaved
    alpha,
    limit,
    # Strides
    stride_xt,
    stride_ge,
    stride_gn,  # along the 2I rows
    stride_gk,  # along H
    stride_be,
    stride_pe,
    stride_ap,
    # Meta-parameters
    E_BLOCK: tl.constexpr,
    ROW_MUL: tl.constexpr,  # 1 concatenated, 2 interleaved
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,  # 0 silu(g) * u; 1 GPT-OSS clamped (u + 1) * g * sigmoid(alpha g)
    TB: tl.constexpr,  # pairs per tile
    BI: tl.constexpr,
    BH: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 (no silent tf32), else unused
    ROUTE_IN: tl.constexpr = False,  # the route launch's lists made here (P <= PB), not read
    PB: tl.constexpr = 16,  # ROUTE_IN: every pair in one block
):
    """Persistent grid: work item (slot, i) = rows [i, i + BI) of the gate and up projections
    of the slot-th expert that has pairs; streamed once per TB of its pairs (one tile in decode).
    A fixed number of programs walks the items, so unrouted experts cost no program at all.
    Interleaved (ROW_MUL=2): the item's rows are the 2*BI adjacent rows from 2i, read as one tile.
    ROUTE_IN: the route launch folded in. Every program counts the pairs per expert from (idx, w)
    (a histogram of the P pairs in registers) and finds its item's pairs in pair order; program q
    also writes expert q's list and count (q + programs, ...), as _route_kernel does, for the down
    launch, which starts after this one ends."""
    offs_e = tl.arange(0, E_BLOCK)
    if ROUTE_IN:
        offs_p, i_P, hit_P, cnt_E = _routed_pairs(idx_ptr, w_ptr, P, E_BLOCK, PB)
        for q in range(tl.program_id(0), E, tl.num_programs(0)):
            tl.store(cnt_ptr + q, _append_pairs(pairs_ptr + q * stride_pe, 0, hit_P & (i_P == q), offs_p))
    else:
        cnt_E = tl.load(cnt_ptr + offs_e, mask=offs_e < E, other=0)
    run_E = cnt_E > 0
    slot_E = tl.cumsum(run_E.to(tl.int32), axis=0) - 1
    n_ib = tl.cdiv(I, BI)
    n_items = tl.sum(run_E.to(tl.int32), axis=0) * n_ib
    for item in range(tl.program_id(0), n_items, tl.num_programs(0)):
        slot = item // n_ib
        u = tl.sum(tl.where(run_E & (slot_E == slot), offs_e, 0), axis=0)
        if ROUTE_IN:
            cnt = tl.sum(tl.where(offs_e == u, cnt_E, 0), axis=0)
            rank_P = _pair_ranks(i_P, hit_P, u)
        else:
            cnt = tl.load(cnt_ptr + u)
        ib = item - slot * n_ib
        offs_i = ib * BI + tl.arange(0, BI)
        w_base = gu_ptr + u.to(tl.int64) * stride_ge
        for j0 in range(0, cnt, TB):
            offs_j = j0 + tl.arange(0, TB)
            j_ok = offs_j < cnt
            if ROUTE_IN:  # the j-th of u's pairs in pair order: the one pair of that rank
                p_J = _pairs_of_rank(rank_P, offs_j, offs_p)
            else:
                p_J = tl.load(pairs_ptr + u * stride_pe + offs_j, mask=j_ok, other=0)
            a_JI = _gate_up_tile(x_ptr, p_J // K, j_ok, stride_xt, w_base, gub_ptr + u * stride_be, ib, H, I,
                                 up_offset, alpha, limit, stride_gn, stride_gk, TB, ROW_MUL, HAS_BIAS, ACT, BI, BH,
                                 DOT_PRECISION)
            tl.store(
                act_ptr + p_J[:, None] * stride_ap + offs_i[None, :],
                a_JI.to(act_ptr.dtype.element_ty),
                mask=j_ok[:, None] & (offs_i < I)[None, :],
            )


@dual_jit
def _down_kernel(
    # Pointers
    act_ptr,  # (P, I)
    dw_ptr,  # down weights, any strides
    db_ptr,  # (E, H) bias (HAS_BIAS)
    w_ptr,  # (P,) routing weights (the (T, K) tensor, contiguous)
    pairs_ptr,  # (E, P) int32
    cnt_ptr,  # (E,) int32
    y_ptr,  # (P, H) fp32 out
    res_ptr,  # (T, H) residual (REDUCE and HAS_RES)
    out_ptr,  # (T, H) out (REDUCE)
    count_ptr,  # (cdiv(H, BHO),) int32 arrival counters, 0 between launches (REDUCE)
    # Dimensions
    E,
    H,
    I,
    T,
    # Strides
    stride_ap,
    stride_de,
    stride_dh,
    stride_di,
    stride_be,
    stride_pe,
    stride_yp,
    stride_rt,
    stride_ot,
    # Meta-parameters
    E_BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    TB: tl.constexpr,
    BHO: tl.constexpr,  # output columns per work item
    BI: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 (no silent tf32), else unused
    REDUCE: tl.constexpr = False,  # the reduce launch folded in: the last item of a column block sums it
    K: tl.constexpr = 1,  # top-k (REDUCE)
    HAS_RES: tl.constexpr = False,  # REDUCE: also add the residual (as _reduce_kernel)
    TR: tl.constexpr = 16,  # REDUCE: tokens per step of the sum
):
    """Persistent grid: work item (slot, h) = rows [h, h + BHO) of the slot-th routed expert's
    down projection, streamed once per TB of its pairs; y_p = w_p * (down_u act_p + b_u). REDUCE:
    after its item a program counts its arrival at column block h; the last of the block's items
    (one per routed expert; with none routed, one empty item) sums y over each token's slots in
    slot order, as _reduce_kernel does (bit for bit), and writes out_TH's block."""
    offs_e = tl.arange(0, E_BLOCK)
    cnt_E = tl.load(cnt_ptr + offs_e, mask=offs_e < E, other=0)
    run_E = cnt_E > 0
    slot_E = tl.cumsum(run_E.to(tl.int32), axis=0) - 1
    n_hb = tl.cdiv(H, BHO)
    n_run = tl.sum(run_E.to(tl.int32), axis=0)
    n_work = tl.maximum(n_run, 1) if REDUCE else n_run  # REDUCE: every column block has an item to finish it
    n_items = n_work * n_hb
    for item in range(tl.program_id(0), n_items, tl.num_programs(0)):
        slot = item // n_hb
        u = tl.sum(tl.where(run_E & (slot_E == slot), offs_e, 0), axis=0)
        cnt = tl.where(n_run > 0, tl.load(cnt_ptr + u), 0)  # 0: the empty item (nothing routed)
        hb = item - slot * n_hb
        offs_h = hb * BHO + tl.arange(0, BHO)
        h_ok = offs_h < H
        w_base = dw_ptr + u.to(tl.int64) * stride_de
        for j0 in range(0, cnt, TB):
            offs_j = j0 + tl.arange(0, TB)
            j_ok = offs_j < cnt
            p_J = tl.load(pairs_ptr + u * stride_pe + offs_j, mask=j_ok, other=0)
            _down_tile(act_ptr, p_J, j_ok, stride_ap, w_base, db_ptr + u * stride_be, offs_h, h_ok, w_ptr, y_ptr, I,
                       stride_dh, stride_di, stride_yp, TB, BHO, BI, HAS_BIAS, DOT_PRECISION, None, "")
        if REDUCE:
            _reduce_if_last(count_ptr, hb, n_work, w_ptr, y_ptr, res_ptr, out_ptr, offs_h, h_ok, T, stride_yp, stride_rt,
                            stride_ot, K, HAS_RES, TR, BHO)


@dual_jit
def _ffn_kernel(
    # Pointers: gate_up
    x_ptr,  # (T, H)
    gu_ptr,  # gate_up weights, any strides
    gub_ptr,  # (E, 2I) bias (HAS_BIAS)
    idx_ptr,  # (P,) expert ids (the (T, K) tensor, contiguous)
    w_ptr,  # (P,) routing weights
    act_ptr,  # (P, I) written by phase 1, read by phase 2
    # Pointers: down
    dw_ptr,  # down weights, any strides
    db_ptr,  # (E, H) bias (HAS_BIAS)
    y_ptr,  # (P, H) fp32 out
    res_ptr,  # (T, H) residual (REDUCE and HAS_RES)
    out_ptr,  # (T, H) out (REDUCE)
    count_ptr,  # (cdiv(H, BHO),) int32 arrival counters, 0 between launches (REDUCE)
    flag_ptr,  # (2 * E_BLOCK + 1,) int32, 0 between launches: per slot, its gate_up items done; then its down items past
    # the wait; last, the waits that gave up (never reset: fused_experts_timeouts reads it)
    # Dimensions
    E,
    H,
    I,
    T,
    P,
    up_offset,
    alpha,
    limit,
    # Strides
    stride_xt,
    stride_ge,
    stride_gn,
    stride_gk,
    stride_gbe,
    stride_ap,
    stride_de,
    stride_dh,
    stride_di,
    stride_dbe,
    stride_yp,
    stride_rt,
    stride_ot,
    # Meta-parameters
    E_BLOCK: tl.constexpr,
    K: tl.constexpr,
    ROW_MUL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    TB: tl.constexpr,  # gate_up's pairs per tile
    BI: tl.constexpr,
    BH: tl.constexpr,
    TB_D: tl.constexpr,  # down's pairs per tile
    BHO: tl.constexpr,
    BI_D: tl.constexpr,
    STAGES_D: tl.constexpr,  # down's pipeline stages (the launch's num_stages are gate_up's)
    DOT_PRECISION: tl.constexpr,
    PB: tl.constexpr,  # every pair in one block (P <= ROUTE_IN_MAX)
    REDUCE: tl.constexpr,
    HAS_RES: tl.constexpr,
    MAX_SPINS: tl.constexpr,  # polls of a slot's count before giving up (FFN_MAX_SPINS)
    TR: tl.constexpr = 16,
):
    """gate_up and down in one persistent launch. Phase 1: every program walks
    gate_up's items as _gate_up_kernel does; after each it counts the item done at its expert's
    slot (release). Phase 2: down's items as _down_kernel does, each first waiting (acquire) until
    its expert's n_ib gate_up items are done, so an expert's down starts while later experts'
    gate_up still streams: no launch boundary between the two. Every program must be resident at
    once (the host sizes the grid by the compiled kernel's occupancy): a waiting program never
    yields its SM. The last of a slot's down items to pass its wait resets the slot's two flags.
    Up to ROUTE_IN_MAX pairs only: both phases find an item's pairs by rank (as _gate_up_kernel's
    ROUTE_IN), so no lists and no route launch. (With the route launch's lists at 64 tokens it took
    1.147x the two launches' time on an H100, results/roofline/fused_ffn_2026-12-07/.)
    In the interpreter (programs one after another) the grid is one program."""
    offs_e = tl.arange(0, E_BLOCK)
    offs_p, i_P, hit_P, cnt_E = _routed_pairs(idx_ptr, w_ptr, P, E_BLOCK, PB)
    run_E = cnt_E > 0
    slot_E = tl.cumsum(run_E.to(tl.int32), axis=0) - 1
    n_run = tl.sum(run_E.to(tl.int32), axis=0)
    n_ib = tl.cdiv(I, BI)
    for item in range(tl.program_id(0), n_run * n_ib, tl.num_programs(0)):
        slot = item // n_ib
        u = tl.sum(tl.where(run_E & (slot_E == slot), offs_e, 0), axis=0)
        cnt = tl.sum(tl.where(offs_e == u, cnt_E, 0), axis=0)
        rank_P = _pair_ranks(i_P, hit_P, u)
        ib = item - slot * n_ib
        offs_i = ib * BI + tl.arange(0, BI)
        w_base = gu_ptr + u.to(tl.int64) * stride_ge
        for j0 in range(0, cnt, TB):
            offs_j = j0 + tl.arange(0, TB)
            j_ok = offs_j < cnt
            p_J = _pairs_of_rank(rank_P, offs_j, offs_p)
            a_JI = _gate_up_tile(x_ptr, p_J // K, j_ok, stride_xt, w_base, gub_ptr + u * stride_gbe, ib, H, I,
                                 up_offset, alpha, limit, stride_gn, stride_gk, TB, ROW_MUL, HAS_BIAS, ACT, BI, BH,
                                 DOT_PRECISION)
            tl.store(act_ptr + p_J[:, None] * stride_ap + offs_i[None, :], a_JI.to(act_ptr.dtype.element_ty),
                     mask=j_ok[:, None] & (offs_i < I)[None, :])
        tl.debug_barrier()  # every thread's stores precede the release below
        tl.atomic_add(flag_ptr + slot, 1, sem="release", scope="gpu")

    n_hb = tl.cdiv(H, BHO)
    n_work = tl.maximum(n_run, 1) if REDUCE else n_run
    for item in range(tl.program_id(0), n_work * n_hb, tl.num_programs(0)):
        slot = item // n_hb
        u = tl.sum(tl.where(run_E & (slot_E == slot), offs_e, 0), axis=0)
        cnt = tl.sum(tl.where(offs_e == u, cnt_E, 0), axis=0)  # 0: the empty item (nothing routed)
        if n_run > 0:  # wait for the slot's gate_up items
            done = tl.atomic_add(flag_ptr + slot, 0, sem="acquire", scope="gpu")
            spins = 0
            while (done < n_ib) & (spins < MAX_SPINS):
                done = tl.atomic_add(flag_ptr + slot, 0, sem="acquire", scope="gpu")
                spins += 1
            if done < n_ib:  # a producer never ran (not resident): say so, and do not hang the GPU
                tl.atomic_add(flag_ptr + 2 * E_BLOCK, 1, sem="relaxed", scope="gpu")
            seen = tl.atomic_add(flag_ptr + E_BLOCK + slot, 1, sem="relaxed", scope="gpu")
            if seen == n_hb - 1:  # every down item of the slot is past its wait: back to 0
                tl.store(flag_ptr + slot, 0)
                tl.store(flag_ptr + E_BLOCK + slot, 0)
        rank_P = _pair_ranks(i_P, hit_P, u)
        hb = item - slot * n_hb
        offs_h = hb * BHO + tl.arange(0, BHO)
        h_ok = offs_h < H
        w_base = dw_ptr + u.to(tl.int64) * stride_de
        for j0 in range(0, cnt, TB_D):
            offs_j = j0 + tl.arange(0, TB_D)
            j_ok = offs_j < cnt
            p_J = _pairs_of_rank(rank_P, offs_j, offs_p)
            _down_tile(act_ptr, p_J, j_ok, stride_ap, w_base, db_ptr + u * stride_dbe, offs_h, h_ok, w_ptr, y_ptr, I,
                       stride_dh, stride_di, stride_yp, TB_D, BHO, BI_D, HAS_BIAS, DOT_PRECISION, STAGES_D, ".cg")
        if REDUCE:
            _reduce_if_last(count_ptr, hb, n_work, w_ptr, y_ptr, res_ptr, out_ptr, offs_h, h_ok, T, stride_yp, stride_rt,
                            stride_ot, K, HAS_RES, TR, BHO)


@dual_jit
def _reduce_kernel(
    # Pointers
    y_ptr,  # (P, H) fp32
    w_ptr,  # (T, K)
    res_ptr,  # (T, H) residual (HAS_RES)
    out_ptr,  # (T, H)
    # Dimensions
    H,
    # Strides
    stride_yp,
    stride_rt,
    stride_ot,
    # Meta-parameters
    K: tl.constexpr,
    BR: tl.constexpr,
    HAS_RES: tl.constexpr,
):
    """Grid (T, cdiv(H, BR)): out_t = sum over slots k (in order) with w_tk != 0 of y_(t,k)
    (+ residual_t: the sum rounded to the output dtype, then added in fp32 and rounded again, as
    PyTorch adds two tensors of that dtype: bit for bit the eager layer's residual stream)."""
    t = tl.program_id(0)
    offs_h = tl.program_id(1) * BR + tl.arange(0, BR)
    h_ok = offs_h < H
    acc = tl.zeros((BR,), dtype=tl.float32)
    for k in tl.static_range(K):
        w = tl.load(w_ptr + t * K + k)
        # slots with weight 0 were never computed: their rows hold garbage
        y = tl.load(y_ptr + (t * K + k) * stride_yp + offs_h, mask=h_ok & (offs_h < tl.where(w != 0, H, 0)), other=0.0)
        acc += y
    if HAS_RES:
        r = tl.load(res_ptr + t * stride_rt + offs_h, mask=h_ok, other=0.0)
        acc = acc.to(out_ptr.dtype.element_ty).to(tl.float32) + r.to(tl.float32)  # as the reduce's doc
    tl.store(out_ptr + t * stride_ot + offs_h, acc.to(out_ptr.dtype.element_ty), mask=h_ok)


# ----------------------------------------------------------------------------- v3: two launches


@dual_jit
def _gate_up_kept_kernel(
    # Pointers
    x_ptr,  # (T, H)
    gu_ptr,  # gate_up weights, any strides
    gub_ptr,  # (E, 2I) bias (HAS_BIAS)
    keep_ptr,  # (M,) int64 kept ids, -1 past the kept count
    idx_ptr,  # (T, K) int
    w_ptr,  # (T, K)
    act_ptr,  # (P, I) out: row t*K + k of each token's first slot on the expert
    # Dimensions
    T,
    H,
    I,
    M,
    up_offset,  # concatenated: row of up_i = i + up_offset (= I); unused when interleaved
    alpha,
    limit,
    # Strides
    stride_xt,
    stride_ge,
    stride_gn,  # along the 2I rows
    stride_gk,  # along H
    stride_be,
    stride_ap,
    # Meta-parameters
    K: tl.constexpr,
    K_BLOCK: tl.constexpr,
    T_BLOCK: tl.constexpr,  # all tokens in one tile (v3 serves T <= V3_MAX_TOKENS)
    M_BLOCK: tl.constexpr,
    ROW_MUL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    BI: tl.constexpr,
    BH: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 (no silent tf32), else unused
):
    """Persistent grid over work items (kept slot, i) = rows [i, i + BI) of the gate and up
    projections of the slot's expert u, streamed once; the tokens routed to u (a nonzero-weight
    slot on u) are found in the routing itself, so no route launch precedes this one. Interleaved
    (ROW_MUL=2): the item's rows are the 2*BI adjacent rows from 2i, read as one tile."""
    # the kept list, the routing and the weights' signs live in registers: an item's expert and
    # tokens come from them without a memory round trip, so the weight loads can be issued ahead
    offs_m = tl.arange(0, M_BLOCK)
    kept_M = tl.load(keep_ptr + offs_m, mask=offs_m < M, other=-1)
    n_kept = tl.sum((kept_M >= 0).to(tl.int32), axis=0)
    n_ib = tl.cdiv(I, BI)
    offs_t = tl.arange(0, T_BLOCK)
    offs_k = tl.arange(0, K_BLOCK)
    tk_ok = (offs_t < T)[:, None] & (offs_k < K)[None, :]
    idx_TK = tl.load(idx_ptr + offs_t[:, None] * K + offs_k[None, :], mask=tk_ok, other=-1)
    nz_TK = tl.load(w_ptr + offs_t[:, None] * K + offs_k[None, :], mask=tk_ok, other=0.0) != 0
    for item in range(tl.program_id(0), n_kept * n_ib, tl.num_programs(0)):
        slot = item // n_ib
        u = tl.sum(tl.where(offs_m == slot, kept_M, 0), axis=0)
        hit_TK = (idx_TK == u) & nz_TK
        routed_T = tl.sum(hit_TK.to(tl.int32), axis=1) > 0
        p_T = offs_t * K + tl.min(tl.where(hit_TK, offs_k[None, :], K_BLOCK), axis=1)
        ib = item - slot * n_ib
        offs_i = ib * BI + tl.arange(0, BI)
        a_TI = _gate_up_tile(x_ptr, offs_t, routed_T, stride_xt, gu_ptr + u * stride_ge, gub_ptr + u * stride_be, ib,
                             H, I, up_offset, alpha, limit, stride_gn, stride_gk, T_BLOCK, ROW_MUL, HAS_BIAS, ACT, BI,
                             BH, DOT_PRECISION)
        tl.store(act_ptr + p_T[:, None] * stride_ap + offs_i[None, :], a_TI.to(act_ptr.dtype.element_ty),
                 mask=routed_T[:, None] & (offs_i < I)[None, :])


@dual_jit
def _down_kept_kernel(
    # Pointers
    act_ptr,  # (P, I)
    dw_ptr,  # down weights, any strides
    db_ptr,  # (E, H) bias (HAS_BIAS)
    keep_ptr,  # (M,) int64
    idx_ptr,  # (T, K)
    w_ptr,  # (T, K)
    res_ptr,  # (T, H) residual (HAS_RES)
    out_ptr,  # (T, H) out, dtype of x
    # Dimensions
    T,
    H,
    I,
    M,
    # Strides
    stride_ap,
    stride_de,
    stride_dh,
    stride_di,
    stride_be,
    stride_rt,
    stride_ot,
    # Meta-parameters
    K: tl.constexpr,
    K_BLOCK: tl.constexpr,
    T_BLOCK: tl.constexpr,
    M_BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_RES: tl.constexpr,
    BHO: tl.constexpr,  # output columns per program
    BI: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 (no silent tf32), else unused
):
    """Grid (cdiv(H, BHO),): a program owns output columns [h, h + BHO) of every token and walks
    the kept experts, streaming rows [h, h + BHO) of each one's down projection once; the
    weighted sum over experts stays in fp32 registers and is written once, in the output dtype
    (no per-pair buffer, no reduce launch, no atomics: deterministic)."""
    offs_h = tl.program_id(0) * BHO + tl.arange(0, BHO)
    h_ok = offs_h < H
    offs_m = tl.arange(0, M_BLOCK)
    kept_M = tl.load(keep_ptr + offs_m, mask=offs_m < M, other=-1)  # in registers (see gate_up)
    n_kept = tl.sum((kept_M >= 0).to(tl.int32), axis=0)
    n_ib = tl.cdiv(I, BI)
    offs_t = tl.arange(0, T_BLOCK)
    t_ok = offs_t < T
    offs_k = tl.arange(0, K_BLOCK)
    tk_ok = t_ok[:, None] & (offs_k < K)[None, :]
    idx_TK = tl.load(idx_ptr + offs_t[:, None] * K + offs_k[None, :], mask=tk_ok, other=-1)
    w_TK = tl.load(w_ptr + offs_t[:, None] * K + offs_k[None, :], mask=tk_ok, other=0.0).to(tl.float32)
    acc_TH = tl.zeros((T_BLOCK, BHO), dtype=tl.float32)
    part_TH = tl.zeros((T_BLOCK, BHO), dtype=tl.float32)
    # one flat loop over (kept expert, I block): software pipelining runs across expert boundaries
    for it in range(n_kept * n_ib):
        slot = it // n_ib
        j = it - slot * n_ib
        u = tl.sum(tl.where(offs_m == slot, kept_M, 0), axis=0)
        hit_TK = (idx_TK == u) & (w_TK != 0)
        routed_T = tl.sum(hit_TK.to(tl.int32), axis=1) > 0
        p_T = offs_t * K + tl.min(tl.where(hit_TK, offs_k[None, :], K_BLOCK), axis=1)
        offs_i = j * BI + tl.arange(0, BI)
        i_ok = offs_i < I
        a_TI = tl.load(act_ptr + p_T[:, None] * stride_ap + offs_i[None, :], mask=routed_T[:, None] & i_ok[None, :],
                       other=0.0)
        d_IH = tl.load(dw_ptr + u * stride_de + offs_h[None, :] * stride_dh + offs_i[:, None] * stride_di,
                       mask=i_ok[:, None] & h_ok[None, :], other=0.0)
        part_TH = tl.dot(a_TI, d_IH, tl.where(j == 0, 0.0, part_TH), input_precision=DOT_PRECISION)
        if HAS_BIAS:
            b_H = tl.load(db_ptr + u * stride_be + offs_h, mask=h_ok, other=0.0).to(tl.float32)
            done_TH = part_TH + b_H[None, :]
        else:
            done_TH = part_TH
        # the token's weight on u (summed: `similar` re-routing may give a token u twice)
        wt_T = tl.sum(tl.where(hit_TK, w_TK, 0.0), axis=1)
        acc_TH += tl.where(j == n_ib - 1, done_TH * wt_T[:, None], 0.0)
    if HAS_RES:
        r_TH = tl.load(res_ptr + offs_t[:, None] * stride_rt + offs_h[None, :], mask=t_ok[:, None] & h_ok[None, :],
                       other=0.0)
        acc_TH = acc_TH.to(out_ptr.dtype.element_ty).to(tl.float32) + r_TH.to(tl.float32)  # as _reduce_kernel
    tl.store(out_ptr + offs_t[:, None] * stride_ot + offs_h[None, :], acc_TH.to(out_ptr.dtype.element_ty),
             mask=t_ok[:, None] & h_ok[None, :])


# ----------------------------------------------------------------------------- launch configs


@dataclass
class ExpertsConfig:
    """Launch parameters of the gate_up and down kernels for one (H, I, T-bucket)."""

    gate_up: dict = field(default_factory=lambda: dict(TB=16, BI=32, BH=128, num_warps=4, num_stages=4, PER_SM=3))  # noqa: C408
    down: dict = field(default_factory=lambda: dict(TB=16, BHO=32, BI=128, num_warps=4, num_stages=4, PER_SM=4))  # noqa: C408
    # v3 (a kept list given): gate_up over (kept slot, I block), down with one program per BHO columns
    gate_up_kept: dict = field(default_factory=lambda: dict(BI=32, BH=128, num_warps=4, num_stages=4, PER_SM=3))  # noqa: C408
    down_kept: dict = field(default_factory=lambda: dict(BHO=16, BI=128, num_warps=4, num_stages=4))  # noqa: C408
    # take v3 when a kept list is given: the tuned table says which path is faster for the shape
    # (its objectives, tools/tune_kernels.py); without both objectives, v3 on the CPU (tests) and
    # the four-launch path on a GPU
    use_kept: bool = True
    # with use_kept, v3 only where the kept list's length (its static bound: the budget, or E for
    # dense) is at most this: v3 wins at small kept sets and loses at dense ones; against the
    # four-launch path with its own tuned configs the bound is small (H100, Qwen3-30B-A3B shape, v3's
    # time over the four launches' in three alternations: T = 1 0.99 at 16 and 32 kept, 1.07 at 128;
    # T = 16 0.996-1.004 at 16; T = 64 1.22 at 16: results/roofline/grid_2026-12-05d/kernels/
    # tune_experts.log). The tuned table's "kept_max" (tools/tune_kernels.py), None where it has none
    kept_max: int | None = None
    # the four-launch path's reduce inside its down launch (three launches, the same sums bit for
    # bit); the tuned table's "reduce_in_down", where tools/tune_kernels.py found it faster
    reduce_in_down: bool = False


@cache
def num_sms(device: torch.device) -> int:
    """Programs of the persistent kernels = PER_SM x this (the interpreter runs a few)."""
    if device.type != "cuda":
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


def config_key(H: int, I: int, T: int) -> str:
    return f"H={H},I={I},T={min(next_pow2(T), 128)}"


def get_config(H: int, I: int, T: int, device: torch.device) -> ExpertsConfig:
    """Tuned config from configs/<gpu>.json for this shape; else the nearest T of the same
    (H, I); else configs/default.json's entry; else the built-in fallback."""
    if os.environ.get("BASE_KERNELS_NO_TUNED"):
        return ExpertsConfig(use_kept=device.type == "cpu")
    table = _load_configs(device_name(device))
    entry = table.get(entry_key(table, H, I, T)) or _load_configs("default").get("*")
    return config_from_entry(entry, on_cpu=device.type == "cpu")


def entry_key(table: dict, H: int, I: int, T: int) -> str:
    """The key of `table` that T tokens of shape (H, I) read: their own bucket's, else the nearest
    tuned bucket of the same (H, I) (kernels/tuned.nearest_key; also what tools/aot_check.py
    --tables compiles at each T); their own bucket's key where none of (H, I) is tuned."""
    return nearest_key(table, f"H={H},I={I}", T) or config_key(H, I, T)


def config_from_entry(entry: dict | None, on_cpu: bool) -> ExpertsConfig:
    """A table entry's launches over the built-in ones, and which path it takes: v3 where the entry
    measured it faster (its objectives, or its kept bound); without a measurement, v3 on the CPU
    (tests) and the four-launch path on a GPU."""
    measured = entry is not None and "objective" in entry and "objective_kept" in entry
    use_kept = entry["objective_kept"] < entry["objective"] if measured else on_cpu
    kept_max = None
    if entry and "kept_max" in entry:  # measured per kept bound (tools/tune_kernels.py): it decides
        kept_max = int(entry["kept_max"])
        use_kept = kept_max > 0
    if not entry:
        return ExpertsConfig(use_kept=use_kept)
    base = ExpertsConfig()
    return ExpertsConfig(gate_up={**base.gate_up, **entry.get("gate_up", {})}, down={**base.down, **entry.get("down", {})},
                         gate_up_kept={**base.gate_up_kept, **entry.get("gate_up_kept", {})},
                         down_kept={**base.down_kept, **entry.get("down_kept", {})}, use_kept=use_kept,
                         kept_max=kept_max, reduce_in_down=bool(entry.get("reduce_in_down", False)))


# ----------------------------------------------------------------------------- wrapper


def _precision(x: Tensor) -> str:
    """fp32 products in full fp32, as the references compute them (Triton's default is tf32)."""
    return "ieee" if x.dtype == torch.float32 else "tf32"


@dataclass(frozen=True)
class ExpertsLayout:
    """How the expert weights are stored (transformers' use_experts_implementation flags)."""

    transposed: bool = False  # gate_up (E, H, 2I), down (E, I, H)
    interleaved: bool = False  # gate and up rows alternate (GPT-OSS) instead of [gate; up]
    act: str = "silu"  # or "gptoss": clamped SwiGLU (u + 1) * g * sigmoid(alpha * g)
    alpha: float = 1.702
    limit: float = 7.0


def fused_experts(
    x_TH: Tensor,
    gate_up: Tensor,
    down: Tensor,
    topk_idx_TK: Tensor,
    topk_w_TK: Tensor,
    *,
    layout: ExpertsLayout = ExpertsLayout(),
    gate_up_bias: Tensor | None = None,
    down_bias: Tensor | None = None,
    config: ExpertsConfig | None = None,
    keep_M: Tensor | None = None,
    residual_TH: Tensor | None = None,
    up_offset: int | None = None,
    fit: bool = True,
    _stages: int = 4,
) -> Tensor:
    """out_TH (dtype of x): the routed experts' weighted sum; pairs with w == 0 are skipped.
    With residual_TH (T, H), residual_TH + that sum, rounded as PyTorch's add of the two in x's
    dtype: the decoder layer's residual add in the last launch instead of a launch of its own.

    keep_M (the selection kernel's kept ids, -1 padded; every nonzero-weight pair must be on one
    of them), T <= V3_MAX_TOKENS and the config's `use_kept` (the tuned table's choice, and its
    `kept_max` against keep_M's length, a shape the host knows without a sync): two launches
    (`_gate_up_kept_kernel`, `_down_kept_kernel`). Otherwise four (route, gate_up, down,
    reduce); up to ROUTE_IN_MAX pairs gate_up and down (and the route launch's work) are one
    launch, `_ffn_kernel`, then the reduce unless folded in. `_stages` < 4 runs only the first launches of
    the four-launch path: for timing breakdowns (route, gate_up, down, reduce: up to ROUTE_IN_MAX
    pairs `_stages=1` runs nothing, as the gate_up launch does the route launch's work).

    `fit` False: each launch exactly as its config names it, or Triton's OutOfResources where the
    device cannot hold it (a tuner or benchmark times the launch it names); True (the default) sheds
    pipeline stages, then halves the reduction tile, until it fits (`_launch_fitted`).

    up_offset: rows from an expert's gate row i to its up row i (default I: each expert's own
    [gate; up]). A dense MLP's [gate; up] weights, (2 I_s, H), split into C chunks of I = I_s / C
    rows, pass a (C, I, H) view of the gate rows and up_offset = I_s (base/hf/shared_experts.py)."""
    if up_offset is not None and layout.interleaved:
        raise ValueError("up_offset applies to the concatenated [gate; up] layout, not the interleaved one")
    T, H = x_TH.shape
    I = down.shape[1] if layout.transposed else down.shape[2]
    cfg = config or get_config(H, I, T, x_TH.device)
    if residual_TH is not None and residual_TH.stride(1) != 1:
        residual_TH = residual_TH.contiguous()
    if (keep_M is not None and T <= V3_MAX_TOKENS and _stages == 4 and cfg.use_kept
            and (cfg.kept_max is None or keep_M.shape[0] <= cfg.kept_max)):
        return _fused_experts_kept(x_TH, gate_up, down, topk_idx_TK, topk_w_TK, keep_M, layout=layout,
                                   gate_up_bias=gate_up_bias, down_bias=down_bias, config=cfg,
                                   residual_TH=residual_TH, up_offset=up_offset, fit=fit)
    K = topk_idx_TK.shape[1]
    E = gate_up.shape[0]
    P = T * K
    dev = x_TH.device
    x_TH = x_TH if x_TH.stride(1) == 1 else x_TH.contiguous()
    idx_P = topk_idx_TK.contiguous()
    w_P = topk_w_TK.contiguous()
    pairs_EP = empty(E, P, device=dev, dtype=torch.int32)
    cnt_E = empty(E, device=dev, dtype=torch.int32)
    act_PI = empty(P, I, device=dev, dtype=x_TH.dtype)
    y_PH = empty(P, H, device=dev, dtype=torch.float32)
    out_TH = empty(T, H, device=dev, dtype=x_TH.dtype)

    # at most ROUTE_IN_MAX pairs the gate_up launch makes the pair lists itself (no route launch)
    route_in = P <= ROUTE_IN_MAX
    if not route_in:
        _route_kernel.on(dev)[(E,)](idx_P, w_P, pairs_EP, cnt_E, P, pairs_EP.stride(0), PB=min(next_pow2(P), 1024))

    if layout.transposed:  # (E, H, 2I): rows of the product along dim 2
        s_gn, s_gk = gate_up.stride(2), gate_up.stride(1)
        s_dh, s_di = down.stride(2), down.stride(1)
    else:
        s_gn, s_gk = gate_up.stride(1), gate_up.stride(2)
        s_dh, s_di = down.stride(1), down.stride(2)
    if _stages < 2:
        return out_TH
    gu, dn = dict(cfg.gate_up), dict(cfg.down)
    n_prog = lambda n_items, per_sm: max(1, min(n_items, num_sms(dev) * per_sm))
    if FUSED_FFN and _stages == 4 and route_in:
        res = residual_TH if residual_TH is not None else out_TH
        fold = cfg.reduce_in_down
        n_hb = triton.cdiv(H, dn["BHO"])
        kwargs = dict(  # noqa: C408
            E_BLOCK=next_pow2(E, 16), K=K, ROW_MUL=2 if layout.interleaved else 1, HAS_BIAS=gate_up_bias is not None,
            ACT=ACTS[layout.act], TB=gu["TB"], BI=gu["BI"], BH=gu["BH"], TB_D=dn["TB"], BHO=dn["BHO"], BI_D=dn["BI"],
            STAGES_D=dn["num_stages"], DOT_PRECISION=_precision(x_TH), PB=next_pow2(P), REDUCE=fold,
            HAS_RES=residual_TH is not None, MAX_SPINS=FFN_MAX_SPINS, num_warps=gu["num_warps"],
            num_stages=gu["num_stages"])
        args = (
            x_TH, gate_up, gate_up_bias if gate_up_bias is not None else x_TH, idx_P, w_P, act_PI,
            down, down_bias if down_bias is not None else x_TH, y_PH, res, out_TH,
            arrival_counters(n_hb, dev, "experts_down") if fold else cnt_E,
            arrival_counters(2 * next_pow2(E, 16) + 1, dev, "experts_ffn"),
            E, H, I, T, P, _up_offset(I, layout, up_offset), float(layout.alpha), float(layout.limit),
            x_TH.stride(0), gate_up.stride(0), s_gn, s_gk, gate_up_bias.stride(0) if gate_up_bias is not None else 0,
            act_PI.stride(0), down.stride(0), s_dh, s_di,
            down_bias.stride(0) if down_bias is not None else 0, y_PH.stride(0), res.stride(0), out_TH.stride(0))
        key = (dev, tuple(sorted(kwargs.items())), tuple(a.dtype for a in args if isinstance(a, Tensor)))
        if not fit or _FFN_HELD.get(key, True):  # fit False: as named, never the two instead
            try:
                n_items = E * max(triton.cdiv(I, gu["BI"]), n_hb)
                grid = (1,) if dev.type == "cpu" else (n_prog(n_items, min(gu["PER_SM"], _resident(dev, args, kwargs, key))),)
                _ffn_kernel.on(dev)[grid](*args, **kwargs)
                _FFN_E_BLOCKS.add(kwargs["E_BLOCK"])
            except OutOfResources as err:  # raised on the host before anything is enqueued
                if not fit or err.name != "shared memory":
                    raise
                _FFN_HELD[key] = False  # the two launches below instead, each fitted as the table's entries are
            else:
                if fold:
                    return out_TH
                BR = min(next_pow2(H), 1024)
                _reduce_kernel.on(dev)[(T, triton.cdiv(H, BR))](
                    y_PH, w_P, res, out_TH, H, y_PH.stride(0), res.stride(0), out_TH.stride(0), K=K, BR=BR,
                    HAS_RES=residual_TH is not None,
                )
                return out_TH
    grid = (n_prog(E * triton.cdiv(I, gu["BI"]), gu.pop("PER_SM")),)
    _launch_fitted(_gate_up_kernel, dev, grid, gu, "gate_up", fit)(
        x_TH, gate_up, gate_up_bias if gate_up_bias is not None else x_TH, idx_P, w_P, pairs_EP, cnt_E, act_PI,
        E, H, I, K, P, _up_offset(I, layout, up_offset), float(layout.alpha), float(layout.limit),
        x_TH.stride(0), gate_up.stride(0), s_gn, s_gk,
        gate_up_bias.stride(0) if gate_up_bias is not None else 0, pairs_EP.stride(0), act_PI.stride(0),
        E_BLOCK=next_pow2(E, 16), ROW_MUL=2 if layout.interleaved else 1, HAS_BIAS=gate_up_bias is not None,
        ACT=ACTS[layout.act], DOT_PRECISION=_precision(x_TH), ROUTE_IN=route_in, PB=next_pow2(P) if route_in else 16,
    )  # fmt: skip
    if _stages < 3:
        return out_TH
    res = residual_TH if residual_TH is not None else out_TH
    fold = cfg.reduce_in_down and _stages == 4
    n_hb = triton.cdiv(H, dn["BHO"])
    _launch_fitted(_down_kernel, dev, (n_prog(E * n_hb, dn.pop("PER_SM")),), dn, "down", fit)(
        act_PI, down, down_bias if down_bias is not None else x_TH, w_P, pairs_EP, cnt_E, y_PH,
        res, out_TH, arrival_counters(n_hb, dev, "experts_down") if fold else cnt_E,
        E, H, I, T,
        act_PI.stride(0), down.stride(0), s_dh, s_di,
        down_bias.stride(0) if down_bias is not None else 0, pairs_EP.stride(0), y_PH.stride(0),
        res.stride(0), out_TH.stride(0),
        E_BLOCK=next_pow2(E, 16), HAS_BIAS=down_bias is not None, DOT_PRECISION=_precision(x_TH),
        REDUCE=fold, K=K, HAS_RES=residual_TH is not None,
    )  # fmt: skip
    if _stages < 4 or fold:
        return out_TH
    BR = min(next_pow2(H), 1024)
    _reduce_kernel.on(dev)[(T, triton.cdiv(H, BR))](
        y_PH, w_P, res, out_TH, H, y_PH.stride(0), res.stride(0), out_TH.stride(0), K=K, BR=BR,
        HAS_RES=residual_TH is not None,
    )
    return out_TH


def _up_offset(I: int, layout: ExpertsLayout, up_offset: int | None) -> int:
    """The kernels' row step from gate_i to up_i (unused when interleaved)."""
    return 1 if layout.interleaved else (I if up_offset is None else up_offset)


_FITTED: dict[tuple, dict] = {}  # (device, kernel, asked launch, constexprs, dtypes) -> the launch that fits


def _launch_fitted(kernel, dev: torch.device, grid: tuple, launch: dict, part: str, fit: bool):
    """A launcher: kernel[grid](*args, **kwargs, **launch) with a launch the device can hold. A
    table entry is timed in bf16, and in float32 its pipelined tiles need twice the shared memory
    (compiled for sm_90, the H100 table's H=2048,I=1408,T=64 kept-path launches need 256 and 240 KB
    against 227: `python -m tools.aot_check --tables`): one pipeline stage fewer at a time, then half
    the reduction tile (smaller_launch; the grid depends on neither), remembered per launch,
    constexprs and dtypes (fit_shared_memory)."""

    def launcher(*args, **kwargs):
        def run(fitted: dict) -> None:
            kernel.on(dev)[grid](*args, **kwargs, **fitted)

        key = (dev, kernel.__name__, tuple(launch.items()), tuple(kwargs.items()),
               tuple(a.dtype for a in args if isinstance(a, Tensor)))
        fit_shared_memory(run, launch, lambda fitted: smaller_launch(fitted, part), _FITTED, key, fit=fit)

    return launcher


REDUCE_TILE = {"gate_up": "BH", "gate_up_kept": "BH", "down": "BI", "down_kept": "BI"}  # each kernel's reduction tile


def smaller_launch(launch: dict, part: str) -> dict | None:
    """The next launch of `part` (an ExpertsConfig field) needing less shared memory (each pipeline
    stage holds an x and a weight tile): one stage fewer, then at one stage half the reduction tile
    (REDUCE_TILE); None at one stage of 16."""
    tile = REDUCE_TILE[part]
    if launch["num_stages"] > 1:  # ExpertsConfig's launches all name theirs
        return {**launch, "num_stages": launch["num_stages"] - 1}
    return None if launch[tile] <= 16 else {**launch, tile: launch[tile] // 2}


# gate_up and down as one launch (_ffn_kernel) up to ROUTE_IN_MAX pairs; False only in tests (its reference, the two)
FUSED_FFN = True
FFN_MAX_SPINS = 1 << 22  # polls of a slot's count before a wait gives up (seconds; a wait takes microseconds)


# per launch (device, constexprs, dtypes): False where the device cannot hold _ffn_kernel's program (its gate_up and
# down tiles, pipelined, in shared memory at once: a bf16 entry run in float32); such a launch runs as the two
_FFN_HELD: dict[tuple, bool] = {}


_FFN_E_BLOCKS: set[int] = set()  # the E_BLOCKs _ffn_kernel ran with: its give-up count sits at 2 * E_BLOCK


def ffn_waits_given_up() -> int:
    """How many of _ffn_kernel's waits gave up since the process started, on every device (0 unless
    a program that a wait needed was not resident for seconds: a wrong occupancy count, or another
    process's kernels holding the SMs). A wait that gives up lets its down item read activations
    not yet written, so any nonzero count means wrong outputs: base/run/pipeline.py fails the run.
    A host sync per device buffer: for the end of a run and for tests."""
    return sum(int(buf[2 * eb]) for buf in counter_buffers("experts_ffn") for eb in _FFN_E_BLOCKS
               if 2 * eb < buf.numel())


_RESIDENT: dict[tuple, int] = {}


def _resident(dev: torch.device, args: tuple, kwargs: dict, key: tuple) -> int:
    """How many programs of _ffn_kernel one SM holds at once, from the compiled kernel's registers,
    shared memory and warps (its phase 2 waits on phase 1's programs, so every program must be
    resident: the grid is at most SMs x this). `key`: the launch's, as fused_experts keys _FFN_HELD."""
    if key not in _RESIDENT:
        k = _ffn_kernel.gpu.warmup(*args, grid=(1,), **kwargs)
        k._init_handles()  # loads the binary: its register count is known from then on
        if not getattr(k, "n_regs", None):  # unknown: one program an SM always fits
            _RESIDENT[key] = 1
            return 1
        props = torch.cuda.get_device_properties(dev)
        warps = kwargs["num_warps"]
        regs_per_warp = -(-k.n_regs * 32 // 256) * 256
        by_regs = getattr(props, "regs_per_multiprocessor", 65536) // (regs_per_warp * warps)
        smem_sm = getattr(props, "shared_memory_per_multiprocessor", 233472)
        # above 48 KB Triton asks for the largest shared-memory carveout (CU_FUNC_CACHE_PREFER_SHARED);
        # below, the driver picks one we cannot know, so count on one program an SM
        by_smem = smem_sm // (k.metadata.shared + 1024) if k.metadata.shared > 49152 else 1
        by_threads = getattr(props, "max_threads_per_multi_processor", 2048) // (32 * warps)
        _RESIDENT[key] = max(1, min(by_regs, by_smem, by_threads, 32))
    return _RESIDENT[key]


# pairs (T * K) up to which the gate_up launch routes them itself; above, a route launch. Its item's
# pairs come from a (TB, P) selection in registers: compiled for sm_90 at 256 pairs (T=32, TB=32)
# it spills (255 registers and a 248 B stack, `python -m tools.aot_check`), at 128 it does not
ROUTE_IN_MAX = 128
V3_MAX_TOKENS = 64  # above: the four-launch path (its pair lists beat token tiles at many tokens)


def _fused_experts_kept(x_TH: Tensor, gate_up: Tensor, down: Tensor, topk_idx_TK: Tensor, topk_w_TK: Tensor,
                        keep_M: Tensor, *, layout: ExpertsLayout, gate_up_bias: Tensor | None,
                        down_bias: Tensor | None, config: ExpertsConfig | None,
                        residual_TH: Tensor | None = None, up_offset: int | None = None, fit: bool = True) -> Tensor:
    """v3: gate_up over the kept experts, then down straight into the output (two launches)."""
    T, H = x_TH.shape
    K = topk_idx_TK.shape[1]
    I = down.shape[1] if layout.transposed else down.shape[2]
    M = keep_M.shape[0]
    dev = x_TH.device
    cfg = config or get_config(H, I, T, dev)
    x_TH = x_TH if x_TH.stride(1) == 1 else x_TH.contiguous()
    idx_TK = topk_idx_TK.contiguous()
    w_TK = topk_w_TK.contiguous()
    act_PI = empty(T * K, I, device=dev, dtype=x_TH.dtype)
    out_TH = empty(T, H, device=dev, dtype=x_TH.dtype)
    if layout.transposed:  # (E, H, 2I): rows of the product along dim 2
        s_gn, s_gk = gate_up.stride(2), gate_up.stride(1)
        s_dh, s_di = down.stride(2), down.stride(1)
    else:
        s_gn, s_gk = gate_up.stride(1), gate_up.stride(2)
        s_dh, s_di = down.stride(1), down.stride(2)
    gu, dn = dict(cfg.gate_up_kept), dict(cfg.down_kept)
    common = dict(K=K, K_BLOCK=next_pow2(K), T_BLOCK=next_pow2(T, 16), M_BLOCK=next_pow2(M))  # noqa: C408
    n_items = M * triton.cdiv(I, gu["BI"])
    grid = (max(1, min(n_items, num_sms(dev) * gu.pop("PER_SM"))),)
    _launch_fitted(_gate_up_kept_kernel, dev, grid, gu, "gate_up_kept", fit)(
        x_TH, gate_up, gate_up_bias if gate_up_bias is not None else x_TH, keep_M, idx_TK, w_TK, act_PI,
        T, H, I, M, _up_offset(I, layout, up_offset), float(layout.alpha), float(layout.limit),
        x_TH.stride(0), gate_up.stride(0), s_gn, s_gk,
        gate_up_bias.stride(0) if gate_up_bias is not None else 0, act_PI.stride(0),
        ROW_MUL=2 if layout.interleaved else 1, HAS_BIAS=gate_up_bias is not None, ACT=ACTS[layout.act], DOT_PRECISION=_precision(x_TH),
        **common,
    )  # fmt: skip
    res = out_TH if residual_TH is None else residual_TH  # contiguous rows: fused_experts
    _launch_fitted(_down_kept_kernel, dev, (triton.cdiv(H, dn["BHO"]),), dn, "down_kept", fit)(
        act_PI, down, down_bias if down_bias is not None else x_TH, keep_M, idx_TK, w_TK, res, out_TH,
        T, H, I, M,
        act_PI.stride(0), down.stride(0), s_dh, s_di, down_bias.stride(0) if down_bias is not None else 0,
        res.stride(0), out_TH.stride(0),
        HAS_BIAS=down_bias is not None, HAS_RES=residual_TH is not None, DOT_PRECISION=_precision(x_TH),
        **common,
    )  # fmt: skip
    return out_TH


def experts_reference(
    x_TH: Tensor,
    gate_up: Tensor,
    down: Tensor,
    topk_idx_TK: Tensor,
    topk_w_TK: Tensor,
    *,
    layout: ExpertsLayout = ExpertsLayout(),
    gate_up_bias: Tensor | None = None,
    down_bias: Tensor | None = None,
) -> Tensor:
    """The same function in float64 PyTorch, one pair at a time (small shapes only)."""
    x = x_TH.double()
    out = torch.zeros_like(x)
    T, K = topk_idx_TK.shape
    for t in range(T):
        for k in range(K):
            w = float(topk_w_TK[t, k])
            if w == 0.0:
                continue
            u = int(topk_idx_TK[t, k])
            gu = gate_up[u].double()
            h = x[t] @ gu if layout.transposed else gu @ x[t]  # (2I,)
            if gate_up_bias is not None:
                h = h + gate_up_bias[u].double()
            if layout.interleaved:
                g, up = h[0::2], h[1::2]
            else:
                g, up = h.chunk(2)
            if layout.act == "silu":
                a = torch.nn.functional.silu(g) * up
            else:
                g = g.clamp(max=layout.limit)
                up = up.clamp(-layout.limit, layout.limit)
                a = (up + 1) * g * torch.sigmoid(g * layout.alpha)
            d = down[u].double()
            o = a @ d if layout.transposed else d @ a
            if down_bias is not None:
                o = o + down_bias[u].double()
            out[t] += w * o
    return out
