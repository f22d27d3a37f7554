"""analysis/: difference intervals of quality runs and the throughput tables, on small fixtures."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from analysis.quality_diff import diff_row, quality_diffs
from analysis.throughput import collect, headline_table


def test_diff_interval_calls_a_tie_only_when_it_includes_zero():
    tie = diff_row(0.90, 0.89, n=1600)  # half-width ~0.021
    assert tie["call"] == "tie" and tie["low"] < 0 < tie["high"]
    assert tie["high"] - tie["low"] == pytest.approx(2 * 1.959964 * (0.09 / 1600 + 0.0979 / 1600) ** 0.5)
    assert diff_row(0.90, 0.80, n=1600)["call"] == "higher"
    assert diff_row(0.80, 0.90, n=1600)["call"] == "lower"


def test_quality_diffs_pairs_base_with_each_variant_at_equal_budget():
    df = pd.DataFrame([
        {"variant": "base", "budget": 5, "accuracy": 0.9}, {"variant": "base", "budget": 6, "accuracy": 0.95},
        {"variant": "count", "budget": 5, "accuracy": 0.6}, {"variant": "count", "budget": 7, "accuracy": 0.7},
        {"variant": "dense", "budget": None, "accuracy": 0.99},
    ])
    out = quality_diffs(df)
    assert out[["variant", "budget"]].values.tolist() == [["count", 5]]  # no base at 7, dense unbudgeted
    assert out["diff"].iloc[0] == pytest.approx(0.3) and out["call"].iloc[0] == "higher"


def test_throughput_headline_reads_run_reports(tmp_path):
    rows = [{"batch_size": 16, "method": "dense", "budget": None, "variant": "dense", "mode": "graph",
             "ms_per_step": 20.0, "tokens_per_s": 800.0, "union_mean": 80.0, "non_expert_ms": 12.0,
             "moe_share": 0.4, "speedup_vs_dense": 1.0},
            {"batch_size": 16, "method": "base", "budget": 16, "variant": "base", "mode": "graph",
             "ms_per_step": 16.0, "tokens_per_s": 1000.0, "union_mean": 80.0, "non_expert_ms": 12.0,
             "moe_share": 0.25, "speedup_vs_dense": 1.25}]
    run = tmp_path / "run1"
    run.mkdir()
    (run / "report.json").write_text(json.dumps({"model": "m", "routing": "skewed", "throughput": rows}))
    head = headline_table(collect(tmp_path)).iloc[0]
    assert (head["model"], head["routing"], head["dense tok/s"], head["base M=16"]) == ("m", "skewed", 800.0, 1.25)
    assert pd.isna(head["base M=10"])  # not measured: empty, not invented


def test_summary_accuracy_averages_one_metric_per_top_level_task():
    """A group stands for its members; plain tasks count too (task=paper lost gsm8k, boolq, ... before)."""
    from base.outputs import summary_accuracy

    metrics = [
        {"task": "bbh", "kind": "group", "metric": "exact_match", "filter": "get-answer", "value": 0.4},
        {"task": "bbh_x", "kind": "result", "metric": "exact_match", "filter": "get-answer", "value": 0.9},
        {"task": "gsm8k", "kind": "result", "metric": "exact_match", "filter": "flexible-extract", "value": 0.5},
        {"task": "gsm8k", "kind": "result", "metric": "exact_match", "filter": "strict-match", "value": 0.3},
        {"task": "humaneval", "kind": "result", "metric": "pass@1", "filter": "create_test", "value": 0.2},
    ]
    mean, used = summary_accuracy(metrics, ["bbh", "gsm8k", "humaneval", "absent"])
    assert [(u["task"], u["filter"]) for u in used] == [("bbh", "get-answer"), ("gsm8k", "strict-match"),
                                                         ("humaneval", "create_test")]
    assert mean == pytest.approx((0.4 + 0.3 + 0.2) / 3)


def test_lm_evals_two_expected_warnings_are_dropped_and_others_kept(caplog):
    import logging

    from base.lmeval_logging import quiet_expected_warnings

    quiet_expected_warnings()
    quiet_expected_warnings()  # idempotent
    log = logging.getLogger("lm_eval.api.task")
    with caplog.at_level(logging.WARNING, logger="lm_eval.api.task"):
        log.warning("mini_add: Custom kwargs can be passed to `--metadata` in console (as json string)")
        log.warning("something else went wrong")
    assert [r.getMessage() for r in caplog.records] == ["something else went wrong"]


def test_general_calibration_text_interleaves_prose_code_and_correct_math():
    import re

    from experiments.general_calibration import build

    rows = build()
    assert [r["kind"] for r in rows[:6]] == ["prose", "code", "math"] * 2  # any prefix mixes all three
    assert rows == build()  # seeded
    for r in rows:
        m = re.match(r"Solve (\d+)x \+ (\d+) = (\d+)\. .* x = (\d+)\.$", r["text"])
        if m:
            a, b, c, x = map(int, m.groups())
            assert a * x + b == c


def _samples(correct: list[int], prompt: str = "p") -> pd.DataFrame:
    return pd.DataFrame({"task": "t", "doc_id": range(len(correct)),
                         "prompt_hash": [f"{prompt}{i}" for i in range(len(correct))], "correct": correct})


def test_paired_comparison_counts_discordant_requests_and_tests_them_exactly():
    from analysis.paired import mcnemar_exact, paired

    a = _samples([1] * 10 + [0] * 5 + [1] * 25)
    b = _samples([0] * 10 + [0] * 5 + [1] * 25)  # A alone right on 10 requests, B alone on none
    res = paired(a, b)
    assert (res["a_only"], res["b_only"], res["n"]) == (10, 0, 40)
    assert res["mcnemar_p"] == pytest.approx(2 * 0.5**10)
    assert res["diff"] == pytest.approx(0.25) and res["ci_low"] > 0 and res["call"] == "A higher"
    same = paired(a, a)
    assert (same["diff"], same["ci_low"], same["ci_high"], same["call"], same["mcnemar_p"]) == (0, 0, 0, "tie", 1.0)
    assert mcnemar_exact(3, 3) == 1.0 and mcnemar_exact(0, 1) == 1.0


def test_paired_comparison_refuses_different_prompts():
    from analysis.paired import paired

    with pytest.raises(ValueError, match="prompts differ"):
        paired(_samples([1, 0]), _samples([1, 0], prompt="other"))
