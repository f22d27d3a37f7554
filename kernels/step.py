"""One layer's selection step on the GPU from plain tensors: score, top-M, reassign.

    sel = select_step(probs_TE, idx_TK, w_TK, active_T, "base", 16, z_TH=z_TH,
                      pred_w_EH=pred_w_EH, pred_b_E=pred_b_E)
    out = fused_experts(z_TH, gate_up, down, sel.topk_idx_TK, sel.topk_w_TK)

Equivalent to `base.method.selectors.<kind>.keep` + `base.method.routing.reassign` (tests compare them); this
file takes tensors only, so kernels/ never imports base/. Launches:
    router_sum / router_sq / count / calib_energy   1 (the select kernel scores in-kernel)
    base with g_TE from the fused router GEMM        1 (kernels.score.fused_router_logits)
    base from z_TH and pred_w_EH                      2 (score kernel gathers predictor rows)
    calib_freq                                        1 (static score freq_E)
No host synchronisation; fixed output shapes for a given (T, K, E, budget): CUDA-graph safe.
Per-layer tensors (freq_E, energy_E, pred_*) must already be fp32 on the device: they are
prepared once when a model is budgeted, never copied per step.
"""
from __future__ import annotations

from torch import Tensor

from kernels.score import score_experts
from kernels.select import KINDS, Rule, Selection, select_reassign

STEP_KINDS = (*KINDS, "calib_freq")


def select_step(
    probs_TE: Tensor,
    topk_idx_TK: Tensor,
    topk_w_TK: Tensor,
    active_T: Tensor,
    kind: str,
    budget: int | None,
    *,
    z_TH: Tensor | None = None,
    freq_E: Tensor | None = None,
    energy_E: Tensor | None = None,
    pred_w_EH: Tensor | None = None,
    pred_b_E: Tensor | None = None,
    g_TE: Tensor | None = None,
    sim_EE: Tensor | None = None,
    reassign_mode: str = "backfill",
    renormalize: bool = True,
    rule: Rule | None = None,
) -> Selection:
    """Selection for selector `kind` and `budget` experts (None: the whole union).

    `base` uses g_TE (z @ W_HE from the fused router GEMM) if given, else z_TH with pred_w_EH
    (`kernels.score.prepare_predictor`); both need pred_b_E. calib_energy needs energy_E,
    calib_freq freq_E. `rule` (tiers, coverage, reassign mode: kernels.select.Rule) overrides
    reassign_mode / renormalize; `similar` needs sim_EE."""
    args = (probs_TE, topk_idx_TK, topk_w_TK, active_T, budget)
    common = {"rule": rule or Rule(reassign_mode=reassign_mode, renormalize=renormalize), "sim_EE": sim_EE}

    def need(t: Tensor | None, what: str) -> Tensor:
        if t is None:
            raise ValueError(f"select_step kind {kind!r} needs {what}")
        return t

    if kind == "calib_freq":
        return select_reassign(*args, need(freq_E, "freq_E"), **common)
    if kind not in KINDS:
        raise ValueError(f"select_step supports {', '.join(STEP_KINDS)}; got {kind!r}")
    if kind == "calib_energy":
        return select_reassign(*args, kind=kind, energy_E=need(energy_E, "energy_E"), **common)
    if kind != "base":
        return select_reassign(*args, kind=kind, **common)
    need(pred_b_E, "pred_b_E")
    if g_TE is not None:
        return select_reassign(*args, kind="base", g_TE=g_TE, pred_b_E=pred_b_E, **common)
    score_E = score_experts(
        "base", topk_idx_TK, topk_w_TK, active_T, probs_TE.shape[-1],
        z_TH=need(z_TH, "z_TH (or g_TE)"), pred_w_EH=need(pred_w_EH, "pred_w_EH (or g_TE)"), pred_b_E=pred_b_E,
    )  # fmt: skip
    return select_reassign(*args, score_E, **common)
