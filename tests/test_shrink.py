"""Issue 41: `base` with its predicted norms shrunk toward a layer constant (method.shrink = alpha).
The endpoints are exactly the two rules it interpolates: alpha = 0 is `router_sq` (score values
and kept sets), alpha = 1 is `base`; in between the kept set is that of sum_t w^2 exp(2 alpha g)
computed by hand. Under both backends (the Triton kernel through the interpreter)."""
from __future__ import annotations

import pytest
import torch

from base.method.selectors import build_selector
from tests.helpers import random_artifacts, random_batch


@pytest.mark.parametrize("seed", range(8))
def test_the_shrink_endpoints_are_router_sq_and_base_exactly(seed):
    arts = random_artifacts(L=2, E=8, H=4, seed=seed)
    batch = random_batch(seed, T=12, E=8, K=2, H=4, layer=seed % 2)
    for budget in (2, 3, 5):
        zero, sq = build_selector("base", arts, shrink=0.0), build_selector("router_sq", arts)
        assert torch.equal(zero.score(batch), sq.score(batch))
        assert torch.equal(zero.keep(batch, budget)[0], sq.keep(batch, budget)[0])
        one, base = build_selector("base", arts, shrink=1.0), build_selector("base", arts)
        assert torch.equal(one.score(batch), base.score(batch))
        half = build_selector("base", arts, shrink=0.5)
        g_TK = batch.z_TH @ arts.pred_w_LHE[batch.layer] + arts.pred_b_LE[batch.layer]
        g_TK = g_TK.gather(1, batch.topk_idx_TK)
        by_hand = torch.zeros(8).index_add_(0, batch.topk_idx_TK[batch.active_T].flatten(),
                                            (batch.topk_w_TK ** 2 * torch.exp(g_TK))[batch.active_T].flatten())
        torch.testing.assert_close(half.score(batch), by_hand, rtol=1e-5, atol=1e-6)


# fast tier: seed 0; seeds 1 and 2 (the same check on other random weights and batches) under make test-all
@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2))])
def test_the_kernel_runs_the_shrunk_rule_as_the_reference(seed):
    arts = random_artifacts(L=1, E=16, H=8, seed=seed)
    batch = random_batch(seed, T=10, E=16, K=4, H=8)
    from base.method.backends import TritonSelection
    from base.method.policy import Policy

    for alpha in (0.0, 0.3, 1.0):
        sel = build_selector("base", arts, shrink=alpha)
        ref_keep, _ = sel.keep(batch, 5)
        kernel = TritonSelection(Policy(sel, 5), 0, 16, torch.device("cpu"), None)  # select after the router
        assert torch.equal(kernel.select(batch).keep_E.cpu(), ref_keep)


def test_shrink_is_refused_where_there_is_no_predictor_or_out_of_range():
    arts = random_artifacts(L=1, E=8, H=4)
    with pytest.raises(ValueError, match="a selector with a predictor"):
        build_selector("router_sum", arts, shrink=0.5)
    with pytest.raises(ValueError, match="needs 0 <= shrink <= 1"):
        build_selector("base", arts, shrink=1.5)
