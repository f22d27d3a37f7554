"""Select + backfill: top-M experts of a decode batch, then every token rerouted to kept experts.

One launch per MoE layer. Reference: `base.method.routing.select_top_m` and `base.method.routing.reassign`
(tests/test_kernels.py compares against them). Optionally the kernel also computes score_E itself
from the routing (and, for `base`, from g_TE = z_TH @ W_HE produced by the router's matmul on
concatenated [router; predictor] weights, see kernels/score.py), so selection costs one launch.

Shapes: T tokens, E experts, K top-k, M budget (kept experts).
    probs_TE     fp32 router probabilities (order of preference for backfill)
    topk_idx_TK  the model's experts; topk_w_TK their weights (model dtype)
    active_T     bool; inactive tokens neither score nor count in the union
    score_E      fp32 batch score (input, or output when computed in the kernel)
    keep_E       bool kept set; keep_M int64 kept ids by descending score, padded with -1

Semantics match the reference exactly except where the reference leaves the order unspecified:
ties in score go to the lower expert id (as `select_top_m`); ties in router probability among
backfill candidates also go to the lower id (torch.topk does not specify its tie order).

No host synchronisation; all output shapes depend on (T, K, E, M) only: safe in a CUDA graph.
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

REASSIGN_MODES = ("backfill", "drop")


@dual_jit
def _select_reassign_kernel(
    # Pointers
    score_ptr,  # (E,) fp32; read, or written by program 0 when SCORE_IN_KERNEL
    probs_ptr,  # (T, E) fp32
    idx_ptr,  # (T, K) int
    w_ptr,  # (T, K) model dtype
    active_ptr,  # (T,) bool
    g_ptr,  # (T, E) z @ W_HE (KIND base with SCORE_IN_KERNEL), else unused
    bias_ptr,  # (E,) predictor bias (KIND base), else unused
    energy_ptr,  # (E,) calibration energy (KIND calib_energy), else unused
    keep_e_ptr,  # (E,) bool out
    keep_m_ptr,  # (M,) int64 out
    new_idx_ptr,  # (T, K) out, dtype of idx
    new_w_ptr,  # (T, K) out, dtype of w
    logits_ptr,  # (T, E) router logits (ROUTE), else unused
    # Dimensions
    T,
    E,
    M,
    route_scale,  # ROUTE: factor on the top-k weights (DeepSeek's routed_scaling_factor)
    # Strides (the last dimension of every 2-D tensor is contiguous)
    stride_lt,
    stride_pt,
    stride_it,
    stride_wt,
    stride_gt,
    stride_nit,
    stride_nwt,
    # Meta-parameters
    K: tl.constexpr,
    K_BLOCK: tl.constexpr,
    E_BLOCK: tl.constexpr,
    TB: tl.constexpr,  # tokens per program (reassignment) and per step of the score loop
    SCORE_IN_KERNEL: tl.constexpr,
    KIND: tl.constexpr,
    BACKFILL: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    ROUTE: tl.constexpr,  # also route: probs = softmax(logits), top-K, renormalise (NORM), scale
    NORM: tl.constexpr,
):
    """Grid (cdiv(T, TB),), or (1,) with ROUTE. Every program computes the same union, score and
    kept set (cheap, and it avoids a second launch or a grid-wide barrier); program 0 writes
    them; the programs then reassign TB-token blocks in turn. With ROUTE the one program also
    routes: it writes the model's routing (probs_TE, topk idx/w), scores from it in registers, and
    reads it back for the reassignment after a CTA barrier."""
    pid = tl.program_id(0)
    offs_e = tl.arange(0, E_BLOCK)
    e_ok = offs_e < E
    offs_k = tl.arange(0, K_BLOCK)

    # --- one pass over the tokens: with ROUTE, the router's softmax and top-k (as the model
    # computes them after its GEMM), kept in registers; then the union (pair counts) and,
    # optionally, the score ---
    cnt_E = tl.zeros((E_BLOCK,), dtype=tl.float32)
    acc_E = tl.zeros((E_BLOCK,), dtype=tl.float32)  # score, or router_sum for COUNT
    if KIND == 4:
        b_E = tl.load(bias_ptr + offs_e, mask=e_ok, other=0.0).to(tl.float32)
    if KIND == 3:
        energy_E = tl.load(energy_ptr + offs_e, mask=e_ok, other=0.0).to(tl.float32)
    for t0 in range(0, T, TB):
        offs_t = t0 + tl.arange(0, TB)
        t_ok = offs_t < T
        act_T = tl.load(active_ptr + offs_t, mask=t_ok, other=0) != 0
        if SCORE_IN_KERNEL and KIND == 4:
            # the whole tile, issued first so its latency overlaps the rest (a load masked by
            # `routed` would wait for the routing); unrouted entries are discarded below
            g_TE = tl.load(
                g_ptr + offs_t[:, None] * stride_gt + offs_e[None, :], mask=t_ok[:, None] & e_ok[None, :], other=0.0
            ).to(tl.float32)
        if ROUTE:
            lg_TE = tl.load(
                logits_ptr + offs_t[:, None] * stride_lt + offs_e[None, :],
                mask=t_ok[:, None] & e_ok[None, :],
                other=float("-inf"),
            ).to(tl.float32)
            mx_T = tl.where(t_ok, tl.max(lg_TE, axis=1), 0.0)
            ex_TE = tl.exp(lg_TE - mx_T[:, None])
            den_T = tl.where(t_ok, tl.sum(ex_TE, axis=1), 1.0)  # rows past T: no 0/0
            p_TE = ex_TE / den_T[:, None]
            tl.store(probs_ptr + offs_t[:, None] * stride_pt + offs_e[None, :], p_TE, mask=t_ok[:, None] & e_ok[None, :])
            r_TE = tl.where(e_ok[None, :], p_TE, -1.0)
            ri_TK = tl.zeros((TB, K_BLOCK), dtype=tl.int32)
            rw_TK = tl.zeros((TB, K_BLOCK), dtype=tl.float32)
            for k in tl.static_range(K):  # top-K, ties to the lower id
                v_T, j_T = tl.max(r_TE, axis=1, return_indices=True, return_indices_tie_break_left=True)
                ri_TK = tl.where(offs_k[None, :] == k, j_T[:, None], ri_TK)
                rw_TK = tl.where(offs_k[None, :] == k, v_T[:, None], rw_TK)
                r_TE = tl.where(offs_e[None, :] == j_T[:, None], -2.0, r_TE)
            if NORM:
                rw_TK = rw_TK / tl.sum(rw_TK, axis=1)[:, None]
            rw_TK = (rw_TK * route_scale).to(w_ptr.dtype.element_ty)  # the weights as stored
            tk_ok = t_ok[:, None] & (offs_k[None, :] < K)
            tl.store(idx_ptr + offs_t[:, None] * stride_it + offs_k[None, :], ri_TK, mask=tk_ok)
            tl.store(w_ptr + offs_t[:, None] * stride_wt + offs_k[None, :], rw_TK, mask=tk_ok)
            rw_TK = rw_TK.to(tl.float32)
        hits_TE = tl.zeros((TB, E_BLOCK), dtype=tl.float32)
        wsum_TE = tl.zeros((TB, E_BLOCK), dtype=tl.float32)
        wsq_TE = tl.zeros((TB, E_BLOCK), dtype=tl.float32)
        for k in tl.static_range(K):
            if ROUTE:  # column k of the routing in registers
                i_T = tl.sum(tl.where(offs_k[None, :] == k, ri_TK, 0), axis=1)
                w_T = tl.sum(tl.where(offs_k[None, :] == k, rw_TK, 0.0), axis=1)
            else:
                i_T = tl.load(idx_ptr + offs_t * stride_it + k, mask=t_ok, other=-1)
                w_T = tl.load(w_ptr + offs_t * stride_wt + k, mask=t_ok, other=0.0).to(tl.float32)
            hit = (i_T[:, None] == offs_e[None, :]) & act_T[:, None]
            hits_TE += hit.to(tl.float32)
            wsum_TE += tl.where(hit, w_T[:, None], 0.0)
            wsq_TE += tl.where(hit, (w_T * w_T)[:, None], 0.0)
        cnt_E += tl.sum(hits_TE, axis=0)
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
    if ROUTE:
        tl.debug_barrier()  # the routing this CTA wrote is visible to its reassignment below
    if SCORE_IN_KERNEL:
        if KIND == 2:
            # as base/selectors.Count: one more token outranks any router_sum difference
            score_E = cnt_E * (tl.sum(acc_E, axis=0) + 1.0) + acc_E
        else:
            score_E = acc_E
        if pid == 0:
            tl.store(score_ptr + offs_e, score_E, mask=e_ok)
    else:
        score_E = tl.load(score_ptr + offs_e, mask=e_ok, other=0.0).to(tl.float32)
    union_E = cnt_E > 0

    # --- top-M of the union: rank = union experts ahead (higher score, or equal and lower id) ---
    s_E = tl.where(union_E, score_E, float("-inf"))
    s_U = s_E[:, None]  # the ranked expert u along axis 0, every other expert v along axis 1
    s_V = s_E[None, :]
    ahead_UV = (s_V > s_U) | ((s_V == s_U) & (offs_e[None, :] < offs_e[:, None]))
    rank_E = tl.sum((ahead_UV & union_E[None, :]).to(tl.int32), axis=1)
    keep_E = union_E & (rank_E < M)
    n_keep = tl.sum(keep_E.to(tl.int32), axis=0)
    if pid == 0:
        # kept ids by rank (unique positions < n_keep), then -1 up to M: two disjoint stores
        tl.store(keep_m_ptr + rank_E, offs_e.to(tl.int64), mask=keep_E)
        tl.store(keep_m_ptr + offs_e, tl.full((E_BLOCK,), -1, tl.int64), mask=(offs_e >= n_keep) & (offs_e < M))
        tl.store(keep_e_ptr + offs_e, keep_E, mask=e_ok)
    # fallback target of a token left with no kept expert: the top-scored kept one (first on ties)
    best = tl.argmax(tl.where(keep_E, score_E, float("-inf")), axis=0, tie_break_left=True)

    # --- reassign the tokens, TB at a time (base.method.routing.reassign, branch-free) ---
    for tb0 in range(pid * TB, T, tl.num_programs(0) * TB):
        offs_t = tb0 + tl.arange(0, TB)
        t_ok = offs_t < T
        tk_ok = t_ok[:, None] & (offs_k[None, :] < K)
        probs_TE = tl.load(
            probs_ptr + offs_t[:, None] * stride_pt + offs_e[None, :],
            mask=t_ok[:, None] & e_ok[None, :],
            other=0.0,
        )
        idx_TK = tl.load(idx_ptr + offs_t[:, None] * stride_it + offs_k[None, :], mask=tk_ok, other=0)
        w_TK = tl.load(w_ptr + offs_t[:, None] * stride_wt + offs_k[None, :], mask=tk_ok, other=0.0)
        orig_TE = tl.zeros((TB, E_BLOCK), dtype=tl.int1)
        origw_TE = tl.zeros((TB, E_BLOCK), dtype=tl.float32)
        wsum_T = tl.zeros((TB,), dtype=tl.float32)
        psum_T = tl.zeros((TB,), dtype=tl.float32)
        for k in tl.static_range(K):
            i_T = tl.load(idx_ptr + offs_t * stride_it + k, mask=t_ok, other=-1)
            w_T = tl.load(w_ptr + offs_t * stride_wt + k, mask=t_ok, other=0.0).to(tl.float32)
            hit = i_T[:, None] == offs_e[None, :]
            orig_TE = orig_TE | hit
            origw_TE = tl.where(hit, w_T[:, None], origw_TE)
            wsum_T += w_T
            psum_T += tl.sum(tl.where(hit, probs_TE, 0.0), axis=1)
        lost_T = tl.sum((orig_TE & ~keep_E[None, :]).to(tl.int32), axis=1) > 0
        # kept originals first (probs + 2 > any prob), then kept others by probability, then none
        rank_TE = tl.where(orig_TE & keep_E[None, :], probs_TE + 2.0, -1.0)
        if BACKFILL:
            rank_TE = tl.where(~orig_TE & keep_E[None, :], probs_TE, rank_TE)
        rank_TE = tl.where(e_ok[None, :], rank_TE, -3.0)
        scale_T = wsum_T / tl.maximum(psum_T, 1e-30)

        nidx_TK = tl.zeros((TB, K_BLOCK), dtype=tl.int32)
        nw_TK = tl.zeros((TB, K_BLOCK), dtype=tl.float32)
        filled_TK = tl.zeros((TB, K_BLOCK), dtype=tl.int1)
        first_T = tl.zeros((TB,), dtype=tl.int32)
        for k in tl.static_range(K):  # K rounds of argmax = topk(K), ties to the lower id
            v_T, j_T = tl.max(rank_TE, axis=1, return_indices=True, return_indices_tie_break_left=True)
            pick_TE = offs_e[None, :] == j_T[:, None]
            filled_T = v_T >= 0
            # rank >= 2 marks a kept original (its own weight); else rank is the probability
            ow_T = tl.sum(tl.where(pick_TE, origw_TE, 0.0), axis=1)
            nw_T = tl.where(filled_T, tl.where(v_T >= 1.5, ow_T, v_T * scale_T), 0.0)
            slot = offs_k[None, :] == k
            nidx_TK = tl.where(slot, j_T[:, None], nidx_TK)
            nw_TK = tl.where(slot, nw_T[:, None], nw_TK)
            filled_TK = tl.where(slot, filled_T[:, None], filled_TK)
            rank_TE = tl.where(pick_TE, -4.0, rank_TE)
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


@dataclass
class Selection:
    """Fixed-shape result of one layer's selection step."""

    keep_M: Tensor  # (M,) int64 kept ids, highest score first, -1 past the union
    keep_E: Tensor  # (E,) bool
    score_E: Tensor  # (E,) fp32
    topk_idx_TK: Tensor  # rerouted experts; empty slots point at a kept expert with weight 0
    topk_w_TK: Tensor


