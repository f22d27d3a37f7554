"""Route + select + reassign: one MoE layer's whole selection step in ONE launch.

    routing, sel = route_select_gemv(z_TH, wcat_CH, E, K, active_T, budget, norm_topk=True, kind="base", ...)
    out_TH = fused_experts(z_TH, gate_up, down, sel.topk_idx_TK, sel.topk_w_TK, keep_M=sel.keep_M)

Three entry points share one kernel (`_route_select_kernel`):
  route_select       after the router's GEMM (logits given): softmax, top-k (+ renormalise,
                     scale), the batch score, the kept set and the reassignment; one program.
                     What the budgeted model runs (base/method/backends.py).
  route_select_gemv  the same with the router's GEMM in the launch (for `base` over [router;
                     predictor] rows). Grid cdiv(C, CB): every program computes CB output columns
                     for all tokens into a workspace; the LAST program to arrive (an atomic
                     counter it resets) does the rest. One launch fewer, but on an H200 it measured
                     slower than cuBLAS + `route_select` (19.1 against 17.3 us per layer at 16
                     tokens: benchmarks/kernels/v3/run1_bench.log), so nothing uses it by default.
  select_reassign    the selection after the model's own router (probs, top-k given): one program.

Launch forms of route_select / select_reassign (`SelectLaunch`, tuned per GPU and token count):
  one program        (default) the routing, score, ranking and reassignment of every token in turn.
  split              two launches, one program per tile: each tile's routing and partial sums; then
                     every program ranks from the partials and reassigns its tile.
Both give the same outputs bit for bit at the same tokens per tile (tests/test_route_kernel.py).

References: `base.method.routing.select_top_m` / `reassign`, the selectors' `keep` and `score`
(base/method/selectors.py) and `coverage_count`; tests/test_kernels.py compares against them.

Shapes: T tokens, H hidden, C GEMM outputs (E, or 2E with the predictor), E experts, K top-k,
M budget (kept experts).
    probs_TE     fp32 router probabilities (order of preference for backfill)
    topk_idx_TK  the model's experts; topk_w_TK their weights (model dtype)
    active_T     bool; inactive tokens neither score, nor anchor, nor count in the union
    score_E      fp32 batch score (input for a static score, else written by the kernel)
    keep_E       bool kept set; keep_M int64 kept ids by rank, padded with -1 (the experts
                 kernel's work list: kernels/experts.py)

What a selector is, for the kernel:
    KIND   the per-pair score term (kernels/terms.py) or a static score_E
    TIER   none | anchor: every active token's top-k0 experts first (Anchored selectors:
           base_anchor, xshare, lynx) | top1_union: first choices first, ranked by their summed
           weight | oea: the union of the top-k0, no budget
    COVERAGE  keep the fewest top-scored experts that cover `coverage` of the union's score (at
           most the budget)
    REASSIGN  backfill | drop | similar (each dropped pair moves to the kept expert most similar
           to it, sim_EE)
The reassignment (pass 2) ranks a token's candidates (kept originals first, then kept others by
probability) in one of two forms, chosen by the budget: up to KEPT_LIST_MAX kept experts the
candidates are the kept list and their places are counted pairwise (a (TB, M, M) comparison, no
serial loop); above, and unbounded, the candidates are all E experts, picked by K rounds of
argmax. Both give the same routing bit for bit (tests/test_route_kernel.py). When the union cannot
exceed the budget (`union_fits`) pass 2 runs only for inactive tokens.
Semantics match the references exactly except where they leave the order unspecified: ties in
score go to the lower expert id (as `select_top_m`); ties in router probability (top-k, backfill,
anchors) go to the lower expert id / slot.

No host synchronisation; all output shapes depend on (T, K, E, M) only: safe in a CUDA graph.
The arrival counter of the GEMV form is allocated by the caller once (`arrival_counter`) and
returns to 0 after every launch, so a captured launch can be replayed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels._triton import dual_jit, empty, next_pow2
from kernels.terms import (
    TERMS as KINDS,  # the per-pair score terms, by name (a selector's kernel_term)
)
from kernels.tuned import nearest_entry

REASSIGN_MODES = ("backfill", "drop", "similar")
# Backfill over the kept list (pairwise places, (TB, M, M) in registers) up to this budget; above
# it (and unbounded) K rounds of argmax over all E experts.
KEPT_LIST_MAX = 32
TIERS = {"none": 0, "anchor": 1, "top1_union": 2, "oea": 3}


@dual_jit
def _route_select_kernel(
    # Pointers: the router GEMV (GEMV)
    x_ptr,  # (T, H) router input
    wr_ptr,  # (C, H) router rows, then predictor rows (C = 2E with HAS_G)
    ws_ptr,  # (T, C) fp32 workspace: the GEMV's outputs, rounded to the weight dtype
    arrive_ptr,  # (1,) int32 arrival counter, 0 between launches
    # Pointers: routing (read; written with ROUTE)
    logits_ptr,  # (T, E) router logits (ROUTE without GEMV)
    lbias_ptr,  # (E,) logit bias (HAS_LBIAS: a skewed router, base/hf/skew.py)
    probs_ptr,  # (T, E) fp32
    idx_ptr,  # (T, K) int
    w_ptr,  # (T, K) model dtype
    active_ptr,  # (T,) bool
    # Pointers: score inputs
    score_ptr,  # (E,) fp32; read (static score), or written
    g_ptr,  # (T, E) z @ W_HE (KIND base), stride_gt
    bias_ptr,  # (E,) predictor bias (KIND base)
    energy_ptr,  # (E,) calibration energy (KIND calib_energy)
    sim_ptr,  # (E, E) expert similarity (REASSIGN similar)
    # Pointers: outputs
    keep_e_ptr,  # (E,) bool
    keep_m_ptr,  # (M_OUT,) int64
    new_idx_ptr,  # (T, K), dtype of idx
    new_w_ptr,  # (T, K), dtype of w
    part_ptr,  # (n_tiles, 5, E_BLOCK) fp32: each tile's partial sums (PHASE 1 writes, PHASE 2 reads)
    # Dimensions
    T,
    E,
    H,
    C,
    M,  # kept experts at most (the budget; E when unbounded)
    M_OUT,  # length of keep_m
    K0,  # anchors per token (TIER anchor / top1_union / oea)
    route_scale,  # ROUTE: factor on the top-k weights (DeepSeek's routed_scaling_factor)
    coverage,  # COVERAGE: the share of the union's score to keep
    n_tiles,  # PHASE 2: tiles of PHASE 1 (cdiv(T, TB))
    # Strides (the last dimension of every 2-D tensor is contiguous)
    stride_xt,
    stride_wc,
    stride_lt,
    stride_pt,
    stride_it,
    stride_wt,
    stride_gt,
    stride_se,
    stride_nit,
    stride_nwt,
    # Meta-parameters
    K: tl.constexpr,
    K_BLOCK: tl.constexpr,
    E_BLOCK: tl.constexpr,
    TB: tl.constexpr,  # tokens per step of the routing/score and reassignment loops
    GEMV: tl.constexpr,
    CB: tl.constexpr,  # GEMV output columns per program
    BK: tl.constexpr,  # GEMV reduction step
    TBG: tl.constexpr,  # GEMV tokens per tile
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 weights (no silent tf32), else "tf32" (unused)
    ROUTE: tl.constexpr,  # also route: probs = softmax(logits), top-K, renormalise (NORM), scale
    NORM: tl.constexpr,
    HAS_LBIAS: tl.constexpr,
    SCORE_IN_KERNEL: tl.constexpr,
    KIND: tl.constexpr,
    TIER: tl.constexpr,
    COVERAGE: tl.constexpr,
    REASSIGN: tl.constexpr,  # 0 backfill, 1 drop, 2 similar
    RENORMALIZE: tl.constexpr,
    SELECT: tl.constexpr,  # False: nothing can be dropped (the union fits); tokens keep their routing
    M_BLOCK: tl.constexpr,  # next_pow2(M_OUT)
    KEPT_LIST: tl.constexpr,  # pass 2's candidates: the kept list (M_BLOCK <= KEPT_LIST_MAX), else all E
    PHASE: tl.constexpr = 0,  # 0: one program does it all | 1: pass 1 of tile pid | 2: the rest for tile pid
):
    """Grid (cdiv(C, CB),) with GEMV, (cdiv(T, TB),) with PHASE 1 or 2, else (1,). See the module doc."""
    # ---------------------------------------------------------------- the router GEMV (GEMV)
    if GEMV:
        offs_c = tl.program_id(0) * CB + tl.arange(0, CB)
        c_ok = offs_c < C
        for t0 in range(0, T, TBG):
            offs_tg = t0 + tl.arange(0, TBG)
            tg_ok = offs_tg < T
            acc_TC = tl.zeros((TBG, CB), dtype=tl.float32)
            for h0 in range(0, H, BK):
                offs_h = h0 + tl.arange(0, BK)
                h_ok = offs_h < H
                x_TH = tl.load(x_ptr + offs_tg[:, None] * stride_xt + offs_h[None, :],
                               mask=tg_ok[:, None] & h_ok[None, :], other=0.0)
                if CB >= 16:  # matrix units
                    w_HC = tl.load(wr_ptr + offs_c[None, :] * stride_wc + offs_h[:, None],
                                   mask=h_ok[:, None] & c_ok[None, :], other=0.0)
                    acc_TC = tl.dot(x_TH, w_HC, acc_TC, input_precision=DOT_PRECISION)
                else:  # a few columns per program, so many programs stream the weights: fp32 FMA
                    w_CH = tl.load(wr_ptr + offs_c[:, None] * stride_wc + offs_h[None, :],
                                   mask=c_ok[:, None] & h_ok[None, :], other=0.0)
                    acc_TC += tl.sum(x_TH.to(tl.float32)[:, None, :] * w_CH.to(tl.float32)[None, :, :], axis=2)
            acc_TC = acc_TC.to(wr_ptr.dtype.element_ty).to(tl.float32)  # as F.linear rounds its output
            tl.store(ws_ptr + offs_tg[:, None] * C + offs_c[None, :], acc_TC, mask=tg_ok[:, None] & c_ok[None, :])
        tl.debug_barrier()  # every thread's stores precede the release below
        arrived = tl.atomic_add(arrive_ptr, 1, sem="acq_rel", scope="gpu")
        last = arrived == tl.num_programs(0) - 1
    else:
        last = True
    if last:
        offs_e = tl.arange(0, E_BLOCK)
        e_ok = offs_e < E
        offs_k = tl.arange(0, K_BLOCK)
        k_ok = offs_k < K

        # --- pass 1 over the tokens: with ROUTE, the router's softmax and top-k (kept in
        # registers and written out); then the union, anchors and score, in registers ---
        cnt_E = tl.zeros((E_BLOCK,), dtype=tl.float32)
        acc_E = tl.zeros((E_BLOCK,), dtype=tl.float32)  # score, or router_sum for COUNT
        anchor_E = tl.zeros((E_BLOCK,), dtype=tl.float32)  # active anchor pairs per expert
        first_w_E = tl.zeros((E_BLOCK,), dtype=tl.float32)  # TIER top1_union: first-choice weight
        if KIND == 4:
            b_E = tl.load(bias_ptr + offs_e, mask=e_ok, other=0.0).to(tl.float32)
        if KIND == 3:
            energy_E = tl.load(energy_ptr + offs_e, mask=e_ok, other=0.0).to(tl.float32)
        if HAS_LBIAS:
            lb_E = tl.load(lbias_ptr + offs_e, mask=e_ok, other=0.0)
        n_idle = 0  # inactive tokens: reassign moves their pairs onto kept experts, so they need pass 2
        # the tokens this program routes and scores: all (PHASE 0), its tile (1), none (2: the partials)
        pid = tl.program_id(0)
        first = (offs_e * 0 + pid == 0) if PHASE == 2 else (offs_e >= 0)  # which programs write the kept set
        p_lo = pid * TB if PHASE != 0 else 0
        p_hi = tl.minimum(T, p_lo + TB) if PHASE == 1 else (T if PHASE == 0 else p_lo)
        for t0 in range(p_lo, p_hi, TB):
            offs_t = t0 + tl.arange(0, TB)
            t_ok = offs_t < T
            te_ok = t_ok[:, None] & e_ok[None, :]
            tk_ok = t_ok[:, None] & k_ok[None, :]
            act_T = tl.load(active_ptr + offs_t, mask=t_ok, other=0) != 0
            if not SELECT:
                n_idle += tl.sum((t_ok & ~act_T).to(tl.int32), axis=0)
            if SCORE_IN_KERNEL and KIND == 4:
                # the whole tile, issued first so its latency overlaps the routing
                g_TE = tl.load(g_ptr + offs_t[:, None] * stride_gt + offs_e[None, :], mask=te_ok, other=0.0,
                               cache_modifier=".cg").to(tl.float32)
            if ROUTE:
                lg_TE = tl.load(logits_ptr + offs_t[:, None] * stride_lt + offs_e[None, :], mask=te_ok,
                                other=float("-inf"), cache_modifier=".cg")
                if HAS_LBIAS:  # the skewed router adds its bias in the weight dtype
                    lg_TE = (lg_TE.to(lb_E.dtype) + lb_E[None, :]).to(lb_E.dtype)
                lg_TE = tl.where(te_ok, lg_TE.to(tl.float32), float("-inf"))
                mx_T = tl.where(t_ok, tl.max(lg_TE, axis=1), 0.0)
                ex_TE = tl.exp(lg_TE - mx_T[:, None])
                den_T = tl.where(t_ok, tl.sum(ex_TE, axis=1), 1.0)  # rows past T: no 0/0
                p_TE = ex_TE / den_T[:, None]
                tl.store(probs_ptr + offs_t[:, None] * stride_pt + offs_e[None, :], p_TE, mask=te_ok)
                r_TE = tl.where(e_ok[None, :], p_TE, -1.0)
                idx_TK = tl.zeros((TB, K_BLOCK), dtype=tl.int32)
                p_TK = tl.zeros((TB, K_BLOCK), dtype=tl.float32)
                slot_TE = tl.full((TB, E_BLOCK), -1, tl.int32)  # the slot that chose (t, e), -1: none
                for k in tl.static_range(K):  # top-K, ties to the lower id
                    v_T, j_T = tl.max(r_TE, axis=1, return_indices=True, return_indices_tie_break_left=True)
                    idx_TK = tl.where(offs_k[None, :] == k, j_T[:, None], idx_TK)
                    p_TK = tl.where(offs_k[None, :] == k, v_T[:, None], p_TK)
                    pick_TE = offs_e[None, :] == j_T[:, None]
                    r_TE = tl.where(pick_TE, -2.0, r_TE)
                    slot_TE = tl.where(pick_TE, k, slot_TE)
                w_TK = p_TK
                w_TE = p_TE  # each chosen (t, e)'s weight, as w_TK's slot holds it (the same operations)
                if NORM:
                    den_T = tl.sum(tl.where(k_ok[None, :], w_TK, 0.0), axis=1)
                    w_TK = w_TK / den_T[:, None]
                    w_TE = w_TE / den_T[:, None]
                w_TK = (w_TK * route_scale).to(w_ptr.dtype.element_ty)  # the weights as stored
                w_TE = (w_TE * route_scale).to(w_ptr.dtype.element_ty).to(tl.float32)
                tl.store(idx_ptr + offs_t[:, None] * stride_it + offs_k[None, :], idx_TK, mask=tk_ok)
                tl.store(w_ptr + offs_t[:, None] * stride_wt + offs_k[None, :], w_TK, mask=tk_ok)
                if not SELECT:
                    tl.store(new_w_ptr + offs_t[:, None] * stride_nwt + offs_k[None, :], w_TK, mask=tk_ok)
                w_TK = w_TK.to(tl.float32)
            else:
                idx_TK = tl.load(idx_ptr + offs_t[:, None] * stride_it + offs_k[None, :], mask=tk_ok, other=-1)
                w_TK = tl.load(w_ptr + offs_t[:, None] * stride_wt + offs_k[None, :], mask=tk_ok, other=0.0)
                if not SELECT:
                    tl.store(new_w_ptr + offs_t[:, None] * stride_nwt + offs_k[None, :], w_TK, mask=tk_ok)
                w_TK = w_TK.to(tl.float32)
                if TIER != 0:  # the probabilities of the routed pairs rank a token's choices
                    p_TK = tl.load(probs_ptr + offs_t[:, None] * stride_pt + tl.where(tk_ok, idx_TK, 0),
                                   mask=tk_ok, other=-1.0)
            if not SELECT:  # the routing is the decision: written here, no pass 2
                tl.store(new_idx_ptr + offs_t[:, None] * stride_nit + offs_k[None, :],
                         idx_TK.to(new_idx_ptr.dtype.element_ty), mask=tk_ok)
            hits_TE = tl.zeros((TB, E_BLOCK), dtype=tl.float32)
            wsum_TE = tl.zeros((TB, E_BLOCK), dtype=tl.float32)
            wsq_TE = tl.zeros((TB, E_BLOCK), dtype=tl.float32)
            anch_TE = tl.zeros((TB, E_BLOCK), dtype=tl.float32)
            first_TE = tl.zeros((TB, E_BLOCK), dtype=tl.float32)
            if ROUTE:  # the top-k's own (t, e) marks: no slot extracted from the (t, k) tiles (a layout
                # change through shared memory each, K of them), the same sums bit for bit (one slot a pair)
                hit_TE = (slot_TE >= 0) & act_T[:, None]
                hits_TE = hit_TE.to(tl.float32)
                wsum_TE = tl.where(hit_TE, w_TE, 0.0)
                wsq_TE = tl.where(hit_TE, w_TE * w_TE, 0.0)
                if TIER != 0:  # the kernel's own top-k is in probability order: slot k has rank k
                    anch_TE = (hit_TE & (slot_TE < K0)).to(tl.float32)
                    first_TE = tl.where(hit_TE & (slot_TE == 0), w_TE, 0.0)
            for k in tl.static_range(0 if ROUTE else K):
                sel_k = offs_k[None, :] == k
                i_T = tl.sum(tl.where(sel_k, idx_TK, 0), axis=1)
                w_T = tl.sum(tl.where(sel_k, w_TK, 0.0), axis=1)
                hit = (i_T[:, None] == offs_e[None, :]) & act_T[:, None]
                hits_TE += hit.to(tl.float32)
                wsum_TE += tl.where(hit, w_T[:, None], 0.0)
                wsq_TE += tl.where(hit, (w_T * w_T)[:, None], 0.0)
                if TIER != 0:  # rank of slot k among the token's K choices by probability (ties: lower slot)
                    pk_T = tl.sum(tl.where(sel_k, p_TK, 0.0), axis=1)
                    ahead_TK = (p_TK > pk_T[:, None]) | ((p_TK == pk_T[:, None]) & (offs_k[None, :] < k))
                    rank_T = tl.sum((ahead_TK & k_ok[None, :]).to(tl.int32), axis=1)
                    anch_TE += (hit & (rank_T < K0)[:, None]).to(tl.float32)
                    first_TE += tl.where(hit & (rank_T == 0)[:, None], w_T[:, None], 0.0)
            cnt_E += tl.sum(hits_TE, axis=0)
            anchor_E += tl.sum(anch_TE, axis=0)
            first_w_E += tl.sum(first_TE, axis=0)
            if SCORE_IN_KERNEL:
                if KIND == 1:
                    term_TE = wsq_TE
                elif KIND == 3:
                    term_TE = wsq_TE * energy_E[None, :]
                elif KIND == 4:
                    routed = hits_TE > 0
                    term_TE = tl.where(routed, wsq_TE * tl.exp(2.0 * tl.where(routed, g_TE + b_E[None, :], 0.0)), 0.0)
                else:  # router_sum, and count's tie-breaker
                    term_TE = wsum_TE
                acc_E += tl.sum(term_TE, axis=0)
        if PHASE == 1:  # this tile's partial sums, for the program that finishes the selection
            part = part_ptr + pid * 5 * E_BLOCK
            tl.store(part + offs_e, cnt_E)
            tl.store(part + E_BLOCK + offs_e, acc_E)
            tl.store(part + 2 * E_BLOCK + offs_e, anchor_E)
            tl.store(part + 3 * E_BLOCK + offs_e, first_w_E)
            tl.store(part + 4 * E_BLOCK + offs_e, tl.where(offs_e == 0, n_idle, 0).to(tl.float32))
        if PHASE != 1:  # the kept set (PHASE 2: every program the same, its first writes it) and pass 2
            if PHASE == 2:  # every tile's partials, added in tile order: the sums one program makes
                for j in range(n_tiles):
                    part = part_ptr + j * 5 * E_BLOCK
                    cnt_E += tl.load(part + offs_e)
                    acc_E += tl.load(part + E_BLOCK + offs_e)
                    anchor_E += tl.load(part + 2 * E_BLOCK + offs_e)
                    first_w_E += tl.load(part + 3 * E_BLOCK + offs_e)
                    n_idle += tl.sum(tl.load(part + 4 * E_BLOCK + offs_e), axis=0).to(tl.int32)
            if ROUTE:
                tl.debug_barrier()  # the routing this CTA wrote is visible to its reassignment below
            union_E = cnt_E > 0
            if SCORE_IN_KERNEL:
                if KIND == 2:
                    # as base/selectors.Count: one more token outranks any router_sum difference
                    score_E = cnt_E * (tl.sum(acc_E, axis=0) + 1.0) + acc_E
                else:
                    score_E = acc_E
                if TIER == 2:  # Top1Union.score: first choices above every router_sum (KIND router_sum)
                    score_E = tl.where(anchor_E > 0, tl.sum(acc_E, axis=0) + 1.0 + first_w_E, acc_E)
                tl.store(score_ptr + offs_e, score_E, mask=e_ok & first)
            else:
                score_E = tl.load(score_ptr + offs_e, mask=e_ok, other=0.0).to(tl.float32)

            # --- the kept set: rank = candidates ahead (higher score, or equal and lower id) ---
            rank_score_E = score_E
            if TIER == 1:  # Anchored.keep: every anchor outranks every other expert
                rank_score_E = tl.where(anchor_E > 0, score_E + tl.sum(tl.where(e_ok, score_E, 0.0), axis=0) + 1.0,
                                        score_E)
            if TIER == 3:  # oea: the anchors, all of them
                cand_E = (anchor_E > 0) & e_ok
            else:
                cand_E = union_E
            s_E = tl.where(cand_E, rank_score_E, float("-inf"))
            s_U = s_E[:, None]  # the ranked expert u along axis 0, every other expert v along axis 1
            s_V = s_E[None, :]
            ahead_UV = (s_V > s_U) | ((s_V == s_U) & (offs_e[None, :] < offs_e[:, None]))
            rank_E = tl.sum((ahead_UV & cand_E[None, :]).to(tl.int32), axis=1)
            m = M
            if COVERAGE:  # selectors.coverage_count: the top-ranked prefix reaching the share
                sc_E = tl.where(union_E, tl.maximum(score_E, 0.0), 0.0)
                upto_UV = (rank_E[None, :] <= rank_E[:, None]) & union_E[None, :]
                cum_E = tl.sum(tl.where(upto_UV, sc_E[None, :], 0.0), axis=1)
                thr = coverage * tl.sum(sc_E, axis=0) * (1 - 1e-6)
                m = tl.sum((union_E & (cum_E < thr)).to(tl.int32), axis=0) + 1
                m = tl.minimum(m, tl.maximum(tl.sum(union_E.to(tl.int32), axis=0), 1))
                m = tl.minimum(m, M)
            keep_E = cand_E & (rank_E < m)
            n_keep = tl.sum(keep_E.to(tl.int32), axis=0)
            # kept ids by rank (unique positions < n_keep), then -1 up to M_OUT: two disjoint stores
            tl.store(keep_m_ptr + rank_E, offs_e.to(tl.int64), mask=keep_E & first)
            for m0 in range(0, M_OUT, E_BLOCK):
                offs_m = m0 + offs_e
                tl.store(keep_m_ptr + offs_m, tl.full((E_BLOCK,), -1, tl.int64),
                         mask=(offs_m >= n_keep) & (offs_m < M_OUT) & first)
            tl.store(keep_e_ptr + offs_e, keep_E, mask=e_ok & first)
            # fallback target of a token left with no kept expert: the top-scored kept one (first on ties)
            best = tl.argmax(tl.where(keep_E, score_E, float("-inf")), axis=0, tie_break_left=True)
            if KEPT_LIST:  # the kept ids by rank, as a vector (the backfill's candidates)
                offs_km = tl.arange(0, M_BLOCK)
                kid_M = tl.sum(tl.where(keep_E[None, :] & (rank_E[None, :] == offs_km[:, None]), offs_e[None, :], 0), axis=1)
                kid_ok = offs_km < n_keep

            # --- pass 2: reassign the tokens (base.method.routing.reassign, branch-free) ---
            t_end = T
            if not SELECT:  # pass 1 wrote the routing as the decision; redone only for inactive tokens
                t_end = tl.where(n_idle > 0, T, 0)
            q_lo = pid * TB if PHASE == 2 else 0
            q_hi = tl.minimum(t_end, q_lo + TB) if PHASE == 2 else t_end
            for t0 in range(q_lo, q_hi, TB):
                offs_t = t0 + tl.arange(0, TB)
                t_ok = offs_t < T
                tk_ok = t_ok[:, None] & k_ok[None, :]
                idx_TK = tl.load(idx_ptr + offs_t[:, None] * stride_it + offs_k[None, :], mask=tk_ok, other=0)
                w_TK = tl.load(w_ptr + offs_t[:, None] * stride_wt + offs_k[None, :], mask=tk_ok, other=0.0)
                if REASSIGN == 2:
                    # similar: a dropped pair moves, with its weight, to the kept expert most like it
                    out_idx = idx_TK
                    for k in tl.static_range(K):
                        sel_k = offs_k[None, :] == k
                        i_T = tl.sum(tl.where(sel_k, idx_TK, 0), axis=1)
                        kept_T = tl.sum(((i_T[:, None] == offs_e[None, :]) & keep_E[None, :]).to(tl.int32), axis=1) > 0
                        sim_TE = tl.load(sim_ptr + i_T[:, None] * stride_se + offs_e[None, :],
                                         mask=t_ok[:, None] & e_ok[None, :], other=0.0).to(tl.float32)
                        sub_T = tl.argmax(tl.where(keep_E[None, :], sim_TE, float("-inf")), axis=1, tie_break_left=True)
                        out_idx = tl.where(sel_k & ~kept_T[:, None], sub_T[:, None].to(idx_TK.dtype), out_idx)
                    tl.store(new_idx_ptr + offs_t[:, None] * stride_nit + offs_k[None, :], out_idx, mask=tk_ok)
                    tl.store(new_w_ptr + offs_t[:, None] * stride_nwt + offs_k[None, :], w_TK, mask=tk_ok)
                else:
                    # a token's candidates: the kept list (budgets up to KEPT_LIST_MAX), else every expert
                    if KEPT_LIST:
                        cand_C, valid_C, kept_C = kid_M, kid_ok, kid_ok
                    else:
                        cand_C, valid_C, kept_C = offs_e, e_ok, keep_E
                    p_TC = tl.load(probs_ptr + offs_t[:, None] * stride_pt + cand_C[None, :],
                                   mask=t_ok[:, None] & valid_C[None, :], other=0.0)
                    # the probabilities of a token's own choices, in one gather (non-kept ones included)
                    pk_TK = tl.load(probs_ptr + offs_t[:, None] * stride_pt + tl.where(tk_ok, idx_TK, 0), mask=tk_ok,
                                    other=0.0)
                    # every (token, candidate, slot) at once: no per-slot extraction, whose vectors each
                    # needed a layout change (through shared memory) to meet the candidates
                    w32_TK = tl.where(tk_ok, w_TK.to(tl.float32), 0.0)
                    hit_TCK = ((idx_TK[:, None, :] == cand_C[None, :, None]) & valid_C[None, :, None]
                               & k_ok[None, None, :])
                    orig_TC = tl.sum(hit_TCK.to(tl.int32), axis=2) > 0
                    origw_TC = tl.sum(tl.where(hit_TCK, w32_TK[:, None, :], 0.0), axis=2)
                    kept_TK = tl.sum((hit_TCK & kept_C[None, :, None]).to(tl.int32), axis=1) > 0
                    lost_T = tl.sum((~kept_TK & k_ok[None, :]).to(tl.int32), axis=1) > 0
                    wsum_T = tl.sum(w32_TK, axis=1)
                    psum_T = tl.sum(tl.where(tk_ok, pk_TK, 0.0), axis=1)
                    # kept originals first (probs + 2 > any prob), then kept others by probability, then none
                    rank_TC = tl.where(orig_TC & kept_C[None, :], p_TC + 2.0, -1.0)
                    if REASSIGN == 0:
                        rank_TC = tl.where(~orig_TC & kept_C[None, :], p_TC, rank_TC)
                    rank_TC = tl.where(valid_C[None, :], rank_TC, -3.0)
                    scale_T = wsum_T / tl.maximum(psum_T, 1e-30)
                    # rank >= 2 marks a kept original (its own weight); else rank is the probability
                    nw_TC = tl.where(rank_TC >= 1.5, origw_TC, rank_TC * scale_T[:, None])
                    if KEPT_LIST:
                        # place of candidate c = candidates ahead of it (higher rank, or equal and a lower
                        # id): the K picks at once, no serial argmax
                        r_TCN = rank_TC[:, None, :]
                        r_TNC = rank_TC[:, :, None]
                        ahead = (r_TCN > r_TNC) | ((r_TCN == r_TNC) & (cand_C[None, None, :] < cand_C[None, :, None]))
                        place_TC = tl.sum(ahead.to(tl.int32), axis=2)
                        # slot k takes the candidate in place k, if it exists and ranks >= 0
                        at_TCK = ((place_TC[:, :, None] == offs_k[None, None, :]) & (rank_TC >= 0)[:, :, None]
                                  & k_ok[None, None, :])
                        filled_TK = tl.sum(at_TCK.to(tl.int32), axis=1) > 0
                        nidx_TK = tl.sum(tl.where(at_TCK, cand_C[None, :, None], 0), axis=1)
                        nw_TK = tl.sum(tl.where(at_TCK, nw_TC[:, :, None], 0.0), axis=1)
                        first_ok_T = tl.sum((filled_TK & (offs_k[None, :] == 0)).to(tl.int32), axis=1) > 0
                        first_T = tl.where(first_ok_T, tl.sum(tl.where(offs_k[None, :] == 0, nidx_TK, 0), axis=1), best)
                    else:
                        nidx_TK = tl.zeros((TB, K_BLOCK), dtype=tl.int32)
                        nw_TK = tl.zeros((TB, K_BLOCK), dtype=tl.float32)
                        filled_TK = tl.zeros((TB, K_BLOCK), dtype=tl.int1)
                        first_T = tl.zeros((TB,), dtype=tl.int32)
                        for k in tl.static_range(K):  # K rounds of argmax = topk(K), ties to the lower id
                            v_T, j_T = tl.max(rank_TC, axis=1, return_indices=True, return_indices_tie_break_left=True)
                            pick_TC = offs_e[None, :] == j_T[:, None]
                            filled_T = v_T >= 0
                            nw_T = tl.where(filled_T, tl.sum(tl.where(pick_TC, nw_TC, 0.0), axis=1), 0.0)
                            slot = offs_k[None, :] == k
                            nidx_TK = tl.where(slot, j_T[:, None], nidx_TK)
                            nw_TK = tl.where(slot, nw_T[:, None], nw_TK)
                            filled_TK = tl.where(slot, filled_T[:, None], filled_TK)
                            rank_TC = tl.where(pick_TC, -4.0, rank_TC)
                            if k == 0:
                                first_T = tl.where(filled_T, j_T, best)
                    if RENORMALIZE:
                        total_T = tl.maximum(tl.sum(nw_TK, axis=1), 1e-30)
                        nw_TK = nw_TK * (wsum_T / total_T)[:, None]
                    # empty slots point at a kept expert with weight 0 (no sentinel ids), as reassign does
                    nidx_TK = tl.where(filled_TK, nidx_TK, first_T[:, None])
                    out_idx = tl.where(lost_T[:, None], nidx_TK.to(idx_TK.dtype), idx_TK)
                    out_w = tl.where(lost_T[:, None], nw_TK.to(w_TK.dtype), w_TK)
                    tl.store(new_idx_ptr + offs_t[:, None] * stride_nit + offs_k[None, :], out_idx, mask=tk_ok)
                    tl.store(new_w_ptr + offs_t[:, None] * stride_nwt + offs_k[None, :], out_w, mask=tk_ok)
        if GEMV:
            tl.atomic_xchg(arrive_ptr, 0)  # ready for the next launch (or graph replay)


@dataclass
class Selection:
    """Fixed-shape result of one layer's selection step."""

    keep_M: Tensor  # (M,) int64 kept ids by rank, -1 past the kept count
    keep_E: Tensor  # (E,) bool
    # (E,) fp32, the kind's score; top1_union's tiers on it only where the selection runs (when the
    # union fits, `union_fits`, the rule's tier is skipped: the score and keep_M's order are the kind's)
    score_E: Tensor
    topk_idx_TK: Tensor  # rerouted experts; empty slots point at a kept expert with weight 0
    topk_w_TK: Tensor


