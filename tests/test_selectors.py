"""Every selector on one hand-built decode batch: the exact kept set, worked out by hand.

Shapes: T = 4 tokens, E = 6 experts, K = 2, H = 2. Weights are multiples of 1/8 so scores and ties
are exact in fp32. Expert 5 is routed by nobody, so it must never be kept.
"""
from __future__ import annotations

import math

import pytest
import torch

from base.method.routing import reassign
from base.method.selectors import SELECTORS, Artifacts, build_selector
from tests.helpers import BUDGETED, ids_of, routed_batch, top_m_by_hand

PROBS_TE = [
    [0.70, 0.10, 0.05, 0.05, 0.05, 0.05],
    [0.05, 0.30, 0.50, 0.05, 0.05, 0.05],
    [0.10, 0.05, 0.35, 0.40, 0.05, 0.05],  # routed [2, 3]: the slot order is not the p order
    [0.10, 0.30, 0.05, 0.03, 0.50, 0.02],
]
IDX_TK = [[0, 1], [1, 2], [2, 3], [1, 4]]
W_TK = [[7 / 8, 1 / 8], [3 / 8, 5 / 8], [4 / 8, 4 / 8], [3 / 8, 5 / 8]]
Z_TH = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
NORMS_TK = [[0.5, 4.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]  # true ||E_u(z_t)|| for oracle

LN2 = math.log(2.0)
FREQ_E = [0.1, 0.2, 0.05, 0.4, 0.3, 0.9]
ENERGY_E = [1.0, 4.0, 1.0, 8.0, 1.0, 1.0]
PRED_W_HE = torch.zeros(2, 6)
PRED_W_HE[0, 0] = -LN2  # t0 (z = [1, 0]) on expert 0: exp(2 g) = 1/4
PRED_W_HE[1, 4] = LN2  # t3 (z = [1, 1]) on expert 4: exp(2 g) = 4
PRED_B_E = torch.zeros(6)
PRED_B_E[3] = LN2  # expert 3 for everyone: exp(2 b) = 4
ARTIFACTS = Artifacts(
    freq_LE=torch.tensor([FREQ_E]), energy_LE=torch.tensor([ENERGY_E]),
    pred_w_LHE=PRED_W_HE[None], pred_b_LE=PRED_B_E[None],
)

# Hand scores over the union {0, 1, 2, 3, 4}.
# router_sum (x1/8): 0: 7, 1: 1+3+3, 2: 5+4, 3: 4, 4: 5
# router_sq (x1/64): 0: 49, 1: 1+9+9, 2: 25+16, 3: 16, 4: 25
# count: 0: 1, 1: 3, 2: 2, 3: 1, 4: 1, ties by router_sum
# calib_energy (x1/64): router_sq * ENERGY_E = 49, 76, 41, 128, 25
# base (x1/64): router_sq * exp(2 g) = 49/4, 19, 41, 16*4, 25*4
# oracle (x1/64): 0: 49/4, 1: 1*16 + 9 + 9, 2: 41, 3: 16, 4: 25
SCORES = {
    "router_sum": {0: 7 / 8, 1: 7 / 8, 2: 9 / 8, 3: 4 / 8, 4: 5 / 8},
    "router_sq": {0: 49 / 64, 1: 19 / 64, 2: 41 / 64, 3: 16 / 64, 4: 25 / 64},
    "calib_freq": {u: FREQ_E[u] for u in range(5)},
    "calib_energy": {0: 49 / 64, 1: 76 / 64, 2: 41 / 64, 3: 128 / 64, 4: 25 / 64},
    "base": {0: 49 / 256, 1: 19 / 64, 2: 41 / 64, 3: 64 / 64, 4: 100 / 64},
    "oracle": {0: 49 / 256, 1: 34 / 64, 2: 41 / 64, 3: 16 / 64, 4: 25 / 64},
    # first choices by probability: t0 -> 0 (7/8), t1 -> 2 (5/8), t2 -> 3 (4/8: slot 1, not 0),
    # t3 -> 4 (5/8); they score R + 1 + their weight, R = 4 the batch's total weight; 1 scores router_sum
    "top1_union": {0: 5 + 7 / 8, 1: 7 / 8, 2: 5 + 5 / 8, 3: 5 + 4 / 8, 4: 5 + 5 / 8},
}
KEPT = {  # (selector, M) -> kept set
    ("router_sum", 1): {2}, ("router_sum", 2): {0, 2}, ("router_sum", 3): {0, 1, 2},  # 0/1 tie: 0
    ("router_sq", 2): {0, 2}, ("router_sq", 3): {0, 2, 4},
    ("count", 2): {1, 2}, ("count", 3): {0, 1, 2},
    ("count", 4): {0, 1, 2, 4},  # 0, 3, 4 tie on count; router_sum ranks 0 > 4 > 3, not the id
    ("calib_freq", 2): {3, 4}, ("calib_freq", 3): {1, 3, 4},  # expert 5 (freq 0.9) is not routed
    ("calib_energy", 2): {1, 3}, ("calib_energy", 3): {0, 1, 3},
    ("base", 2): {3, 4}, ("base", 3): {2, 3, 4},
    ("oracle", 2): {1, 2}, ("oracle", 3): {1, 2, 4},
    ("top1_union", 2): {0, 2}, ("top1_union", 3): {0, 2, 4},  # 2/4 tie: 2
    ("top1_union", 4): {0, 2, 3, 4},  # every first choice before expert 1 (router_sum 7/8 > 3's 4/8)
}
UNION = {0, 1, 2, 3, 4}


def hand_batch(active_T=None):
    return routed_batch(PROBS_TE, IDX_TK, W_TK, active_T, z_TH=Z_TH.clone(), norms_TK=NORMS_TK)


def make(name: str, k0: int | None = None):
    return build_selector(name, ARTIFACTS, k0=k0)


@pytest.mark.parametrize("name", sorted(SCORES))
def test_scores_by_hand(name):
    score_E = make(name).score(hand_batch())
    got = {u: score_E[u].item() for u in UNION}
    assert got == pytest.approx(SCORES[name], rel=1e-5)


@pytest.mark.parametrize(("name", "budget"), sorted(KEPT))
def test_kept_set_by_hand(name, budget):
    keep_E, _ = make(name).keep(hand_batch(), budget)
    assert ids_of(keep_E) == KEPT[name, budget]


@pytest.mark.parametrize("name", sorted(SCORES))
def test_kept_set_is_top_m_of_hand_scores(name):
    for budget in range(1, 6):
        keep_E, _ = make(name).keep(hand_batch(), budget)
        assert ids_of(keep_E) == top_m_by_hand(SCORES[name], budget), f"M={budget}"


def test_count_tie_broken_by_router_sum_not_by_id():
    # Experts 1 and 4 both have 2 tokens; 4 carries more weight (1.3 vs 0.7).
    probs = [[0.1, 0.3, 0.0, 0.0, 0.6, 0.0], [0.1, 0.3, 0.0, 0.0, 0.6, 0.0]]
    b = routed_batch(probs, [[1, 4], [4, 1]], [[0.3, 0.7], [0.6, 0.4]])
    assert ids_of(make("count").keep(b, 1)[0]) == {4}
    # A third token on expert 1, with almost no weight, makes count prefer it; router_sum does not.
    b = routed_batch(probs + [[0.9, 0.1, 0, 0, 0, 0]], [[1, 4], [4, 1], [0, 1]], [[0.3, 0.7], [0.6, 0.4], [0.99, 0.01]])
    assert ids_of(make("count").keep(b, 1)[0]) == {1}
    assert ids_of(make("router_sum").keep(b, 1)[0]) == {4}


def test_fixed_keeps_the_lowest_ids_of_the_union_whatever_the_weights():
    for budget in range(1, 6):
        want = set(sorted(UNION)[:budget])
        assert ids_of(make("fixed").keep(hand_batch(), budget)[0]) == want
    heavier = hand_batch()
    heavier.topk_w_TK = heavier.topk_w_TK.flip(-1)  # other weights: the same kept set
    assert ids_of(make("fixed").keep(heavier, 2)[0]) == set(sorted(UNION)[:2])


def test_oea_keeps_union_of_each_tokens_top_k0_by_probability():
    sel = make("oea", k0=1)
    assert sel.uses_budget is False
    keep_E, _ = sel.keep(hand_batch(), None)
    # top-1 by p: t0 -> 0, t1 -> 2, t2 -> 3 (p 0.40 > 0.35, though listed second), t3 -> 4
    assert ids_of(keep_E) == {0, 2, 3, 4}
    assert ids_of(sel.keep(hand_batch(), 1)[0]) == {0, 2, 3, 4}  # the budget is ignored
    assert ids_of(make("oea", k0=2).keep(hand_batch(), None)[0]) == UNION
    assert ids_of(make("oea", k0=1).keep(hand_batch([True, True, True, False]), None)[0]) == {0, 2, 3}


# ---- inactive tokens ---------------------------------------------------------------------------
ALL_NAMES = [*BUDGETED, "oea"]


@pytest.mark.parametrize("name", ALL_NAMES)
def test_inactive_tokens_neither_score_nor_join_the_union(name):
    """t3 is inactive: expert 4 (routed only by t3) is never kept, and t3's routing is irrelevant."""
    sel = make(name, k0=1 if name == "oea" else None)
    active = [True, True, True, False]
    other = hand_batch(active)
    other.topk_idx_TK[3] = torch.tensor([5, 3])  # change everything about t3
    other.topk_w_TK[3] = torch.tensor([0.9, 0.8])
    other.probs_TE[3] = torch.tensor([0.0, 0.0, 0.0, 0.2, 0.0, 0.8])
    other.z_TH[3] = torch.tensor([5.0, -5.0])
    other.norms_TK[3] = torch.tensor([9.0, 9.0])
    for budget in range(1, 6):
        keep_E, _ = sel.keep(hand_batch(active), budget)
        assert ids_of(keep_E) <= {0, 1, 2, 3}, f"M={budget}"
        assert torch.equal(keep_E, sel.keep(other, budget)[0]), f"M={budget}"


def test_inactive_token_changes_router_sum_by_hand():
    # Without t3: 0: 7/8, 1: 4/8, 2: 9/8, 3: 4/8 -> M=3 keeps {2, 0} and 1 (ties 3, lower id).
    keep_E, score_E = make("router_sum").keep(hand_batch([True, True, True, False]), 3)
    assert score_E[:5].tolist() == pytest.approx([7 / 8, 4 / 8, 9 / 8, 4 / 8, 0.0])
    assert ids_of(keep_E) == {0, 1, 2}


def test_inactive_token_rerouted_to_kept_experts_only():
    b = hand_batch([True, True, True, False])
    sel = make("router_sum")
    keep_E, score_E = sel.keep(b, 2)  # {0, 2}
    idx_TK, w_TK = reassign(b, keep_E, score_E, "backfill", True)
    assert set(idx_TK[3].tolist()) <= {0, 2}  # t3 routed {1, 4}; backfills 0 (p 0.10) and 2 (0.05)
    assert w_TK[3].sum().item() == pytest.approx(1.0)


# ---- budget >= union ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL_NAMES)
@pytest.mark.parametrize("mode", ["backfill", "drop"])
def test_union_within_budget_leaves_routing_bit_identical(name, mode):
    b = hand_batch()
    sel = make(name, k0=2 if name == "oea" else None)
    for budget in (5, 6):  # the union has 5 experts
        keep_E, score_E = sel.keep(b, budget)
        assert ids_of(keep_E) == UNION
        idx_TK, w_TK = reassign(b, keep_E, score_E, mode, True)
        assert torch.equal(idx_TK, b.topk_idx_TK) and torch.equal(w_TK, b.topk_w_TK)


# ---- registry and construction -----------------------------------------------------------------
def test_unknown_selector_lists_valid_names():
    with pytest.raises(KeyError) as err:
        build_selector("router_summ")
    message = str(err.value)
    assert "router_summ" in message
    for name in SELECTORS.names():
        assert name in message
    assert set(ALL_NAMES) <= set(SELECTORS.names())


@pytest.mark.parametrize(("name", "what"), [("calib_freq", "calibration"), ("calib_energy", "calibration"),
                                             ("base", "predictor")])
def test_selectors_without_their_artifacts_fail_clearly(name, what):
    with pytest.raises(ValueError, match=what):
        build_selector(name)


def test_oea_needs_k0():
    with pytest.raises(ValueError, match="k0"):
        build_selector("oea")


def test_oracle_without_norms_fails_clearly():
    b = hand_batch()
    b.norms_TK = None
    with pytest.raises(RuntimeError, match="norms"):
        make("oracle").score(b)


# ---- base_anchor and coverage (issue 10) ---------------------------------------------------------
@pytest.mark.parametrize(("budget", "kept"), [
    (2, {3, 4}),  # anchors {0, 2, 3, 4} exceed M: the two of highest base cost (4, 3)
    (3, {2, 3, 4}),
    (4, {0, 2, 3, 4}),  # every anchor, although base ranks 1 (19/64) above anchor 0 (49/256)
    (5, UNION),
])
def test_base_anchor_keeps_first_choices_then_fills_by_base_cost(budget, kept):
    keep_E, cost_E = make("base_anchor", k0=1).keep(hand_batch(), budget)
    assert ids_of(keep_E) == kept
    assert {u: cost_E[u].item() for u in UNION} == pytest.approx(SCORES["base"], rel=1e-5)


def test_base_anchor_with_every_expert_anchored_is_base():
    """k0=2 makes every routed expert an anchor here, so the kept set is BASE's own top-M."""
    keep_E, _ = make("base_anchor", k0=2).keep(hand_batch(), 4)
    assert ids_of(keep_E) == top_m_by_hand(SCORES["base"], 4)  # all are anchors: ranked by cost


@pytest.mark.parametrize(("name", "coverage", "budget", "kept"), [
    # base cost, sorted: 4 (42.3 %), 3 (69.4 % cumulative), 2 (86.8 %), 1 (94.8 %), 0
    ("base", 0.4, None, {4}), ("base", 0.5, None, {3, 4}), ("base", 0.9, None, {1, 2, 3, 4}),
    ("base", 1.0, None, UNION), ("base", 0.9, 3, {2, 3, 4}),  # capped by the budget
    # router_sum: 2 (28 %), 0 (50 %: exactly the target, so 2 experts), 1, 4, 3
    ("router_sum", 0.5, None, {0, 2}), ("router_sum", 0.51, None, {0, 1, 2}),
])
def test_coverage_keeps_the_fewest_experts_covering_the_share(name, coverage, budget, kept):
    sel = build_selector(name, ARTIFACTS, coverage=coverage)
    keep_E, _ = sel.keep(hand_batch(), budget)
    assert ids_of(keep_E) == kept


def test_coverage_is_refused_where_scores_are_not_costs():
    for name in ("count", "fixed", "calib_freq", "top1_union"):
        with pytest.raises(ValueError, match="coverage=0.5: needs 0 < coverage <= 1 and a selector of base"):
            build_selector(name, ARTIFACTS, coverage=0.5)
    with pytest.raises(ValueError, match="needs 0 < coverage <= 1"):
        build_selector("base", ARTIFACTS, coverage=1.5)


def test_base_anchor_needs_k0():
    with pytest.raises(ValueError, match="base_anchor needs k0 >= 1"):
        build_selector("base_anchor", ARTIFACTS)


@pytest.mark.parametrize(("name", "k0", "budget", "kept"), [
    # k0=1 anchors the first choices {0, 2, 3, 4}; xshare ranks by router_sum, lynx by count
    ("xshare", 1, 2, {0, 2}), ("xshare", 1, 3, {0, 2, 4}), ("xshare", 1, 4, {0, 2, 3, 4}),
    ("lynx", 1, 2, {0, 2}), ("lynx", 1, 3, {0, 2, 4}), ("lynx", 1, 4, {0, 2, 3, 4}),
    # k0=2 anchors every routed expert: each falls back to its own ranking
    ("xshare", 2, 2, {0, 2}),  # router_sum 2 (9/8), then 0/1 tie (7/8): 0
    ("lynx", 2, 2, {1, 2}),  # count: 1 (3 tokens), 2 (2 tokens)
])
def test_peer_rules_guarantee_first_choices_then_rank_by_their_own_score(name, k0, budget, kept):
    keep_E, _ = make(name, k0=k0).keep(hand_batch(), budget)
    assert ids_of(keep_E) == kept
