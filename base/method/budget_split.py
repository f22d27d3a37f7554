"""Per-layer budgets: split a total of L x M kept experts across the L MoE layers by how much each
layer loses when it keeps fewer (`method.budget_split=sensitivity`), so the mean kept experts per
layer stays M while layers differ.

    curves_LM = loss_curves(calib, batch_size)         # once per calibration
    budgets = split_budget(curves_LM, budget=16)        # {layer index: M_l}, sum = L * 16

Sensitivity, from calibration: the calibration tokens are cut into decode-sized batches; in each,
an expert's removal cost is D_u = sum over its routed pairs of w_tu^2 ||E_u(z_t)||^2 (the true
norms calibration recorded, the quantity BASE predicts), and keeping the top m experts by D loses
the rest. loss(l, m) is that lost cost averaged over batches, for m = 0..E.

The split (a choice the issue leaves open: it names proportional shares "for example"): every
layer starts at one expert and each further expert goes to the layer whose loss drops most by it
(greedy on marginal gains). With convex loss curves, as sorted costs give, this minimises the
summed calibrated loss for the total; a layer that loses nothing at M gives its experts away.

Shapes: L layers, E experts, N calibration tokens, K top-k, B batch size.
"""
from __future__ import annotations

import heapq

import torch
from torch import Tensor

from base.method.calibration import Calibration


def loss_curves(calib: Calibration, batch_size: int, max_batches: int = 256) -> Tensor:
    """(L, E + 1) float64: mean lost removal cost of each layer keeping its top m experts."""
    E = calib.meta["num_experts"]
    rows = []
    for lc in calib.layers:
        N, K = lc.idx_NK.shape
        B = max(1, min(batch_size, N))
        nb = min(max_batches, N // B)
        cost_NK = lc.w_NK.double() ** 2 * lc.norms_NK.double() ** 2
        idx_bBK = lc.idx_NK[: nb * B].reshape(nb, B * K)
        cost_bBK = cost_NK[: nb * B].reshape(nb, B * K)
        D_bE = torch.zeros(nb, E, dtype=torch.float64).scatter_add_(1, idx_bBK, cost_bBK)
        sorted_bE = D_bE.sort(dim=1, descending=True).values
        kept_bE = torch.cat([torch.zeros(nb, 1, dtype=torch.float64), sorted_bE.cumsum(1)], 1)
        rows.append((kept_bE[:, -1:] - kept_bE).mean(0))  # lost = total - kept, for m = 0..E
    return torch.stack(rows)


def split_budget(curves_LM: Tensor, budget: int, layer_ids: list[int] | None = None) -> dict[int, int]:
    """{layer: M_l} with sum M_l = L * budget and 1 <= M_l <= E (greedy on the loss drops)."""
    L, E = curves_LM.shape[0], curves_LM.shape[1] - 1
    if not 1 <= budget <= E:
        raise ValueError(f"budget={budget} must be in 1..{E}")
    ids = layer_ids if layer_ids is not None else list(range(L))
    m_L = [1] * L
    gain = lambda layer: float(curves_LM[layer, m_L[layer]] - curves_LM[layer, m_L[layer] + 1])
    heap = [(-gain(i), i) for i in range(L) if m_L[i] < E]  # ties: the lower layer first
    heapq.heapify(heap)
    for _ in range(L * budget - L):
        _, i = heapq.heappop(heap)
        m_L[i] += 1
        if m_L[i] < E:
            heapq.heappush(heap, (-gain(i), i))
    return {ids[i]: m_L[i] for i in range(L)}
