"""experiments/heldout/explain.py: the calibration measures against a direct computation."""
from __future__ import annotations

import math

import torch

from experiments.heldout.explain import calibration_measures


def test_calibration_measures_match_a_direct_computation():
    # one layer, 4 tokens, top-2 of 3 experts: expert 0 routed 3 times, 1 twice, 2 three times
    idx = torch.tensor([[0, 1], [0, 2], [1, 2], [0, 2]])
    w = torch.tensor([[0.5, 0.2], [0.4, 0.4], [0.3, 0.3], [0.6, 0.1]])
    norms = torch.tensor([[1.0, 2.0], [math.e, 4.0], [8.0, 2.0], [1.0, 1.0]])
    calib = {"layer0.idx_NK": idx, "layer0.w_NK": w, "layer0.norms_NK": norms}
    out = calibration_measures(calib, num_experts=3, hidden=2)
    mean_log = torch.tensor([(0 + 1 + 0) / 3, (math.log(2) + math.log(8)) / 2, (math.log(4) + math.log(2) + 0) / 3])
    assert math.isclose(out["norm_spread"], float(mean_log.std()), rel_tol=1e-6)
    assert math.isclose(out["weight_scale"], (0.7 + 0.8 + 0.6 + 0.7) / 4, rel_tol=1e-6)
    assert out["coverage"] == 2 / 2  # the fewest routed tokens (expert 1: 2) over H = 2
