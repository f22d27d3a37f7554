"""Batch score of each expert: score_E = sum over active routed pairs (t, u) of a per-pair term.

One launch per MoE layer. References: the selectors of base/method/selectors.py (`pair_term` +
`base.method.routing.aggregate_E`, and `Count.score`); tests/test_kernels.py compares against them.

Shapes: T tokens, H hidden, E experts, K top-k.
    z_TH         MoE-layer input (router and experts input)
    pred_w_EH    the layer's predictor of log||E_u(z)||, one row per expert (W_HE transposed:
                 `prepare_predictor` makes it once, so each expert's column is contiguous)
    g_TE         z_TH @ W_HE for every expert, when the router's matmul already produced it

KIND (term of pair (t, u) with routing weight w):
    router_sum w | router_sq w^2 | count 1 (ties by router_sum) | calib_energy w^2 energy_E[u]
    base w^2 exp(2 g), g = z_t . W_HE[:, u] + b_E[u]

Two ways to get g for `base`:
  * gather (default): program u streams predictor row u once, only if u is routed, and dots it
    with the rows z_t of the tokens routed to u (masked loads fetch nothing for the others);
  * fused: fold the predictor into the router's matmul (`fuse_router_predictor` +
    `fused_router_logits`: one GEMM over [router; predictor], 2E outputs); the score kernel, or
    the select kernel directly, then only gathers g_TE at routed pairs.

No host synchronisation; score_E has shape (E,) whatever the routing: safe in a CUDA graph.
"""
from __future__ import annotations

import torch
import triton.language as tl
from torch import Tensor

from kernels._triton import dual_jit, empty
from kernels.select import KINDS


@dual_jit
def _score_kernel(
    # Pointers
    score_ptr,  # (E,) fp32 out
    idx_ptr,  # (T, K) int
    w_ptr,  # (T, K) model dtype
    active_ptr,  # (T,) bool
    z_ptr,  # (T, H) (KIND base, not FROM_G)
    pw_ptr,  # (E, H) predictor rows (KIND base, not FROM_G)
    pb_ptr,  # (E,) predictor bias (KIND base)
    g_ptr,  # (T, E) precomputed z @ W_HE (KIND base, FROM_G)
    energy_ptr,  # (E,) (KIND calib_energy)
    # Dimensions
    T,
    H,
    # Strides
    stride_it,
    stride_wt,
    stride_zt,
    stride_zh,
    stride_pe,
    stride_ph,
    stride_gt,
    stride_ge,
    # Meta-parameters
    K: tl.constexpr,
    KIND: tl.constexpr,
    FROM_G: tl.constexpr,
    TB: tl.constexpr,  # tokens per step
    BH: tl.constexpr,  # hidden elements per step of the predictor dot
):
    """Grid (E,): program u sums the terms of expert u in token order (deterministic)."""
    u = tl.program_id(0)
    cnt = tl.zeros((TB,), dtype=tl.float32)
    acc = tl.zeros((TB,), dtype=tl.float32)
    total = tl.zeros((TB,), dtype=tl.float32)  # sum of all active weights (KIND count)
    if KIND == 4:
        b_u = tl.load(pb_ptr + u).to(tl.float32)
    if KIND == 3:
        energy_u = tl.load(energy_ptr + u).to(tl.float32)
    for t0 in range(0, T, TB):
        offs_t = t0 + tl.arange(0, TB)
        t_ok = offs_t < T
        act_T = tl.load(active_ptr + offs_t, mask=t_ok, other=0) != 0
        hits_T = tl.zeros((TB,), dtype=tl.float32)
        wsum_T = tl.zeros((TB,), dtype=tl.float32)
        wsq_T = tl.zeros((TB,), dtype=tl.float32)
        for k in tl.static_range(K):
            i_T = tl.load(idx_ptr + offs_t * stride_it + k, mask=t_ok, other=-1)
            w_T = tl.load(w_ptr + offs_t * stride_wt + k, mask=t_ok, other=0.0).to(tl.float32)
            hit = (i_T == u) & act_T
            hits_T += hit.to(tl.float32)
            wsum_T += tl.where(hit, w_T, 0.0)
            wsq_T += tl.where(hit, w_T * w_T, 0.0)
            if KIND == 2:
                total += tl.where(act_T, w_T, 0.0)
        routed_T = hits_T > 0
        cnt += hits_T
        if KIND == 1:
            acc += wsq_T
        elif KIND == 3:
            acc += wsq_T * energy_u
        elif KIND == 4:
            if FROM_G:
                g_T = tl.load(g_ptr + offs_t * stride_gt + u * stride_ge, mask=routed_T, other=0.0)
                g_T = g_T.to(tl.float32)
            else:
                # fp32 multiply-add, not tl.dot: tf32 would cost ~1e-3 in exp(2g)
                dot_TB = tl.zeros((TB, BH), dtype=tl.float32)
                if tl.sum(hits_T, axis=0) > 0:  # unrouted experts never touch their predictor row
                    for h0 in range(0, H, BH):
                        offs_h = h0 + tl.arange(0, BH)
                        h_ok = offs_h < H
                        p_H = tl.load(pw_ptr + u * stride_pe + offs_h * stride_ph, mask=h_ok, other=0.0)
                        z_TB = tl.load(
                            z_ptr + offs_t[:, None] * stride_zt + offs_h[None, :] * stride_zh,
                            mask=routed_T[:, None] & h_ok[None, :],
                            other=0.0,
                        )
                        dot_TB += z_TB.to(tl.float32) * p_H.to(tl.float32)[None, :]
                g_T = tl.sum(dot_TB, axis=1)
            acc += tl.where(routed_T, wsq_T * tl.exp(2.0 * (g_T + b_u)), 0.0)
        else:
            acc += wsum_T
    score = tl.sum(acc, axis=0)
    if KIND == 2:
        # Count.score: count * (router_sum total + 1) + router_sum
        score = tl.sum(cnt, axis=0) * (tl.sum(total, axis=0) + 1.0) + score
    tl.store(score_ptr + u, score)


