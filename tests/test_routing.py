"""base/method/routing.py on hand-built batches: top-M selection, reassignment (backfill / drop, the three
renormalisation choices, empty slots, inactive tokens) and the per-step statistics.

Every expected value below is worked out by hand from the literal probabilities in this file.
Shapes: T tokens, E experts, K top-k.
"""
from __future__ import annotations

import pytest
import torch

from base.method.routing import (
    aggregate_E,
    pair_counts_E,
    reassign,
    select_top_m,
    step_stats,
)
from tests.helpers import ids_of, routed_batch, token_routing

# E = 6, K = 2. Weights are the model's (renormalised top-2 probabilities, w = p / sum_k p).
PROBS_TE = [
    [0.40, 0.20, 0.15, 0.10, 0.10, 0.05],  # t0 -> {0, 1}, w = [2/3, 1/3]
    [0.06, 0.45, 0.03, 0.08, 0.35, 0.03],  # t1 -> {1, 4}, w = [0.5625, 0.4375]
    [0.30, 0.05, 0.50, 0.05, 0.05, 0.05],  # t2 -> {2, 0}, w = [0.625, 0.375]
    [0.05, 0.04, 0.07, 0.04, 0.42, 0.38],  # t3 -> {4, 5}, w = [0.525, 0.475]; inactive below
]
IDX_TK = [[0, 1], [1, 4], [2, 0], [4, 5]]
W_TK = [[2 / 3, 1 / 3], [0.5625, 0.4375], [0.625, 0.375], [0.525, 0.475]]
ACTIVE_T = [True, True, True, False]
KEEP = {0, 2, 3}  # t0 loses 1, t1 loses both, t2 loses nothing, t3 (inactive) loses both


def keep_mask(ids: set[int], E: int = 6) -> torch.Tensor:
    return torch.tensor([u in ids for u in range(E)])


def hand_batch(scale: float | None = None):
    """The batch above; with `scale`, weights are p * scale instead (DeepSeek-style, no renorm)."""
    w = W_TK if scale is None else [[PROBS_TE[t][u] * scale for u in IDX_TK[t]] for t in range(4)]
    return routed_batch(PROBS_TE, IDX_TK, w, ACTIVE_T)


def run(batch, keep: set[int], mode: str = "backfill", renormalize: bool = True):
    score_E = aggregate_E(batch.topk_w_TK, batch.topk_idx_TK, batch.active_T, batch.num_experts)
    return reassign(batch, keep_mask(keep), score_E, mode, renormalize)


def assert_routing(idx_TK, w_TK, t: int, expected: dict[int, float]) -> None:
    got = token_routing(idx_TK[t], w_TK[t])
    assert got.keys() == expected.keys(), f"token {t}: experts {sorted(got)} != {sorted(expected)}"
    for u, w in expected.items():
        assert got[u] == pytest.approx(w, rel=1e-6), f"token {t}, expert {u}"


# ---- select_top_m ------------------------------------------------------------------------------
def test_select_top_m_keeps_highest_scores_of_union_only():
    score_E = torch.tensor([0.1, 5.0, 0.3, 0.2, 9.0, 0.4])
    union_E = torch.tensor([True, False, True, True, False, True])  # 1 and 4 score high but unrouted
    assert ids_of(select_top_m(score_E, union_E, 2)) == {2, 5}


def test_select_top_m_ties_go_to_lower_expert_id():
    score_E = torch.tensor([1.0, 2.0, 2.0, 0.5, 2.0, 2.0])
    union_E = torch.ones(6, dtype=torch.bool)
    assert ids_of(select_top_m(score_E, union_E, 1)) == {1}
    assert ids_of(select_top_m(score_E, union_E, 3)) == {1, 2, 4}
    union_E[2] = False
    assert ids_of(select_top_m(score_E, union_E, 3)) == {1, 4, 5}