@dataclass
class Routing:
    """The model's own routing, as the kernel computed it (for statistics and reference)."""

    probs_TE: Tensor  # fp32 softmax of the logits
    topk_idx_TK: Tensor  # int64
    topk_w_TK: Tensor  # top-k probabilities, renormalised if norm_topk, times scale, in w_dtype


@dataclass(frozen=True)
class Rule:
    """How the kernel keeps experts, beyond the score term (see the module doc)."""

    tier: str = "none"  # none | anchor | top1_union | oea
    k0: int = 1  # anchors per token (tiers other than none)
    coverage: float | None = None
    reassign_mode: str = "backfill"
    renormalize: bool = True


@dataclass(frozen=True)
class SelectLaunch:
    """How the kernel's one program runs (the GEMV form's other programs excepted): its warps,
    and TB, the tokens per step of its loops. Tuned per GPU (kernels/configs/<gpu>.json,
    "select:E=<E_BLOCK>,T=<T>" and, for launches with nothing to drop, "route:E=<E_BLOCK>,T=<T>",
    by tools/tune_step_kernels.py): the program is latency-bound, so
    fewer warps (reductions within a warp) can beat more. `split`: above one tile of tokens,
    two launches of one program per tile instead (PHASE 1: each tile's routing and partial
    scores; PHASE 2: every program sums the partials in tile order, ranks, and reassigns its own
    tile; the first one writes the kept set): the same outputs bit for bit, the per-token work
    spread over cdiv(T, tokens_per_tile) programs (the GEMV form never splits)."""

    num_warps: int = 8
    tokens_per_tile: int = 16
    split: bool = False

    def __post_init__(self) -> None:
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps}")
        if self.tokens_per_tile not in (1, 2, 4, 8, 16, 32, 64):
            raise ValueError(f"tokens_per_tile must be a power of two in [1, 64], got {self.tokens_per_tile}")


