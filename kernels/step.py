"""One layer's selection step on the GPU: score, top-M, reassign (what base/patch.py calls).

    sel = select_step(batch, "base", budget=16, artifacts=art, pred_w_EH=pred_w_EH)
    out = experts(batch.z_TH, sel.topk_idx_TK, sel.topk_w_TK)      # e.g. base_triton

Equivalent to `Selector.keep` + `base.routing.reassign` (tests compare them). Launches:
    router_sum / router_sq / count / calib_energy   1 (the select kernel scores in-kernel)
    base with g_TE from the fused router GEMM        1 (kernels.score.fused_router_logits)
    base from z_TH and the predictor                  2 (score kernel gathers predictor rows)
    calib_freq                                        1 (static score)
No host synchronisation; fixed output shapes for a given (T, K, E, budget): CUDA-graph safe.
"""
from __future__ import annotations

import torch
from torch import Tensor

from base.routing import RoutedBatch
from base.selectors import Artifacts
from kernels.score import prepare_predictor, score_experts
from kernels.select import KINDS, Selection, select_reassign


def select_step(
    batch: RoutedBatch,
    kind: str,
    budget: int | None,
    *,
    artifacts: Artifacts | None = None,
    pred_w_EH: Tensor | None = None,
    g_TE: Tensor | None = None,
    reassign_mode: str = "backfill",
    renormalize: bool = True,
) -> Selection:
    """Selection for selector `kind` (a name of base.selectors) and `budget` experts (None: the
    whole union). `base` uses g_TE if given, else z_TH with pred_w_EH (pass it prepared once per
    layer with kernels.score.prepare_predictor; derived from artifacts per call otherwise)."""
    art = artifacts or Artifacts()
    dev, L = batch.probs_TE.device, batch.layer
    common = {"reassign_mode": reassign_mode, "renormalize": renormalize}
    args = (batch.probs_TE, batch.topk_idx_TK, batch.topk_w_TK, batch.active_T, budget)

    def layer_row(t: Tensor | None, what: str) -> Tensor:
        if t is None:
            raise ValueError(f"selector {kind!r} needs {what} in its artifacts")
        return t[L].to(dev, torch.float32)

    if kind == "calib_freq":
        return select_reassign(*args, layer_row(art.freq_LE, "freq_LE"), **common)
    if kind not in KINDS:
        raise ValueError(f"select_step supports {', '.join([*KINDS, 'calib_freq'])}; got {kind!r}")
    energy_E = layer_row(art.energy_LE, "energy_LE") if kind == "calib_energy" else None
    if kind != "base":
        return select_reassign(*args, kind=kind, energy_E=energy_E, **common)
    pred_b_E = layer_row(art.pred_b_LE, "pred_b_LE")
    if g_TE is not None:
        return select_reassign(*args, kind="base", g_TE=g_TE, pred_b_E=pred_b_E, **common)
    if pred_w_EH is None:
        pred_w_EH = prepare_predictor(layer_row(art.pred_w_LHE, "pred_w_LHE"))
    score_E = score_experts(
        "base", batch.topk_idx_TK, batch.topk_w_TK, batch.active_T, batch.num_experts,
        z_TH=batch.z_TH, pred_w_EH=pred_w_EH, pred_b_E=pred_b_E,
    )  # fmt: skip
    return select_reassign(*args, score_E, **common)