@pytest.mark.parametrize("budget", [4, 5, 6])
def test_select_top_m_keeps_whole_union_when_it_fits(budget):
    union_E = torch.tensor([True, False, True, True, True, False])
    assert ids_of(select_top_m(torch.rand(6), union_E, budget)) == {0, 2, 3, 4}


def test_pair_counts_and_aggregate_skip_inactive_tokens():
    b = hand_batch()
    assert pair_counts_E(b.topk_idx_TK, b.active_T, 6).tolist() == [2, 2, 1, 0, 1, 0]
    score_E = aggregate_E(b.topk_w_TK, b.topk_idx_TK, b.active_T, 6)
    expected = [2 / 3 + 0.375, 1 / 3 + 0.5625, 0.625, 0.0, 0.4375, 0.0]
    assert score_E.tolist() == pytest.approx(expected, rel=1e-6)


# ---- reassign: backfill ------------------------------------------------------------------------
def test_backfill_renormalised_weights_and_order():
    idx_TK, w_TK = run(hand_batch(), KEEP, "backfill", renormalize=True)
    # t0 keeps 0 (2/3) and backfills 2 (the kept expert of highest p): 0.15 / 0.6 = 0.25;
    # rescaled to its old total 1: 2/3 / (11/12) = 8/11, 0.25 / (11/12) = 3/11.
    assert_routing(idx_TK, w_TK, 0, {0: 8 / 11, 2: 3 / 11})
    # t1 lost both: kept experts by p are 3 (0.08), 0 (0.06), 2 (0.03); it takes 3 and 0.
    assert_routing(idx_TK, w_TK, 1, {3: 0.08 / 0.14, 0: 0.06 / 0.14})
    # t3 is inactive but is still rerouted onto kept experts: 2 (0.07) and 0 (0.05).
    assert_routing(idx_TK, w_TK, 3, {2: 7 / 12, 0: 5 / 12})


def test_backfill_without_renormalisation_uses_model_scale():
    idx_TK, w_TK = run(hand_batch(), KEEP, "backfill", renormalize=False)
    # backfilled weight = p_tu * sum_k w / sum_k p; here sum_k w = 1, so p / sum_k p.
    assert_routing(idx_TK, w_TK, 0, {0: 2 / 3, 2: 0.15 / 0.60})
    assert_routing(idx_TK, w_TK, 1, {3: 0.08 / 0.80, 0: 0.06 / 0.80})
    assert_routing(idx_TK, w_TK, 3, {2: 0.07 / 0.80, 0: 0.05 / 0.80})


def test_backfill_with_scaled_weights_keeps_the_scale():
    """DeepSeek multiplies p by routed_scaling_factor and does not renormalise."""
    idx_TK, w_TK = run(hand_batch(scale=2.5), KEEP, "backfill", renormalize=False)
    assert_routing(idx_TK, w_TK, 0, {0: 0.40 * 2.5, 2: 0.15 * 2.5})
    assert_routing(idx_TK, w_TK, 1, {3: 0.08 * 2.5, 0: 0.06 * 2.5})
    idx_TK, w_TK = run(hand_batch(scale=2.5), KEEP, "backfill", renormalize=True)
    total0 = (0.40 + 0.20) * 2.5  # what t0 had before selection
    assert_routing(idx_TK, w_TK, 0, {0: total0 * 0.40 / 0.55, 2: total0 * 0.15 / 0.55})
    assert w_TK.sum(-1).tolist() == pytest.approx([1.5, 2.0, 2.0, 2.0], rel=1e-6)


def test_untouched_tokens_are_bit_identical():
    b = hand_batch()
    b.topk_w_TK = b.topk_w_TK.to(torch.bfloat16)
    for mode in ("backfill", "drop"):
        for renorm in (True, False):
            idx_TK, w_TK = run(b, KEEP, mode, renorm)
            assert w_TK.dtype == torch.bfloat16
            assert torch.equal(idx_TK[2], b.topk_idx_TK[2]) and torch.equal(w_TK[2], b.topk_w_TK[2])