def select_launch(E: int, T: int, device: torch.device, selects: bool = True) -> SelectLaunch:
    """The tuned launch for E experts and T tokens on this device, else the built-in default
    (8 warps above 64 experts, 4 up to 64; 16 tokens per tile). `selects`: whether the launch may
    drop experts (not `union_fits`). A launch with nothing to drop (dense's route, a budget the
    union fits) only routes: its best form can differ (at 16 tokens on an H100 the split form that
    won for `base` made dense's launch two, 0.391 -> 0.445 ms a step: results/roofline/
    branches_2026-12-06g/), so it reads "route:E=<E_BLOCK>,T=<T>" where tuned, else the
    selecting launch's entry. Of a table tuned at other token counts for one launch than the other,
    the entry timed nearest T serves (the route entry where both are as near): a "select:" entry at
    64 tokens, not a "route:" one at 16, serves dense at 64."""
    E_BLOCK = next_pow2(E, 16)
    away, entry = nearest_entry(f"select:E={E_BLOCK}", device, T)
    if not selects:
        route_away, route = nearest_entry(f"route:E={E_BLOCK}", device, T)
        if route and route_away <= away:
            entry = route
    return SelectLaunch(num_warps=entry.get("num_warps", 4 if E_BLOCK <= 64 else 8),
                        tokens_per_tile=entry.get("TB", 16), split=bool(entry.get("split", False)))


