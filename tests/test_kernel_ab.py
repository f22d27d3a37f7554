"""analysis/kernel_ab.py on small synthetic timing tables (bench_select's and bench_skinny's columns)."""
from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from analysis.kernel_ab import medians, ratios


def _select_table() -> pd.DataFrame:
    rows = []
    for r, (cur, base) in enumerate([(10.0, 8.0), (12.0, 8.0), (11.0, 10.0)]):
        for impl, us in (("current", cur), ("baseline", base)):
            rows.append({"rule": "base", "T": 16, "num_warps": "tuned", "form": "route_select", "impl": impl,
                         "round": r, "us": us, "timing": "graph"})
    return pd.DataFrame(rows)


def test_medians_and_round_by_round_ratios():
    t = _select_table()
    m = medians(t).set_index("impl")
    assert m.loc["current", "median"] == 11.0 and m.loc["current", "lo"] == 10.0 and m.loc["current", "hi"] == 12.0
    r = ratios(t, "baseline").iloc[0]
    # per round 1.25, 1.5, 1.1: the ratio of medians (11/8) is not what is reported
    assert (r["median"], r["lo"], r["hi"]) == (1.25, 1.1, 1.5)


def test_a_skinny_tables_launch_columns_are_part_of_the_implementation():
    rows = []
    for r in range(2):
        rows.append({"shape": "o_proj", "N": 8, "K": 8, "T": 16, "MB": 1.0, "impl": "cublas", "round": r, "us": 10.0})
        rows.append({"shape": "o_proj", "N": 8, "K": 8, "T": 16, "MB": 1.0, "impl": "skinny BN=16", "block_n": 16,
                     "block_k": 32, "num_stages": 3, "num_warps": 4, "round": r, "us": 8.0 + r})
    r = ratios(pd.DataFrame(rows), "cublas").iloc[0]
    assert (r["median"], r["lo"], r["hi"]) == pytest.approx((0.85, 0.8, 0.9))


def test_an_unknown_reference_is_refused_with_the_choices(tmp_path):
    path = tmp_path / "t.csv"
    _select_table().to_csv(path, index=False)
    out = subprocess.run([sys.executable, "-m", "analysis.kernel_ab", str(path), "--over", "nope"],
                         check=False, capture_output=True, text=True)
    assert out.returncode != 0 and "choose one of: current, baseline" in out.stderr
    assert "Traceback" not in out.stderr


# fast tier: the table without `round`; the one without `impl` (the same refusal, another subprocess) under make test-all
@pytest.mark.parametrize("cols", [["impl", "us"], pytest.param(["round", "us"], marks=pytest.mark.slow)])
def test_a_table_without_the_timing_columns_is_refused(tmp_path, cols):
    path = tmp_path / "t.csv"
    pd.DataFrame([{c: 1 for c in cols}]).to_csv(path, index=False)
    out = subprocess.run([sys.executable, "-m", "analysis.kernel_ab", str(path)], check=False, capture_output=True,
                         text=True)
    assert out.returncode != 0 and "lacks the columns" in out.stderr and "Traceback" not in out.stderr


def test_the_selection_launch_split_by_difference_of_its_forms():
    from analysis.kernel_ab import stages

    rows = []
    for r, jitter in enumerate([0.0, 0.2, -0.2]):
        rows += [{"form": "route_select", "rule": "base", "T": 16, "num_warps": "tuned", "impl": "current", "round": r,
                  "us": 13.0 + jitter},
                 {"form": "select_reassign", "rule": "base", "T": 16, "num_warps": "tuned", "impl": "current",
                  "round": r, "us": 9.0 + jitter},
                 {"form": "empty", "rule": "(empty launch)", "T": 0, "num_warps": 4, "impl": "current", "round": r,
                  "us": 2.0}]
    s = stages(pd.DataFrame(rows)).iloc[0]
    assert (s["floor_us"], s["routing_us"], s["rest_us"]) == pytest.approx((2.0, 4.0, 7.0))
    assert stages(pd.DataFrame(rows[:2])).empty  # without every form there is nothing to split


def test_each_row_is_tested_over_rounds_and_holm_corrected_across_the_table():
    """Exact two-sided Mann-Whitney of an implementation's rounds against the reference's, Holm over
    the table's rows: 7 rounds wholly apart call the faster one (p = 2 / C(14, 7)); rounds that
    interleave are inconclusive, never a tie."""
    from math import comb

    from analysis.kernel_ab import tested

    rows = []
    for r in range(7):
        for case, cur, ref in (("apart", 10.0 + r * 0.01, 12.0 + r * 0.01), ("mixed", 10.0 + r, 10.5 + r)):
            rows += [{"rule": case, "impl": "current", "round": r, "us": cur},
                     {"rule": case, "impl": "baseline", "round": r, "us": ref}]
    t = tested(pd.DataFrame(rows), "baseline").set_index("rule")
    assert t.loc["apart", "p"] == pytest.approx(2 / comb(14, 7))
    assert t.loc["apart", "p_holm"] == pytest.approx(2 * 2 / comb(14, 7))  # the smaller of two p's, times 2
    assert t.loc["apart", "call"] == "current faster"
    assert t.loc["mixed", "p"] > 0.05 and t.loc["mixed", "call"] == "inconclusive"
    slower = tested(pd.DataFrame([{**row, "us": row["us"] + (5 if row["impl"] == "current" else 0)} for row in rows]),
                    "baseline").set_index("rule")
    assert slower.loc["apart", "call"] == "baseline faster"


def test_the_smallest_reachable_p_follows_the_fewest_rounds_a_side():
    """2 / C(2n, n) for n rounds a side: 5 rounds cannot reach Holm's level over 18 rows, 7 can."""
    from math import comb

    from analysis.kernel_ab import smallest_p

    for n in (5, 7):
        rows = [{"rule": f"r{c}", "impl": impl, "round": r, "us": 1.0}
                for c in range(18) for impl in ("current", "baseline") for r in range(n)]
        short = [r for r in rows if not (r["impl"] == "baseline" and r["round"] == n - 1)]  # n against n - 1
        assert smallest_p(pd.DataFrame(short), "baseline") == pytest.approx(2 / comb(2 * n - 1, n))
        assert (smallest_p(pd.DataFrame(rows), "baseline") * 18 < 0.05) == (n == 7)
