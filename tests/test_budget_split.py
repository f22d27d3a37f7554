"""Per-layer budgets (base/method/budget_split.py): loss curves from calibration records, and the greedy
split that keeps the mean budget while giving experts to the layers that lose most."""
from __future__ import annotations

import pytest
import torch

from base.method.budget_split import loss_curves, split_budget
from base.method.calibration import Calibration, LayerCalib


def _calib(layers: list[tuple[list[list[int]], list[list[float]], list[list[float]]]], E: int) -> Calibration:
    out = []
    for idx, w, norms in layers:
        idx_NK = torch.tensor(idx)
        out.append(LayerCalib(torch.zeros(len(idx), 2), idx_NK, torch.tensor(w), torch.tensor(norms)))
    return Calibration(out, {"num_experts": E})


def test_loss_curves_by_hand():
    """One batch of 2 tokens, K=1: costs w^2 ||E||^2 = 4 on expert 0 and 1 on expert 2."""
    calib = _calib([([[0], [2]], [[1.0], [0.5]], [[2.0], [2.0]])], E=3)
    curve = loss_curves(calib, batch_size=2)[0]
    assert curve.tolist() == pytest.approx([5.0, 1.0, 0.0, 0.0])  # keep 0, 1, 2, 3 experts


def test_split_gives_experts_where_the_loss_drops_and_keeps_the_mean():
    curves = torch.tensor([
        [10.0, 6.0, 3.0, 1.0, 0.0],  # layer 0: every expert matters
        [1.0, 0.1, 0.0, 0.0, 0.0],  # layer 1: one expert is nearly enough
        [4.0, 2.0, 1.0, 0.5, 0.0],
    ], dtype=torch.float64)
    split = split_budget(curves, budget=2, layer_ids=[3, 5, 7])
    assert sum(split.values()) == 3 * 2 and all(1 <= m <= 4 for m in split.values())
    # from one expert each, the 3 extra go to the largest drops: layer 0's 3 and 2, then layer 0's
    # and layer 2's 1 tie and the lower layer wins; layer 1's 0.1 never does
    assert split == {3: 4, 5: 1, 7: 1}
    flat = split_budget(torch.zeros(3, 5, dtype=torch.float64), budget=2)
    assert sum(flat.values()) == 6  # nothing to lose anywhere: still the total
    assert split_budget(curves, budget=4) == {0: 4, 1: 4, 2: 4}
    with pytest.raises(ValueError, match="budget=5 must be in 1..4"):
        split_budget(curves, budget=5)