def union_fits(rule: Rule, budget: int | None, T: int, K: int, E: int) -> bool:
    """Whether the rule must keep every routed expert: its kept set is the union whenever the union
    fits in the budget, and T tokens' K choices (at most E experts) always fit. The kernel then
    skips the reassignment (every token keeps its routing) and the rule's tier (it would only
    order the kept list), so a step of 1 token, or of 2 at budget 16 and top-8, costs what dense
    costs. Not `oea` (it keeps only the anchors' union) nor a
    coverage rule (it keeps the fewest that cover the share)."""
    if rule.tier == "oea" or rule.coverage is not None:
        return False
    return budget is None or min(T * K, E) <= budget


def arrival_counter(device: torch.device) -> Tensor:
    """The GEMV form's counter: allocate once per layer (outside any graph capture)."""
    return torch.zeros(1, dtype=torch.int32, device=device)


def _check(kind: str, rule: Rule, budget: int | None, E: int, sim_EE: Tensor | None) -> None:
    if rule.reassign_mode not in REASSIGN_MODES:
        raise ValueError(f"reassign must be one of {REASSIGN_MODES}, got {rule.reassign_mode!r}")
    if rule.reassign_mode == "similar" and sim_EE is None:
        raise ValueError("reassign 'similar' needs the expert similarity (sim_EE)")
    if kind not in KINDS:
        raise ValueError(f"unknown selector kind {kind!r}; valid: {', '.join(KINDS)}")
    if rule.tier not in TIERS:
        raise ValueError(f"unknown tier {rule.tier!r}; valid: {', '.join(TIERS)}")
    if rule.tier == "top1_union" and kind != "router_sum":
        raise ValueError("tier 'top1_union' ranks by router_sum (kind='router_sum')")
    if rule.tier != "none" and rule.k0 < 1:
        raise ValueError(f"k0 must be >= 1, got {rule.k0}")
    if rule.coverage is not None and not 0 < rule.coverage <= 1:
        raise ValueError(f"coverage must be in (0, 1], got {rule.coverage}")
    if rule.coverage is not None and rule.tier != "none":
        raise ValueError(f"coverage ranks by the plain score; tier {rule.tier!r} has none")
    if budget is not None and budget < 1:
        raise ValueError(f"budget must be >= 1 or None, got {budget}")


