"""The statistics behind the calls (analysis/stats.py), each against an independent reference:
the binomial sum for McNemar, a numerical constrained MLE for Tango's score statistic, exact
enumeration for the interval's coverage, and constructed data for the bootstrap and the calls."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from analysis import stats as S


def test_exact_mcnemar_is_the_two_sided_binomial_sum():
    for a, b in [(10, 0), (4, 0), (7, 3), (3, 3), (0, 1)]:
        n, k = a + b, min(a, b)
        ref = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)
        assert S.mcnemar_exact(a, b) == pytest.approx(ref)
    assert S.mcnemar_exact(0, 0) == 1.0


def _score_by_mle(a_only: int, b_only: int, n: int, delta: float) -> float:
    """Tango's statistic from its definition: maximise the multinomial likelihood numerically under
    p_A - p_B = delta (p12 = q + delta, p21 = q), then (a - b - n delta) / sqrt(n (p12 + p21 - delta^2))."""
    rest = n - a_only - b_only
    lo, hi = max(0.0, -delta) + 1e-12, (1 - delta) / 2 - 1e-12

    def nll(q):
        ll = b_only * math.log(q) + a_only * math.log(q + delta)
        return -(ll + (rest * math.log(1 - 2 * q - delta) if rest else 0.0))

    q = optimize.minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-13}).x
    return (a_only - b_only - n * delta) / math.sqrt(n * (2 * q + delta - delta**2))


@pytest.mark.parametrize("a_only, b_only, n", [(4, 0, 200), (10, 3, 100), (7, 9, 60), (25, 5, 400)])
def test_tango_statistic_matches_its_likelihood_definition(a_only, b_only, n):
    for delta in (-0.05, -0.01, 0.01, 0.03, 0.08):
        assert S.tango_z(a_only, b_only, n, delta) == pytest.approx(_score_by_mle(a_only, b_only, n, delta), rel=1e-5)
    low, high = S.tango_interval(a_only, b_only, n)
    z = stats.norm.ppf(0.975)
    assert low < (a_only - b_only) / n < high
    assert S.tango_z(a_only, b_only, n, low) == pytest.approx(z, abs=1e-6)
    assert S.tango_z(a_only, b_only, n, high) == pytest.approx(-z, abs=1e-6)


def test_tango_interval_keeps_its_level_by_exact_enumeration():
    """Coverage over every outcome of 40 paired prompts, few discordant expected (where a
    percentile bootstrap is liberal): at least 93 % for a nominal 95 %."""
    n = 40
    for p12, p21 in [(0.05, 0.02), (0.1, 0.1), (0.02, 0.0), (0.15, 0.05)]:
        delta, cover = p12 - p21, 0.0
        for a in range(n + 1):
            for b in range(n + 1 - a):
                prob = math.comb(n, a) * math.comb(n - a, b) * p12**a * p21**b * (1 - p12 - p21) ** (n - a - b)
                if prob < 1e-12:
                    continue
                low, high = S.tango_interval(a, b, n)
                cover += prob * (low <= delta <= high)
        assert cover >= 0.93, (p12, p21, cover)


def test_few_discordant_prompts_one_way_are_not_a_difference():
    """The issue's case: 4 of 200 prompts differ, all one way. The percentile bootstrap of the
    mean difference excludes zero; the exact test does not reject, so the call is not 'higher'."""
    a, b = np.ones(200), np.ones(200)
    b[:4] = 0
    rng = np.random.default_rng(0)
    boot = (a - b)[rng.integers(0, 200, size=(4000, 200))].mean(1)
    assert np.percentile(boot, 2.5) > 0  # what the old analysis called a difference
    c = S.paired_accuracy(a, b)
    assert c.p == pytest.approx(0.125) and (c.a_only, c.b_only) == (4, 0)
    t = S.grid_calls(_table([c]))
    assert t["call"].iloc[0] == "inconclusive"


def _table(comparisons):
    import pandas as pd

    return pd.DataFrame([c.row() for c in comparisons])


def test_tie_needs_the_equivalence_test_and_enough_prompts():
    same = S.paired_accuracy(np.ones(800), np.ones(800))
    small = S.paired_accuracy(np.r_[np.ones(40), np.zeros(10)], np.r_[np.ones(40), np.zeros(10)])
    t = S.grid_calls(_table([same, small]))
    assert list(t["call"]) == ["tie", "inconclusive"]  # 50 identical prompts cannot bound 1 point
    assert 0 < t["mdd"].iloc[0] < t["mdd"].iloc[1]  # no discordant prompt still bounds what 800 detect


def test_holm_turns_an_isolated_hit_among_many_calls_into_inconclusive():
    rng = np.random.default_rng(1)
    a = (rng.random(400) < 0.8).astype(float)
    b = a.copy()
    flip = rng.choice(np.flatnonzero(a == 1), 14, replace=False)
    b[flip] = 0
    b[rng.choice(np.flatnonzero(a == 0), 3, replace=False)] = 1  # 14 vs 3 discordant: p about 0.013
    hit = S.paired_accuracy(a, b)
    assert 0.005 < hit.p < 0.05
    assert S.grid_calls(_table([hit]))["call"].iloc[0] == "higher"
    nulls = [S.paired_accuracy(a, a) for _ in range(9)]
    assert S.grid_calls(_table([hit, *nulls]))["call"].iloc[0] == "inconclusive"


def test_cluster_bootstrap_keeps_a_cluster_together_and_weights_tokens():
    """kl per token: a ratio of sums. Prompts with many tokens weigh more; the paired difference
    of identical runs is exactly zero with a zero-width interval."""
    tokens = np.array([1.0, 1.0, 98.0])
    kl_a, kl_b = np.array([1.0, 1.0, 0.98]), np.array([0.0, 0.0, 0.98])
    c = S.paired_ratio(kl_a, kl_b, tokens, "kl")
    assert c.diff == pytest.approx(2 / 100)  # not the mean of per-prompt means (2/3)
    same = S.paired_ratio(kl_a, kl_a, tokens, "kl")
    assert (same.diff, same.low, same.high, same.p) == (0.0, 0.0, 0.0, 1.0)


def test_paired_ratio_finds_a_real_difference_and_calls_ties_within_the_margin():
    rng = np.random.default_rng(2)
    tokens = rng.integers(5, 20, 600).astype(float)
    kl_b = rng.gamma(2.0, 0.02, 600) * tokens
    worse = S.paired_ratio(kl_b * 1.5 + 0.01 * tokens, kl_b, tokens, "kl")
    near = S.paired_ratio(kl_b + rng.normal(0, 1e-4, 600) * tokens, kl_b, tokens, "kl")
    t = S.grid_calls(_table([worse, near]))
    assert list(t["call"]) == ["higher", "tie"]
    assert worse.low <= worse.diff <= worse.high


def test_layer_ratios_are_averaged_over_layers_as_the_run_summary_states_them():
    err = np.array([[1.0, 0.0], [1.0, 2.0]])
    dense = np.array([[10.0, 10.0], [10.0, 10.0]])
    c = S.paired_ratio(err, np.zeros_like(err), dense, "out_error")
    assert c.diff == pytest.approx(np.mean([2 / 20, 2 / 20]))


def test_accuracy_intervals_stay_inside_zero_and_one():
    for correct in (np.ones(30), np.r_[np.ones(29), 0.0], np.array([0.0, 0.5, 1.0, 1.0])):
        mean, low, high = S.accuracy_interval(correct)
        assert 0.0 <= low <= mean <= high <= 1.0


def test_several_seeds_use_the_permutation_test_over_prompts():
    a = np.array([1.0, 1.0, 0.5, 1.0] * 50)
    b = np.array([1.0, 0.5, 0.5, 0.0] * 50)
    c = S.paired_accuracy(a, b)
    assert c.test.startswith("sign-flip permutation") and c.p < 0.01 and c.low < c.diff < c.high