def test_keep_covering_every_routed_expert_changes_nothing():
    b = hand_batch()
    for mode in ("backfill", "drop"):
        idx_TK, w_TK = run(b, {0, 1, 2, 4, 5}, mode, True)
        assert torch.equal(idx_TK, b.topk_idx_TK) and torch.equal(w_TK, b.topk_w_TK)


def test_backfill_stops_when_kept_experts_run_out():
    # K = 3; the token routes to {1, 4, 5} and only {0, 2} are kept: two slots fill, one is empty.
    probs = [[0.10, 0.30, 0.05, 0.12, 0.25, 0.18]]
    b = routed_batch(probs, [[1, 4, 5]], [[0.30 / 0.73, 0.25 / 0.73, 0.18 / 0.73]])
    idx_TK, w_TK = run(b, {0, 2}, "backfill", renormalize=False)
    assert_routing(idx_TK, w_TK, 0, {0: 0.10 / 0.73, 2: 0.05 / 0.73})
    assert set(idx_TK[0].tolist()) <= {0, 2}  # the empty slot points at a kept expert ...
    assert (w_TK[0] == 0).sum() == 1  # ... with weight 0
    idx_TK, w_TK = run(b, {0, 2}, "backfill", renormalize=True)
    assert_routing(idx_TK, w_TK, 0, {0: 2 / 3, 2: 1 / 3})


# ---- reassign: drop ----------------------------------------------------------------------------
def test_drop_keeps_survivors_only():
    idx_TK, w_TK = run(hand_batch(), KEEP, "drop", renormalize=False)
    assert_routing(idx_TK, w_TK, 0, {0: 2 / 3})
    assert_routing(idx_TK, w_TK, 1, {})
    assert_routing(idx_TK, w_TK, 3, {})
    idx_TK, w_TK = run(hand_batch(), KEEP, "drop", renormalize=True)
    assert_routing(idx_TK, w_TK, 0, {0: 1.0})  # rescaled to the total it had
    assert_routing(idx_TK, w_TK, 1, {})  # nothing left to rescale


@pytest.mark.parametrize("mode", ["backfill", "drop"])
@pytest.mark.parametrize("renorm", [True, False])
def test_every_slot_points_at_a_kept_expert(mode, renorm):
    """Empty slots use a kept expert id with weight 0 (no sentinel), for active and inactive tokens."""
    idx_TK, w_TK = run(hand_batch(), KEEP, mode, renorm)
    assert set(idx_TK.flatten().tolist()) <= KEEP
    assert torch.isfinite(w_TK).all() and (w_TK >= 0).all()


def test_unknown_reassign_mode_names_the_valid_ones():
    with pytest.raises(ValueError, match="backfill.*drop"):
        run(hand_batch(), KEEP, "nearest")


# ---- statistics --------------------------------------------------------------------------------
def test_step_stats_by_hand():
    b = hand_batch()
    b.norms_TK = torch.tensor([[1.0, 2.0], [3.0, 1.0], [2.0, 2.0], [5.0, 5.0]])
    s = step_stats(b, keep_mask(KEEP))
    assert s.union.item() == 4  # {0, 1, 2, 4}; t3's 5 does not count
    assert s.kept.item() == 3
    assert s.tokens.item() == 3
    assert s.tokens_lost.item() == 2  # t0 and t1; t3 is inactive
    assert s.weight_total.item() == pytest.approx(3.0)
    assert s.weight_kept.item() == pytest.approx(2 / 3 + 1.0)
    pairs = [(2 / 3, 1.0, True), (1 / 3, 2.0, False), (0.5625, 3.0, False), (0.4375, 1.0, False),
             (0.625, 2.0, True), (0.375, 2.0, True)]
    assert s.energy_total.item() == pytest.approx(sum((w * n) ** 2 for w, n, _ in pairs), rel=1e-6)
    assert s.energy_kept.item() == pytest.approx(sum((w * n) ** 2 for w, n, k in pairs if k), rel=1e-6)