def _launch(*, T: int, K: int, E: int, budget: int | None, kind: str, rule: Rule, probs_TE: Tensor, idx_TK: Tensor,
            w_TK: Tensor, active_T: Tensor, score_E: Tensor | None, g_TE: Tensor | None, g_stride: int,
            pred_b_E: Tensor | None, energy_E: Tensor | None, sim_EE: Tensor | None, route: bool,
            norm: bool = False, route_scale: float = 1.0, logits_TE: Tensor | None = None,
            logit_bias_E: Tensor | None = None, gemv: tuple | None = None,
            launch: SelectLaunch | None = None) -> Selection:
    dev = probs_TE.device
    select = not union_fits(rule, budget, T, K, E)
    launch = launch or select_launch(E, T, dev, select)
    in_kernel = score_E is None
    if in_kernel and kind == "base" and (g_TE is None or pred_b_E is None):
        raise ValueError("kind 'base' computed in the kernel needs g_TE and pred_b_E")
    if in_kernel and kind == "calib_energy" and energy_E is None:
        raise ValueError("kind 'calib_energy' needs energy_E")
    if rule.tier == "oea":  # no budget, but the anchors' union has at most T * k0 experts
        M = min(E, T * int(rule.k0))
    else:
        M = E if budget is None else min(int(budget), E)
    score_out = empty(E, device=dev, dtype=torch.float32) if in_kernel else score_E.float().contiguous()
    keep_E = empty(E, device=dev, dtype=torch.bool)
    keep_M = empty(M, device=dev, dtype=torch.int64)
    new_idx = empty(T, K, device=dev, dtype=idx_TK.dtype)
    new_w = empty(T, K, device=dev, dtype=w_TK.dtype)
    dummy = score_out
    E_BLOCK = next_pow2(E, 16)
    if gemv is not None:
        x_TH, weight_CH, ws_TC, counter = gemv
        C, H = weight_CH.shape
        # 16 columns per program on the matrix units. (4 columns on FMA units, 32-64 programs,
        # measured slower on an H200 at 1-16 tokens: 34-37 against 19 us per layer;
        # benchmarks/kernels/v3/NVIDIA_H200.json against run1_bench.log.)
        CB = 16
        grid = (triton.cdiv(C, CB),)
        gemv_args = (x_TH, weight_CH, ws_TC, counter)
        fp32 = weight_CH.dtype == torch.float32
        BK = 128 if H >= 128 else next_pow2(H, 16)
        gemv_meta = dict(CB=CB, BK=BK, TBG=min(next_pow2(T, 16), 64), DOT_PRECISION="ieee" if fp32 else "tf32")  # noqa: C408
        sx, sw = x_TH.stride(0), weight_CH.stride(0)
    else:
        C = H = 0
        grid = (1,)
        gemv_args = (dummy, dummy, dummy, dummy)
        gemv_meta = dict(CB=16, BK=16, TBG=16, DOT_PRECISION="tf32")  # noqa: C408
        sx = sw = 0
    TB = launch.tokens_per_tile
    n_tiles = triton.cdiv(T, TB)
    phases = (1, 2) if gemv is None and n_tiles > 1 and launch.split else (0,)  # else one program
    part = empty(n_tiles * 5 * E_BLOCK, device=dev, dtype=torch.float32) if phases != (0,) else dummy
    # With nothing to drop a tier changes only the order of the kept list, not the kept set or the
    # routing: the launch then skips the tier's pass-1 work, as dense's launch does (a step of one
    # token under `top1_union` or an anchored rule timed 0.4-0.8 % slower than dense with it).
    tier = TIERS[rule.tier] if select else TIERS["none"]
    for phase in phases:
        _route_select_kernel.on(dev)[grid if phase == 0 else (n_tiles,)](
            *_args(gemv_args, logits_TE, logit_bias_E, probs_TE, idx_TK, w_TK, active_T, score_out, g_TE,
                   pred_b_E, energy_E, sim_EE, keep_E, keep_M, new_idx, new_w, part, dummy),
            T, E, H, C, M, M, int(rule.k0), float(route_scale), float(rule.coverage or 1.0), n_tiles,
            sx, sw, logits_TE.stride(0) if logits_TE is not None else 0, probs_TE.stride(0), idx_TK.stride(0),
            w_TK.stride(0), g_stride, sim_EE.stride(0) if sim_EE is not None else 0, new_idx.stride(0),
            new_w.stride(0),
            K=K, K_BLOCK=next_pow2(K), E_BLOCK=E_BLOCK, TB=TB, GEMV=gemv is not None, **gemv_meta,
            ROUTE=route, NORM=bool(norm), HAS_LBIAS=logit_bias_E is not None,
            SCORE_IN_KERNEL=in_kernel, KIND=KINDS[kind], TIER=tier, COVERAGE=rule.coverage is not None,
            REASSIGN=REASSIGN_MODES.index(rule.reassign_mode), RENORMALIZE=bool(rule.renormalize),
            SELECT=select, M_BLOCK=next_pow2(M),
            KEPT_LIST=next_pow2(M) <= KEPT_LIST_MAX, PHASE=phase, num_warps=launch.num_warps,
        )  # fmt: skip
    return Selection(keep_M, keep_E, score_out, new_idx, new_w)


