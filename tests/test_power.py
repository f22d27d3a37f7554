"""analysis/power.py: the exact power and minimal detectable difference of the pre-registered
McNemar test, against a brute-force enumeration of every outcome and against the normal formula."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from analysis import power as P


def _enumerated_power(delta: float, disc: float, n: int, alpha: float) -> float:
    """Every (rule-only, base-only) count of n prompts (multinomial), the exact test run on each."""
    pa, pb = (disc + delta) / 2, (disc - delta) / 2
    total = 0.0
    for a in range(n + 1):
        for b in range(n + 1 - a):
            prob = stats.multinomial.pmf([a, b, n - a - b], n, [pa, pb, 1 - pa - pb])
            if a + b and stats.binomtest(a, a + b, 0.5).pvalue <= alpha:
                total += prob
    return total


@pytest.mark.parametrize(("delta", "disc", "n", "alpha"), [(0.15, 0.3, 40, 0.05), (0.05, 0.2, 60, 0.01),
                                                           (0.0, 0.25, 30, 0.05), (-0.1, 0.2, 50, 0.05)])
def test_exact_power_matches_enumeration(delta, disc, n, alpha):
    assert P.exact_power(delta, disc, n, alpha) == pytest.approx(_enumerated_power(delta, disc, n, alpha), abs=1e-6)


def test_exact_mdd_is_where_power_reaches_80_percent():
    disc, n, family = 0.06, 5600, 36
    m = P.exact_mdd(disc, n, family)
    level = 0.05 / family
    assert P.exact_power(m, disc, n, level) == pytest.approx(0.8, abs=1e-3)
    assert P.exact_power(0.9 * m, disc, n, level) < 0.8
    # at this n the normal approximation stats.mdd uses is close to the exact value
    assert m == pytest.approx(P.normal_mdd(disc, n, family), rel=0.05)


def test_mdd_shrinks_with_n_and_grows_with_discordance_and_family():
    assert P.exact_mdd(0.06, 8000, 36) < P.exact_mdd(0.06, 4000, 36)
    assert P.exact_mdd(0.10, 5600, 36) > P.exact_mdd(0.05, 5600, 36)
    assert P.exact_mdd(0.06, 5600, 72) > P.exact_mdd(0.06, 5600, 18)
    assert np.isnan(P.exact_mdd(0.001, 100, 36))  # too few discordant prompts: nothing is detectable


@pytest.mark.parametrize("alpha", [0.05, 0.05 / 36])
def test_critical_counts_match_a_scan_of_the_exact_test(alpha):
    """The vectorised critical count against scanning every count with scipy's binomtest."""
    got = P._critical(np.arange(0, 300), alpha)
    for d in (0, 1, 5, 6, 11, 12, 40, 97, 160, 299):
        hits = [k for k in range(d + 1) if k >= d - k and stats.binomtest(k, d, 0.5).pvalue <= alpha] if d else []
        assert got[d] == (hits[0] if hits else d + 1), d
