"""analysis/admission.py on hand-made run folders: FIFO and union runs paired by method, budget and
seed; the union difference per seed, and accuracy over prompts with a prompt counted once however
many seeds score it (issue 20: (seed, prompt) pairs are not independent units)."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from analysis.admission import compare, from_table, runs, seed_counts
from analysis.stats import tost_normal


def _run(root, name, admission, seed, union, correct, method="base"):
    d = root / name
    d.mkdir()
    (d / "report.json").write_text(json.dumps({
        "stage": "evaluate", "method": method, "budget": 8 if method != "dense" else None,
        "eval": {"batch_seed": seed, "admission": admission, "batching": "continuous"},
        "summary": {"union_mean": union, "kept_mean": 8.0, "occupancy_mean": 14.0,
                    "accuracy": sum(correct) / len(correct)}}))
    rows = [{"task": "t", "doc_id": i, "prompt_hash": str(i), "correct": float(c)} for i, c in enumerate(correct)]
    (d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_union_runs_pair_with_fifo_runs_of_the_same_seed(tmp_path):
    _run(tmp_path, "f0", "fifo", 0, 21.0, [1, 1, 0, 0])
    _run(tmp_path, "u0", "union", 0, 20.0, [1, 0, 1, 1])
    _run(tmp_path, "f1", "fifo", 1, 22.0, [1, 1, 1, 0])
    _run(tmp_path, "u1", "union", 1, 21.5, [1, 1, 1, 1])
    row = compare(runs(tmp_path)).iloc[0]
    assert row["seeds"] == 2 and row["union_mean_diff_by_seed"] == "-1.000000 -0.500000"
    # per prompt over the two seeds, union - fifo: doc0 0, doc1 -0.5, doc2 +0.5, doc3 +1
    assert row["n"] == 4 and row["diff"] == 0.25
    assert "crossed" in row["test"] and row["call"] == "inconclusive"  # four prompts decide nothing
    assert pd.isna(row["budget"]) is False and row["accuracy_union"] == (0.75 + 1.0) / 2


def test_one_seed_uses_the_exact_test_on_prompts(tmp_path):
    _run(tmp_path, "f0", "fifo", 0, 21.0, [0, 0, 0, 0, 0, 1])
    _run(tmp_path, "u0", "union", 0, 20.0, [1, 1, 1, 1, 1, 1])
    row = compare(runs(tmp_path)).iloc[0]
    assert row["n"] == 6 and row["test"].startswith("exact McNemar")
    assert row["p"] == 0.0625  # 5 discordant, all one way: 2 * (1/2)^5


@pytest.mark.slow
def test_seed_to_seed_variation_widens_the_interval_and_dense_is_left_out(tmp_path):
    """Union gains 30 prompts in one seed and loses 10 in the other: the prompt-level error alone
    would call the +0.05 mean a difference; with the seeds as a random factor it is inconclusive.
    Dense, the same answers under both admissions by construction, is shown but not in the family."""
    n = 400
    fifo = [1] * 300 + [0] * 100
    gain = [1] * 330 + [0] * 70
    lose = [1] * 290 + [0] * 110
    _run(tmp_path, "f0", "fifo", 0, 21.0, fifo)
    _run(tmp_path, "u0", "union", 0, 20.0, gain)
    _run(tmp_path, "f1", "fifo", 1, 21.0, fifo)
    _run(tmp_path, "u1", "union", 1, 20.0, lose)
    _run(tmp_path, "df0", "fifo", 0, 22.0, [1] * n, "dense")
    _run(tmp_path, "du0", "union", 0, 21.0, [1] * n, "dense")
    t = compare(runs(tmp_path)).set_index("method")
    base = t.loc["base"]
    assert base["diff"] == pytest.approx(0.025) and base["se_seed"] == pytest.approx(0.05)  # (0.075 + 0.025) / 2
    assert base["se"] == pytest.approx((base["se_prompt"] ** 2 + base["se_seed"] ** 2) ** 0.5)
    assert base["p_prompt"] < 0.05 < base["p"] and base["low"] < 0 < base["high"]
    assert base["call"] == "inconclusive" and base["p_holm"] == base["p"]  # dense does not dilute the family
    assert t.loc["dense", "call"] == "excluded"


def test_a_committed_table_is_re_tested_from_its_printed_seed_differences():
    row = {"method": "base", "budget": 6.0, "seeds": 3, "accuracy_fifo": 0.6124, "accuracy_union": 0.6124,
           "accuracy_diff_by_seed": "+0.012 -0.004 -0.009", "accuracy_diff": 0.0, "accuracy_low": -0.0067,
           "accuracy_high": 0.007, "prompts": 1050, "test": "sign-flip permutation over prompts; prompt bootstrap",
           "p": 0.9844, "p_tost": tost_normal(0.0, 0.0035, 0.01), "p_holm": 1.0, "p_tost_holm": 0.0021, "call": "tie"}
    assert seed_counts("+0.012 -0.004 -0.009", 1050, 0.0) == [13, -4, -9]
    assert seed_counts("+0.010 +0.010 +0.008", 1050, 28 / 3150) == [10, 10, 8]
    r = from_table(pd.DataFrame([row])).iloc[0]
    assert r["se_prompt"] == pytest.approx(0.0035) and r["se_seed"] == pytest.approx(0.00634, abs=1e-5)
    assert r["p_tost"] > 0.05 and r["call"] == "inconclusive"  # the tie does not survive the seeds