def _args(gemv_args: tuple, logits_TE, logit_bias_E, probs_TE, idx_TK, w_TK, active_T, score_out, g_TE, pred_b_E,
          energy_E, sim_EE, keep_E, keep_M, new_idx, new_w, part, dummy) -> tuple:
    """The kernel's pointer arguments in order, `dummy` for the absent ones."""
    opt = lambda t: t if t is not None else dummy
    return (*gemv_args, opt(logits_TE), opt(logit_bias_E), probs_TE, idx_TK, w_TK, active_T, score_out, opt(g_TE),
            opt(pred_b_E), opt(energy_E), opt(sim_EE), keep_E, keep_M, new_idx, new_w, part)


def select_reassign(
    probs_TE: Tensor,
    topk_idx_TK: Tensor,
    topk_w_TK: Tensor,
    active_T: Tensor,
    budget: int | None,
    score_E: Tensor | None = None,
    *,
    kind: str = "router_sum",
    g_TE: Tensor | None = None,
    pred_b_E: Tensor | None = None,
    energy_E: Tensor | None = None,
    sim_EE: Tensor | None = None,
    reassign_mode: str = "backfill",
    renormalize: bool = True,
    rule: Rule | None = None,
    launch: SelectLaunch | None = None,
) -> Selection:
    """Keep the `budget` union experts with the largest score_E and reroute every token to them
    (after the model's own router).

    With score_E None the kernel computes it for `kind` (see KINDS): `base` then needs g_TE
    (z @ W_HE for all experts, e.g. from `kernels.score.fused_router_logits`) and pred_b_E;
    `calib_energy` needs energy_E. budget None keeps the whole union. `rule` (tiers, coverage)
    overrides reassign_mode / renormalize when given.
    """
    rule = rule or Rule(reassign_mode=reassign_mode, renormalize=renormalize)
    T, K = topk_idx_TK.shape
    E = probs_TE.shape[-1]
    _check(kind, rule, budget, E, sim_EE)
    if g_TE is not None and g_TE.stride(-1) != 1:
        g_TE = g_TE.contiguous()
    return _launch(T=T, K=K, E=E, budget=budget, kind=kind, rule=rule, probs_TE=probs_TE.float().contiguous(),
                   idx_TK=topk_idx_TK.contiguous(), w_TK=topk_w_TK.contiguous(), active_T=active_T, score_E=score_E,
                   g_TE=g_TE, g_stride=g_TE.stride(0) if g_TE is not None else 0, pred_b_E=pred_b_E,
                   energy_E=energy_E, sim_EE=sim_EE, route=False, launch=launch)  # fmt: skip