def prepare_predictor(pred_w_HE: Tensor) -> Tensor:
    """pred_w_EH: the predictor with each expert's column contiguous (do once per layer)."""
    return pred_w_HE.t().contiguous()


def score_experts(
    kind: str,
    topk_idx_TK: Tensor,
    topk_w_TK: Tensor,
    active_T: Tensor,
    num_experts: int,
    *,
    z_TH: Tensor | None = None,
    pred_w_EH: Tensor | None = None,
    pred_b_E: Tensor | None = None,
    g_TE: Tensor | None = None,
    energy_E: Tensor | None = None,
) -> Tensor:
    """score_E (fp32) of selector `kind` for one layer; `base` needs pred_b_E and either g_TE
    (fused path) or z_TH with pred_w_EH (gather path)."""
    if kind not in KINDS:
        raise ValueError(f"unknown selector kind {kind!r}; valid: {', '.join(KINDS)}")
    T, K = topk_idx_TK.shape
    E = num_experts
    dev = topk_idx_TK.device
    from_g = g_TE is not None
    if kind == "base" and (pred_b_E is None or (not from_g and (z_TH is None or pred_w_EH is None))):
        raise ValueError("kind 'base' needs pred_b_E and either g_TE or (z_TH, pred_w_EH)")
    if kind == "calib_energy" and energy_E is None:
        raise ValueError("kind 'calib_energy' needs energy_E")
    topk_idx_TK = topk_idx_TK.contiguous()
    topk_w_TK = topk_w_TK.contiguous()
    score_E = empty(E, device=dev, dtype=torch.float32)
    dummy = score_E
    z = z_TH if z_TH is not None else dummy[None]
    pw = pred_w_EH if pred_w_EH is not None else dummy[None]
    g = g_TE if g_TE is not None else dummy[None]
    H = z.shape[-1] if z_TH is not None else 1
    TB = 16 if T <= 16 else 64  # two compiled variants: tiny decode batches, the rest
    _score_kernel.on(dev)[(E,)](
        score_E, topk_idx_TK, topk_w_TK, active_T,
        z, pw, pred_b_E if pred_b_E is not None else dummy, g,
        energy_E if energy_E is not None else dummy,
        T, H,
        topk_idx_TK.stride(0), topk_w_TK.stride(0), z.stride(0), z.stride(1),
        pw.stride(0), pw.stride(1), g.stride(0), g.stride(1),
        K=K, KIND=KINDS[kind], FROM_G=from_g, TB=TB, BH=max(16, 4096 // TB),
        num_warps=4,
    )  # fmt: skip
    return score_E


def fuse_router_predictor(router_w_EH: Tensor, pred_w_HE: Tensor) -> Tensor:
    """wcat_CH (C = 2E): the router's rows, then the predictor's columns, in the router's dtype.

    One GEMM over wcat gives router logits and g together (`fused_router_logits`); the predictor
    half is rounded to the router dtype, so g carries bf16 weight rounding (~1e-3 relative).
    """
    return torch.cat([router_w_EH, pred_w_HE.t().to(router_w_EH.dtype)], dim=0).contiguous()


def fused_router_logits(z_TH: Tensor, wcat_CH: Tensor) -> tuple[Tensor, Tensor]:
    """(logits_TE, g_TE): views of one F.linear over the concatenated weights.

    logits equal the router's F.linear up to the GEMM's accumulation order (cuBLAS may pick
    another algorithm for 2E outputs); g_TE has the dtype of z (bf16 output rounding: the term
    exp(2g) then carries ~|g| * 2^-8 relative error).
    """
    E = wcat_CH.shape[0] // 2
    out_TC = torch.nn.functional.linear(z_TH, wcat_CH)
    return out_TC[:, :E], out_TC[:, E:]
