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


def _table(comparisons, metric: str = "accuracy"):
    import pandas as pd

    return pd.DataFrame([c.row() for c in comparisons]).assign(metric=metric)


def test_tie_needs_the_equivalence_test_and_enough_prompts():
    same = S.paired_accuracy(np.ones(800), np.ones(800))
    small = S.paired_accuracy(np.r_[np.ones(40), np.zeros(10)], np.r_[np.ones(40), np.zeros(10)])
    t = S.grid_calls(_table([same, small]), tie_metrics=("accuracy",))  # a grid planned for accuracy ties
    assert list(t["call"]) == ["tie", "inconclusive"]  # 50 identical prompts cannot bound 1 point
    assert 0 < t["mdd"].iloc[0] < t["mdd"].iloc[1]  # no discordant prompt still bounds what 800 detect


@pytest.mark.slow
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
    t = S.grid_calls(_table([worse, near], "kl"))
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


# ---- issue 27: families, the cross-grid correction, planning, crossed seeds, sign flips ---------

def _bh_by_hand(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg from its definition: q_(i) = min over j >= i of p_(j) m / j, capped at 1."""
    order = np.argsort(p)
    m = len(p)
    scaled = p[order] * m / np.arange(1, m + 1)
    q_sorted = np.minimum.accumulate(scaled[::-1])[::-1]
    q = np.empty(m)
    q[order] = np.minimum(q_sorted, 1.0)
    return q


def test_bh_matches_its_definition_and_leaves_nan_out():
    rng = np.random.default_rng(3)
    for m in (1, 7, 200):
        p = np.r_[rng.uniform(size=m // 2), rng.uniform(0, 1e-3, size=m - m // 2)]
        assert np.allclose(S.bh(p), _bh_by_hand(p))
    p = np.array([0.01, np.nan, 0.04, 0.03])
    q = S.bh(p)
    assert np.isnan(q[1]) and np.allclose(q[[0, 2, 3]], _bh_by_hand(p[[0, 2, 3]]))
    assert (S.bh(p[[0, 2, 3]]) <= S.holm(p[[0, 2, 3]]) + 1e-15).all()  # BH never stricter than Holm


def _row(metric: str, p: float, p_tost: float = 1.0, diff: float = 0.0, excluded: str = "") -> dict:
    return {"metric": metric, "diff": diff, "p": p, "p_tost": p_tost, "se": 0.01, "excluded": excluded}


@pytest.mark.slow
def test_grid_calls_leave_mirrors_and_null_rows_out_of_the_family():
    import pandas as pd

    rows = [_row("accuracy", 0.01, diff=0.05), _row("kl", 0.02, diff=-0.01), _row("dll", 1e-6, diff=0.01),
            _row("accuracy", 1.0, 1e-9, excluded="null by construction: dense")]
    t = S.grid_calls(pd.DataFrame(rows))
    assert list(t["call"]) == ["higher", "lower", S.EXCLUDED, S.EXCLUDED]
    assert t["excluded"].iloc[2].startswith("mirrors kl") and t["excluded"].iloc[3] == "null by construction: dense"
    assert np.allclose(t["p_holm"].iloc[:2], S.holm(np.array([0.01, 0.02])))  # a family of two, not four
    assert t["p_holm"].iloc[2:].isna().all()
    assert t["mdd"].iloc[0] == pytest.approx(S.mdd(0.01, 2))


@pytest.mark.slow
def test_accuracy_is_never_a_tie_unless_planned_for():
    import pandas as pd

    rows = [_row("accuracy", 1.0, 1e-9), _row("kl", 1.0, 1e-9)]
    assert list(S.grid_calls(pd.DataFrame(rows))["call"]) == ["inconclusive", "tie"]
    assert list(S.grid_calls(pd.DataFrame(rows), tie_metrics=("accuracy", "kl"))["call"]) == ["tie", "tie"]


def _paired_outcomes(rng, n: int, discordance: float, diff: float) -> tuple[np.ndarray, np.ndarray]:
    """n prompts: A right and B wrong with probability (discordance + diff) / 2, the reverse
    (discordance - diff) / 2, else both the same."""
    u = rng.random(n)
    a_only, b_only = u < (discordance + diff) / 2, (u >= (discordance + diff) / 2) & (u < discordance)
    a = np.where(a_only, 1.0, np.where(b_only, 0.0, 1.0))
    b = np.where(b_only, 1.0, np.where(a_only, 0.0, 1.0))
    return a, b


def test_detect_n_gives_the_mdd_power_by_simulation():
    """At detect_n prompts the exact McNemar test at ALPHA / m finds the difference about 80 % of the
    time (mdd's formula, checked against the test it plans for)."""
    rng = np.random.default_rng(4)
    discordance, diff, m = 0.2, 0.1, 3
    n = S.detect_n(discordance, diff, m)
    assert S.mdd(np.sqrt(discordance / n), m) == pytest.approx(diff, rel=0.01)
    hits = 0
    for _ in range(600):
        a, b = _paired_outcomes(rng, n, discordance, diff)
        hits += S.mcnemar_exact(int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())) < S.ALPHA / m
    assert 0.72 <= hits / 600 <= 0.86


def test_equivalence_n_gives_the_tost_its_power_by_simulation():
    """At equivalence_n prompts Tango's TOST (the one paired_accuracy computes) passes about 80 % of
    the time when the rules are the same on average; at a tenth of it, almost never."""
    rng = np.random.default_rng(5)
    discordance, margin = 0.1, 0.05
    n = S.equivalence_n(discordance, margin)
    assert S.equivalence_power(discordance, n, margin) >= S.POWER > S.equivalence_power(discordance, n - 1, margin)
    for size, lo, hi in ((n, 0.72, 0.88), (n // 10, 0.0, 0.05)):
        passed = sum(S.paired_accuracy(*_paired_outcomes(rng, size, discordance, 0.0), margin=margin).p_tost < S.ALPHA
                     for _ in range(300))
        assert lo <= passed / 300 <= hi, (size, passed)
    with pytest.raises(ValueError, match="outside the margin"):
        S.equivalence_n(0.1, 0.01, diff=0.02)


def test_crossed_seed_and_prompt_error_matches_simulation_and_keeps_the_tost_level():
    """Prompts and batching seeds as crossed random factors (a prompt effect, a seed effect shared
    by all prompts of a seed, noise): the standard error `crossed` gives matches the spread of the
    estimate over repeated draws, and its TOST at a true difference on the margin passes at most
    about ALPHA of the time."""
    rng = np.random.default_rng(6)
    prompts, seeds, margin = 300, 3, 0.01
    estimates, ses, passed = [], [], 0
    for _ in range(400):
        d = (margin + rng.normal(0, 0.05, (prompts, 1)) + rng.normal(0, 0.008, (1, seeds))
             + rng.normal(0, 0.05, (prompts, seeds)))
        per_prompt, per_seed = d.mean(1), d.mean(0)
        c = S.crossed(per_prompt.mean(), per_prompt.std(ddof=1) / np.sqrt(prompts), per_seed, prompts, margin)
        estimates.append(c.diff)
        ses.append(c.se)
        passed += c.p_tost < S.ALPHA
        assert c.low < c.diff < c.high
    assert np.median(ses) == pytest.approx(np.std(estimates), rel=0.25)
    assert passed / 400 <= 0.08
    with pytest.raises(ValueError, match="two batching seeds"):
        S.crossed(0.0, 0.01, [0.1], prompts)


def test_se_from_tost_recovers_the_standard_error():
    for diff, se in ((0.0, 0.0035), (0.0089, 0.0046), (-0.004, 0.002)):
        assert S.se_from_tost(diff, S.tost_normal(diff, se, 0.01), 0.01) == pytest.approx(se, rel=1e-6)


def _sign_flip_by_brute_force(d: np.ndarray, delta: float) -> float:
    import itertools

    obs = abs((d - delta).sum())
    flips = [abs(np.dot(s, d - delta)) >= obs - 1e-9 for s in itertools.product((-1, 1), repeat=len(d))]
    return float(np.mean(flips))


def test_sign_flip_matches_enumeration_and_its_interval_inverts_the_test():
    d = np.array([1.0, 1.0, 2.0, 0.0, -1.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    p, low, high = S.sign_flip(d)  # 2^10 <= 9999: every sign vector
    assert p == pytest.approx(_sign_flip_by_brute_force(d, 0.0))
    for edge, inside in ((low, +1), (high, -1)):  # just inside the interval the test does not reject
        assert _sign_flip_by_brute_force(d, edge + inside * 1e-6) > S.ALPHA
        assert _sign_flip_by_brute_force(d, edge - inside * 1e-3) <= S.ALPHA
    assert low < d.mean() < high
    d14 = np.r_[d, [1.0, 2.0, -1.0, 1.0]]  # 2^14 > 9999: random sign vectors
    p_mc, low_mc, high_mc = S.sign_flip(d14)
    assert p_mc == pytest.approx(_sign_flip_by_brute_force(d14, 0.0), abs=0.015)
    assert 0 < p_mc and low_mc < d14.mean() < high_mc
    assert S.sign_flip(np.r_[np.ones(5), np.zeros(1000)])[0] == pytest.approx(1 / 16, abs=0.01)  # 5 one way


def test_an_undefined_standard_error_tests_nothing():
    """One decode batch leaves nothing to resample: the bootstrap's se is nan, and the comparison
    must not become significant (an se read as 0 made p = 0 for any nonzero difference, and a TOST
    p of 0, a tie, for a zero one)."""
    c = S.paired_ratio(np.array([[0.30, 0.20]]), np.array([[0.10, 0.10]]), np.array([[1, 1]]), "out_error",
                       den_b_P=np.array([[1, 1]]))
    assert np.isnan(c.se) and np.isnan(c.p) and np.isnan(c.p_tost)
    assert np.isnan(S.p_normal(0.0005, float("nan"))) and S.p_normal(0.1, 0.0) == 0.0  # se 0: every resample agrees
    import pandas as pd

    rows = [{**c.row(), "method": "x", "budget": 6, "metric": "out_error"},
            {**c.row(), "method": "y", "budget": 6, "metric": "out_error", "diff": 0.0005}]
    assert list(S.grid_calls(pd.DataFrame(rows))["call"]) == ["inconclusive", "inconclusive"]