def _routing_buffers(T: int, E: int, top_k: int, dev: torch.device, w_dtype: torch.dtype) -> Routing:
    return Routing(empty(T, E, device=dev, dtype=torch.float32), empty(T, top_k, device=dev, dtype=torch.int64),
                   empty(T, top_k, device=dev, dtype=w_dtype))


def route_select(
    logits_TE: Tensor,
    top_k: int,
    active_T: Tensor,
    budget: int | None,
    *,
    norm_topk: bool,
    scale: float = 1.0,
    w_dtype: torch.dtype | None = None,
    kind: str = "router_sum",
    g_TE: Tensor | None = None,
    pred_b_E: Tensor | None = None,
    energy_E: Tensor | None = None,
    score_E: Tensor | None = None,
    sim_EE: Tensor | None = None,
    logit_bias_E: Tensor | None = None,
    reassign_mode: str = "backfill",
    renormalize: bool = True,
    rule: Rule | None = None,
    launch: SelectLaunch | None = None,
) -> tuple[Routing, Selection]:
    """The router's softmax + top-k (+ renormalisation, scaling) and the selection in ONE launch,
    after the router's GEMM (`route_select_gemv` does the GEMM too).

    Replaces everything a softmax-then-top-k router (Qwen2/3-MoE, DeepSeek-V2 greedy, Mixtral)
    does after its GEMM. Top-k ties go to the lower expert id (torch.topk leaves them
    unspecified); probs equal torch's fp32 softmax up to rounding. A static score_E (calib_freq,
    fixed) replaces the in-kernel score; `kind` is then ignored.
    """
    rule = rule or Rule(reassign_mode=reassign_mode, renormalize=renormalize)
    T, E = logits_TE.shape
    _check(kind, rule, budget, E, sim_EE)
    routing = _routing_buffers(T, E, top_k, logits_TE.device, w_dtype or logits_TE.dtype)
    logits_TE = logits_TE if logits_TE.stride(-1) == 1 else logits_TE.contiguous()
    if g_TE is not None and g_TE.stride(-1) != 1:
        g_TE = g_TE.contiguous()
    sel = _launch(T=T, K=top_k, E=E, budget=budget, kind=kind, rule=rule, probs_TE=routing.probs_TE,
                  idx_TK=routing.topk_idx_TK, w_TK=routing.topk_w_TK, active_T=active_T, score_E=score_E, g_TE=g_TE,
                  g_stride=g_TE.stride(0) if g_TE is not None else 0, pred_b_E=pred_b_E, energy_E=energy_E,
                  sim_EE=sim_EE, route=True, norm=norm_topk, route_scale=scale, logits_TE=logits_TE,
                  logit_bias_E=logit_bias_E, launch=launch)  # fmt: skip
    return routing, sel