def _check(kind: str, reassign_mode: str, budget: int | None) -> None:
    if reassign_mode not in REASSIGN_MODES:
        raise ValueError(f"reassign must be one of {REASSIGN_MODES}, got {reassign_mode!r}")
    if kind not in KINDS:
        raise ValueError(f"unknown selector kind {kind!r}; valid: {', '.join(KINDS)}")
    if budget is not None and budget < 1:
        raise ValueError(f"budget must be >= 1 or None, got {budget}")


def _launch(probs_TE, idx_TK, w_TK, active_T, M, score_E, kind, g_TE, pred_b_E, energy_E, reassign_mode,
            renormalize, logits_TE=None, norm=False, route_scale=1.0) -> Selection:  # fmt: skip
    T, K = idx_TK.shape
    E = probs_TE.shape[-1]
    dev = probs_TE.device
    in_kernel = score_E is None
    if in_kernel and kind == "base" and (g_TE is None or pred_b_E is None):
        raise ValueError("kind 'base' computed in the kernel needs g_TE and pred_b_E")
    if in_kernel and kind == "calib_energy" and energy_E is None:
        raise ValueError("kind 'calib_energy' needs energy_E")
    score_out = empty(E, device=dev, dtype=torch.float32) if in_kernel else score_E.float().contiguous()
    keep_E = empty(E, device=dev, dtype=torch.bool)
    keep_M = empty(M, device=dev, dtype=torch.int64)
    new_idx = empty(T, K, device=dev, dtype=idx_TK.dtype)
    new_w = empty(T, K, device=dev, dtype=w_TK.dtype)
    dummy = score_out
    if g_TE is not None and g_TE.stride(-1) != 1:
        g_TE = g_TE.contiguous()
    route = logits_TE is not None
    if route and logits_TE.stride(-1) != 1:
        logits_TE = logits_TE.contiguous()
    TB = 16  # one compiled variant for every T; masked rows cost little
    E_BLOCK = next_pow2(E, 16)
    _select_reassign_kernel.on(dev)[(1 if route else triton.cdiv(T, TB),)](
        score_out, probs_TE, idx_TK, w_TK, active_T,
        g_TE if g_TE is not None else dummy,
        pred_b_E if pred_b_E is not None else dummy,
        energy_E if energy_E is not None else dummy,
        keep_E, keep_M, new_idx, new_w, logits_TE if route else dummy,
        T, E, M, float(route_scale),
        logits_TE.stride(0) if route else 0, probs_TE.stride(0), idx_TK.stride(0), w_TK.stride(0),
        g_TE.stride(0) if g_TE is not None else 0, new_idx.stride(0), new_w.stride(0),
        K=K, K_BLOCK=next_pow2(K), E_BLOCK=E_BLOCK, TB=TB,
        SCORE_IN_KERNEL=in_kernel, KIND=KINDS[kind],
        BACKFILL=reassign_mode == "backfill", RENORMALIZE=bool(renormalize), ROUTE=route, NORM=bool(norm),
        num_warps=4 if E_BLOCK <= 64 else 8,
    )  # fmt: skip
    return Selection(keep_M, keep_E, score_out, new_idx, new_w)


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
    reassign_mode: str = "backfill",
    renormalize: bool = True,
) -> Selection:
    """Keep the `budget` union experts with the largest score_E and reroute every token to them.

    With score_E None the kernel computes it for `kind` (see KINDS): `base` then needs g_TE
    (z @ W_HE for all experts, e.g. from `kernels.score.fused_router_logits`) and pred_b_E;
    `calib_energy` needs energy_E. budget None keeps the whole union (M = E).
    """
    _check(kind, reassign_mode, budget)
    E = probs_TE.shape[-1]
    M = E if budget is None else min(int(budget), E)
    return _launch(probs_TE.float().contiguous(), topk_idx_TK.contiguous(), topk_w_TK.contiguous(), active_T, M,
                   score_E, kind, g_TE, pred_b_E, energy_E, reassign_mode, renormalize)  # fmt: skip