def test_executed_counts_every_rows_final_routing():
    """Finished and padding rows still run their experts: `executed` sees them, `union` does not."""
    probs = [[0.6, 0.4, 0, 0, 0, 0], [0, 0, 0, 0, 0.5, 0.5]]
    b = routed_batch(probs, [[0, 1], [4, 5]], [[0.6, 0.4], [0.5, 0.5]], active_T=[True, False])
    keep_E = torch.tensor([True, True, False, False, False, False])
    dense = step_stats(b, keep_E)
    assert (int(dense.union), int(dense.executed)) == (2, 4)  # the inactive row runs experts 4 and 5
    rerouted = step_stats(b, keep_E, final_idx_TK=torch.tensor([[0, 1], [0, 1]]))
    assert int(rerouted.executed) == 2


# ---- SERE-style re-routing (reassign=similar) -----------------------------------------------------
# Similarity by hand: 1 is closest to 3, 4 is closest to 2 (then 0), 5 closest to 0.
SIM_EE = torch.eye(6)
for u, v, s in [(1, 3, 0.9), (1, 0, 0.5), (4, 2, 0.8), (4, 0, 0.7), (5, 0, 0.6), (5, 3, 0.1)]:
    SIM_EE[u, v] = SIM_EE[v, u] = s


def test_similar_moves_each_dropped_pair_to_its_most_similar_kept_expert_with_its_weight():
    batch = hand_batch()
    score_E = aggregate_E(batch.topk_w_TK, batch.topk_idx_TK, batch.active_T, batch.num_experts)
    idx_TK, w_TK = reassign(batch, keep_mask(KEEP), score_E, "similar", True, SIM_EE)
    # t0 {0, 1}: 1 -> 3; t1 {1, 4}: 1 -> 3, 4 -> 2; t2 keeps {2, 0}; t3 {4, 5}: 4 -> 2, 5 -> 0
    assert idx_TK.tolist() == [[0, 3], [3, 2], [2, 0], [2, 0]]
    assert torch.equal(w_TK, batch.topk_w_TK)  # weights travel with their pairs, totals unchanged


def test_similar_substitute_already_held_is_counted_twice_like_a_summed_weight():
    batch = routed_batch([[0.5, 0.3, 0.2]], [[0, 1]], [[0.6, 0.4]])
    sim = torch.tensor([[1.0, 0.9, 0.0], [0.9, 1.0, 0.1], [0.0, 0.1, 1.0]])
    idx_TK, w_TK = reassign(batch, torch.tensor([True, False, True]), torch.ones(3), "similar", True, sim)
    assert idx_TK.tolist() == [[0, 0]] and w_TK[0].tolist() == pytest.approx([0.6, 0.4])


def test_similar_without_a_similarity_fails_clearly():
    batch = hand_batch()
    with pytest.raises(ValueError, match="needs the expert similarity"):
        reassign(batch, keep_mask(KEEP), torch.ones(6), "similar", True, None)


def test_expert_similarity_is_cosine_of_outputs_on_shared_inputs():
    """Three experts of a real transformers experts module, the third a copy of the first."""
    from base.method.similarity import expert_similarity_EE
    from tests.helpers import tiny_qwen3

    model = tiny_qwen3(num_experts=3, top_k=2)
    experts = model.model.layers[0].mlp.experts
    with torch.no_grad():
        experts.gate_up_proj[2].copy_(experts.gate_up_proj[0])
        experts.down_proj[2].copy_(experts.down_proj[0])
    H = model.config.hidden_size
    sim = expert_similarity_EE(experts, torch.randn(40, H, generator=torch.Generator().manual_seed(1)), 3)
    assert torch.allclose(sim, sim.t()) and torch.allclose(sim.diagonal(), torch.ones(3), atol=1e-5)
    assert sim[0, 2] == pytest.approx(1.0, abs=1e-5) and sim[0, 1] < 0.99