def route_select_gemv(
    x_TH: Tensor,
    weight_CH: Tensor,
    num_experts: int,
    top_k: int,
    active_T: Tensor,
    budget: int | None,
    *,
    norm_topk: bool,
    scale: float = 1.0,
    kind: str = "router_sum",
    pred_b_E: Tensor | None = None,
    energy_E: Tensor | None = None,
    score_E: Tensor | None = None,
    sim_EE: Tensor | None = None,
    logit_bias_E: Tensor | None = None,
    rule: Rule | None = None,
    counter: Tensor | None = None,
    launch: SelectLaunch | None = None,
) -> tuple[Routing, Selection]:
    """`route_select` with the router's GEMM in the same launch: weight_CH is the router's (E, H)
    weight, or for `base` [router; predictor] (2E, H) from `kernels.score.fuse_router_predictor`
    (g = the predictor half). Logits (and g) are rounded to the weight dtype as F.linear rounds
    them; fp32 weights are multiplied in full fp32 (no tf32). `counter`: from `arrival_counter`,
    allocated once outside graph capture (a fresh one per call otherwise)."""
    rule = rule or Rule()
    E = num_experts
    C, H = weight_CH.shape
    T = x_TH.shape[0]
    _check(kind, rule, budget, E, sim_EE)
    if C not in (E, 2 * E) or x_TH.shape[1] != H:
        raise ValueError(f"weight_CH {tuple(weight_CH.shape)} does not fit {E} experts and x_TH {tuple(x_TH.shape)}")
    if kind == "base" and score_E is None and C != 2 * E:
        raise ValueError("kind 'base' needs the predictor rows in weight_CH (2E rows)")
    dev = x_TH.device
    x_TH = x_TH if x_TH.stride(-1) == 1 else x_TH.contiguous()
    ws_TC = empty(T, C, device=dev, dtype=torch.float32)
    counter = arrival_counter(dev) if counter is None else counter
    routing = _routing_buffers(T, E, top_k, dev, weight_CH.dtype)
    g_TE = ws_TC[:, E:] if C == 2 * E else None
    sel = _launch(T=T, K=top_k, E=E, budget=budget, kind=kind, rule=rule, probs_TE=routing.probs_TE,
                  idx_TK=routing.topk_idx_TK, w_TK=routing.topk_w_TK, active_T=active_T, score_E=score_E, g_TE=g_TE,
                  g_stride=C, pred_b_E=pred_b_E, energy_E=energy_E, sim_EE=sim_EE, route=True, norm=norm_topk,
                  route_scale=scale, logits_TE=ws_TC, logit_bias_E=logit_bias_E,
                  gemv=(x_TH, weight_CH.contiguous(), ws_TC, counter), launch=launch)  # fmt: skip
    return routing, sel
