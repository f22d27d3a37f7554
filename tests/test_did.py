"""analysis/did.py: static against continuous batching as a difference in differences (issue 27),
from records (sign-flip test) and from the committed tables' margins (variance bounds), each
against a brute-force computation."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from analysis import did as D
from analysis import records as R
from analysis import stats as S
from analysis.ablation import main as ablation_main
from analysis.batching import main as batching_main
from tests.outputs_fixture import fidelity_run


def _margins(x: np.ndarray, pairs) -> dict:
    """The 2x2 count tables of the outcome columns x (P, 4) for each pair of OUTCOMES."""
    out = {}
    for a, b in pairs:
        i, j = D.OUTCOMES.index(a), D.OUTCOMES.index(b)
        out[(a, b)] = np.array([[np.sum((x[:, i] == u) & (x[:, j] == v)) for v in (0, 1)] for u in (0, 1)])
    return out


def _d(x: np.ndarray) -> np.ndarray:
    return (x[:, 2] - x[:, 3]) - (x[:, 0] - x[:, 1])


ALL4 = [("rule_s", "base_s"), ("rule_c", "base_c"), ("rule_c", "rule_s"), ("base_c", "base_s")]


@pytest.mark.parametrize("seed", range(6))
def test_variance_bounds_hold_the_true_variance_of_any_joint_outcome(seed):
    """Random per-prompt outcomes (correlated through a prompt difficulty): the bounds from the four
    2x2 margins contain the true variance of d, and the bounds from two margins contain those from four."""
    rng = np.random.default_rng(seed)
    n = 300
    hard = rng.random(n)
    x = (rng.random((n, 4)) * rng.uniform(0.3, 1.0, 4) < (1 - hard)[:, None]).astype(int)
    mean, lo, hi = D.bounds(n, _margins(x, ALL4))
    assert mean == pytest.approx(_d(x).mean())
    assert lo - 1e-9 <= _d(x).var() <= hi + 1e-9
    _, lo2, hi2 = D.bounds(n, _margins(x, ALL4[:2]))
    assert lo2 <= lo + 1e-9 and hi - 1e-9 <= hi2


def test_bounds_are_attained_by_some_joint_outcome_on_a_small_example():
    """Brute force over every assignment of 3 prompts' outcomes with the same margins: the largest
    and smallest variance found are the linear programme's (here the LP optimum is integral)."""
    n = 3
    x = np.array([[1, 1, 1, 0], [1, 0, 1, 1], [0, 0, 1, 0]])
    target = _margins(x, ALL4)
    variances = []
    for rows in itertools.product(range(16), repeat=n):
        y = D.CELLS[list(rows)]
        if all((_margins(y, [k])[k] == t).all() for k, t in target.items()):
            variances.append(_d(y).var())
    _, lo, hi = D.bounds(n, target)
    assert lo == pytest.approx(min(variances)) and hi == pytest.approx(max(variances))


def test_margins_that_fix_every_prompt_give_one_variance():
    x = np.array([[1, 1, 1, 1]] * 50 + [[1, 0, 1, 0]] * 5 + [[0, 0, 0, 0]] * 10)  # the rule's lead unchanged
    mean, lo, hi = D.bounds(len(x), _margins(x, ALL4))
    assert mean == 0 and lo == pytest.approx(0, abs=1e-12) and hi == pytest.approx(0, abs=1e-12)
    with pytest.raises(ValueError, match="inconsistent counts"):
        D.table_2x2(10, 5, 5, 6, 0)


def _pair_of_grids(root, n: int = 200):
    """A static and a continuous grid of base and router_sum at M=6 over the same prompts: router_sum
    loses 20 prompts to base under static batches and 45 under continuous batching."""
    rng = np.random.default_rng(7)
    base_s = (rng.random(n) < 0.9).astype(int)
    base_c = base_s.copy()
    base_c[np.flatnonzero(base_s)[:6]] = 0
    rule_s, rule_c = base_s.copy(), base_c.copy()
    rule_s[np.flatnonzero(base_s)[10:30]] = 0
    rule_c[np.flatnonzero(base_c)[:45]] = 0
    for batching, runs_ in (("static", {"base": base_s, "router_sum": rule_s}),
                            ("continuous", {"base": base_c, "router_sum": rule_c})):
        for method, correct in runs_.items():
            fidelity_run(root / batching, method, 6, 0, correct, [0.1] * n, [0.9] * (n // 4), [0.1] * (n // 4),
                         batching=batching)
    return np.c_[rule_s, base_s, rule_c, base_c]


@pytest.mark.slow
def test_tables_and_records_agree_on_the_difference_and_bound_its_error(tmp_path):
    x = _pair_of_grids(tmp_path / "outputs")
    res = tmp_path / "results"
    ablation_main(str(tmp_path / "outputs" / "static"), str(res / "g"))
    ablation_main(str(tmp_path / "outputs" / "continuous"), str(res / "g_continuous"))
    batching_main(str(tmp_path / "outputs" / "static"), str(tmp_path / "outputs" / "continuous"), str(res / "g_batching"))
    R.write(tmp_path / "outputs" / "static", res / "records" / "g")
    R.write(tmp_path / "outputs" / "continuous", res / "records" / "g_continuous")

    from_tables = D.from_tables(res / "g", res / "g_continuous", res / "g_batching").iloc[0]
    from_records = D.from_records(res / "records" / "g", res / "records" / "g_continuous").iloc[0]
    d = _d(x)
    assert from_tables["diff"] == pytest.approx(d.mean()) == pytest.approx(from_records["diff"])
    assert from_tables["static_diff"] == pytest.approx(-20 / 200) and from_tables["continuous_diff"] == pytest.approx(-45 / 200)
    true_se = d.std(ddof=1) / np.sqrt(len(d))
    assert from_tables["se_min"] - 1e-12 <= true_se <= from_tables["se"] + 1e-12
    assert from_records["se"] == pytest.approx(true_se)
    # the records' test is the sign-flip test on d (its brute force is in test_stats); the tables' is
    # conservative: its p is at least the records' z p
    assert from_records["p"] == pytest.approx(S.sign_flip(d)[0])
    assert from_tables["p"] >= S.p_normal(d.mean(), true_se) - 1e-12 >= from_tables["p_min"] - 1e-12
    assert from_tables["call"] == from_records["call"] == "lower"  # 25 more prompts lost at full batches
    text = D.markdown(D.from_tables(res / "g", res / "g_continuous"), "python -m analysis.did ...")
    assert "2 committed 2x2 margins" in text and "router_sum" in text