@dataclass
class Routing:
    """The model's own routing, as `route_select` computed it (for statistics and reference)."""

    probs_TE: Tensor  # fp32 softmax of the logits
    topk_idx_TK: Tensor  # int64
    topk_w_TK: Tensor  # top-k probabilities, renormalised if norm_topk, times scale, in w_dtype


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
    reassign_mode: str = "backfill",
    renormalize: bool = True,
) -> tuple[Routing, Selection]:
    """The router's softmax + top-k (+ renormalisation, scaling) and the selection in ONE launch.

    Replaces everything a softmax-then-top-k router (Qwen2/3-MoE, DeepSeek-V2 greedy, Mixtral)
    does after its GEMM, so the selection adds no launch: logits_TE may be the router half of
    `fused_router_logits` and g_TE its predictor half. Top-k ties go to the lower expert id
    (torch.topk leaves them unspecified); probs equal torch's fp32 softmax up to rounding.
    One program does all T tokens (it reads back its own routing after a CTA barrier). A static
    score_E (calib_freq, fixed) replaces the in-kernel score; `kind` is then ignored.
    """
    _check(kind, reassign_mode, budget)
    T, E = logits_TE.shape
    dev = logits_TE.device
    M = E if budget is None else min(int(budget), E)
    probs_TE = empty(T, E, device=dev, dtype=torch.float32)
    idx_TK = empty(T, top_k, device=dev, dtype=torch.int64)
    w_TK = empty(T, top_k, device=dev, dtype=w_dtype or logits_TE.dtype)
    if score_E is not None:
        score_E = score_E.float().contiguous()
    sel = _launch(probs_TE, idx_TK, w_TK, active_T, M, score_E, kind, g_TE, pred_b_E, energy_E, reassign_mode,
                  renormalize, logits_TE=logits_TE, norm=norm_topk, route_scale=scale)  # fmt: skip
    return Routing(probs_TE, idx_TK, w_TK), sel
