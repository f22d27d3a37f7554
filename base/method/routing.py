"""Budgeted routing for one MoE layer and one decode step: union, top-M selection, reassignment.

This file is the PyTorch reference of the method's selection step; `kernels/` holds the fused
Triton versions and tests them against these functions.

Shapes: T tokens in the decode batch (padding and finished rows included, masked by active_T),
H hidden, E routed experts, K the model's top-k, M budget (distinct experts kept).

Everything here is branch-free on the host (no .item(), no data-dependent Python control flow),
so a decode step that uses it can be captured in a CUDA graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from base.method.options import REASSIGN_MODES, RENORMALIZE_MODES  # noqa: F401 - re-exported


@dataclass
class RoutedBatch:
    """What the router decided for one layer and step, plus what selection needs to revise it."""

    z_TH: Tensor  # MoE-layer input (the router's and the experts' input)
    probs_TE: Tensor  # router probabilities, fp32; order of preference for backfill
    topk_idx_TK: Tensor  # experts the model chose
    topk_w_TK: Tensor  # their weights as the model applies them (renormalised/scaled as it does)
    active_T: Tensor  # bool; False for padding and finished sequences
    layer: int  # ordinal of the MoE layer (0 .. number of MoE layers - 1)
    norms_TK: Tensor | None = None  # true ||E_u(z_t)|| of routed pairs; only oracle / energy stats

    @property
    def num_experts(self) -> int:
        return self.probs_TE.shape[-1]


def pair_counts_E(topk_idx_TK: Tensor, active_T: Tensor, num_experts: int) -> Tensor:
    """How many active tokens route to each expert (fp32, shape E)."""
    ones_TK = active_T[:, None].expand_as(topk_idx_TK).to(torch.float32)
    return torch.zeros(num_experts, device=topk_idx_TK.device).index_add_(
        0, topk_idx_TK.reshape(-1), ones_TK.reshape(-1)
    )


def aggregate_E(term_TK: Tensor, topk_idx_TK: Tensor, active_T: Tensor, num_experts: int) -> Tensor:
    """score_E[u] = sum of term_TK over the active routed pairs (t, u)."""
    term_TK = torch.where(active_T[:, None], term_TK.to(torch.float32), 0.0)
    return torch.zeros(num_experts, device=term_TK.device).index_add_(
        0, topk_idx_TK.reshape(-1), term_TK.reshape(-1)
    )


def select_top_m(score_E: Tensor, union_E: Tensor, budget: int) -> Tensor:
    """keep_E (bool): the `budget` union experts with the largest score.

    Ties go to the lower expert id (stable sort), so a kept set is reproducible. When the union has
    at most `budget` experts, all of it is kept.
    """
    masked_E = torch.where(union_E, score_E.to(torch.float32), float("-inf"))
    order_E = torch.sort(masked_E, descending=True, stable=True).indices
    rank_E = torch.empty_like(order_E)
    rank_E[order_E] = torch.arange(order_E.numel(), device=order_E.device)
    return union_E & (rank_E < budget)


def reassign(
    batch: RoutedBatch,
    keep_E: Tensor,
    score_E: Tensor,
    reassign_mode: str = "backfill",
    renormalize: bool = True,
    sim_EE: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Route every token (active or not) to kept experts only.

    `similar` (SERE-style re-routing, arXiv 2602.07616): each dropped pair moves, with its weight,
    to the kept expert most similar to the dropped one (sim_EE, from calibration: see
    base/method/similarity.py); a substitute the token already has adds its weight to the same expert
    (computed as two rows, which sums the same way). The token's total weight is unchanged.

    A token keeps its kept original experts with their weights. With `backfill` it then takes, in
    order of router probability, further kept experts until it has K or none are left; a backfilled
    expert u gets weight p_tu * (sum_k w_tk / sum_k p_tk), the scale the model applied to its own
    choice (1/sum p when it renormalises, routed_scaling_factor for DeepSeek). With `renormalize`,
    a token that lost an expert has its weights rescaled to the total it had before selection.

    Slots left empty point at a kept expert (the token's first, else the top-scored one) with weight
    0, instead of a sentinel id: some experts implementations leave sentinel rows uninitialised.
    Tokens that lost nothing are returned bit-identical, so budget >= union equals dense.
    Returns (topk_idx_TK, topk_w_TK) in the dtype of the inputs.
    """
    idx_TK, w_TK, probs_TE = batch.topk_idx_TK, batch.topk_w_TK, batch.probs_TE
    K = idx_TK.shape[1]
    w32_TK = w_TK.to(torch.float32)
    kept_orig_TK = keep_E[idx_TK]
    lost_T = ~kept_orig_TK.all(dim=-1)
    if reassign_mode == "similar":
        if sim_EE is None:
            raise ValueError("reassign 'similar' needs the expert similarity (sim_EE)")
        sim_TKE = sim_EE.to(torch.float32)[idx_TK].masked_fill(~keep_E, float("-inf"))
        sub_TK = torch.where(kept_orig_TK, idx_TK, sim_TKE.argmax(dim=-1))
        return sub_TK, w_TK

    orig_TE = torch.zeros_like(probs_TE, dtype=torch.bool).scatter_(1, idx_TK, True)
    orig_w_TE = torch.zeros_like(probs_TE).scatter_(1, idx_TK, w32_TK)
    # Kept originals rank first (probs + 2 > any prob), then kept others by probability, then none.
    rank_TE = torch.where(orig_TE & keep_E, probs_TE + 2.0, -1.0)
    if reassign_mode == "backfill":
        rank_TE = torch.where(~orig_TE & keep_E, probs_TE, rank_TE)
    elif reassign_mode != "drop":
        raise ValueError(f"reassign must be one of {REASSIGN_MODES}, got {reassign_mode!r}")
    top_v_TK, new_idx_TK = rank_TE.topk(K, dim=-1)
    filled_TK = top_v_TK >= 0

    scale_T = w32_TK.sum(-1) / probs_TE.gather(1, idx_TK).sum(-1).clamp_min(1e-30)
    new_w_TK = torch.where(
        orig_TE.gather(1, new_idx_TK),
        orig_w_TE.gather(1, new_idx_TK),
        probs_TE.gather(1, new_idx_TK) * scale_T[:, None],
    )
    new_w_TK = torch.where(filled_TK, new_w_TK, 0.0)
    if renormalize:
        total_T = new_w_TK.sum(-1).clamp_min(1e-30)
        new_w_TK = new_w_TK * (w32_TK.sum(-1) / total_T)[:, None]

    best_E = torch.where(keep_E, score_E.to(torch.float32), float("-inf")).argmax()
    first_T = torch.where(filled_TK[:, 0], new_idx_TK[:, 0], best_E)
    new_idx_TK = torch.where(filled_TK, new_idx_TK, first_T[:, None])

    new_idx_TK = torch.where(lost_T[:, None], new_idx_TK, idx_TK)
    new_w_TK = torch.where(lost_T[:, None], new_w_TK.to(w_TK.dtype), w_TK)
    return new_idx_TK, new_w_TK


@dataclass
class StepStats:
    """One (layer, step) record; every field is a 0-d tensor so recording never syncs the host."""

    union: Tensor  # distinct experts routed by active tokens, before selection
    kept: Tensor  # distinct experts kept (every kept expert is in the union, so all of them run)
    weight_kept: Tensor  # sum of routing weight on kept original pairs (active tokens)
    weight_total: Tensor  # sum of routing weight over all original pairs (active tokens)
    tokens_lost: Tensor  # active tokens that lost at least one expert
    tokens: Tensor  # active tokens
    executed: Tensor | None = None  # distinct experts the step runs: every row's final routing, finished
    # and padding rows included (they still go through the experts), not only active tokens
    energy_kept: Tensor | None = None  # sum w^2 ||E||^2 over kept original pairs
    energy_total: Tensor | None = None  # sum w^2 ||E||^2 over all original pairs
    out_err: Tensor | None = None  # sum over active tokens of ||y_budget - y_dense||^2 (MoE output)
    out_dense: Tensor | None = None  # sum over active tokens of ||y_dense||^2


def step_stats(batch: RoutedBatch, keep_E: Tensor, final_idx_TK: Tensor | None = None) -> StepStats:
    """Statistics of one (layer, step); final_idx_TK is the routing the experts run (default: the
    router's own)."""
    active_T, idx_TK = batch.active_T, batch.topk_idx_TK
    E = batch.num_experts
    a_TK = active_T[:, None].expand_as(idx_TK)
    kept_orig_TK = keep_E[idx_TK]
    w_TK = batch.topk_w_TK.to(torch.float32)
    stats = StepStats(
        union=(pair_counts_E(idx_TK, active_T, E) > 0).sum(),
        kept=keep_E.sum(),
        weight_kept=(w_TK * (kept_orig_TK & a_TK)).sum(),
        weight_total=(w_TK * a_TK).sum(),
        tokens_lost=(~kept_orig_TK.all(-1) & active_T).sum(),
        tokens=active_T.sum(),
    )
    every_T = torch.ones_like(active_T)
    final = idx_TK if final_idx_TK is None else final_idx_TK
    stats.executed = (pair_counts_E(final, every_T, E) > 0).sum()
    if batch.norms_TK is not None:
        e_TK = (w_TK * batch.norms_TK.to(torch.float32)) ** 2 * a_TK
        stats.energy_kept = (e_TK * kept_orig_TK).sum()
        stats.energy_total = e_TK.sum()
    return stats
