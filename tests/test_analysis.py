"""analysis/: difference intervals of quality runs and the throughput tables, on small fixtures."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis.quality_diff import diff_row, quality_diffs
from analysis.throughput import collect, headline_table, overhead_table
from tests.outputs_fixture import fidelity_run as _ablation_run


def test_unpaired_diff_calls_no_accuracy_tie_even_where_the_equivalence_test_passes():
    wide = diff_row(0.90, 0.89, n=1600)  # half-width ~0.021: includes zero, but also +-1 point
    assert wide["call"] == "inconclusive" and wide["low"] < 0 < wide["high"]
    assert wide["high"] - wide["low"] == pytest.approx(2 * 1.959964 * (0.09 / 1600 + 0.0979 / 1600) ** 0.5)
    near = diff_row(0.900, 0.899, n=200_000)  # the TOST passes, but accuracy ties are not called (issue 27)
    assert near["p_tost"] < 0.05 and near["call"] == "inconclusive"
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


def test_two_run_folders_timing_one_cell_are_refused_with_both_names(tmp_path, capsys):
    """A cell re-timed beside its first run (another kernel table, a rerun) would be pivoted as one
    run's; the table refuses the folder and names both runs; distinct cells in two folders are fine."""
    def row(variant, budget, ms, batch=16):
        return {"batch_size": batch, "method": variant, "budget": budget, "variant": variant, "mode": "graph",
                "ms_per_step": ms, "tokens_per_s": 16e3 / ms, "union_mean": 50.0, "speedup_vs_dense": 1.0}

    for name, batches in (("first", (16,)), ("second", (64,))):
        run = tmp_path / name
        run.mkdir()
        rows = [r for b in batches for r in (row("dense", None, 10.0, b), row("base", 16, 5.0, b))]
        (run / "report.json").write_text(json.dumps({"model": "m", "routing": "uniform", "throughput": rows}))
    assert sorted(collect(tmp_path)["batch_size"].unique()) == [16, 64]
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "report.json").write_text(json.dumps(
        {"model": "m", "routing": "uniform", "throughput": [row("dense", None, 11.0), row("base", 16, 6.0)]}))
    with pytest.raises(SystemExit) as e:
        collect(tmp_path)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "more than one run folder" in err and "again, first" in err


def test_an_expert_ffn_far_below_copy_bandwidth_is_flagged(tmp_path):
    """The expert FFN's bytes per step (MoE layers x kept x expert bytes) over its profiled time, as a
    share of copy bandwidth; a run under the threshold gets a warning line, a healthy one none."""
    from analysis.throughput import (
        SLOW_EXPERTS_OF_COPY,
        expert_bandwidth_table,
        profile_rows,
    )

    for model, ffn_ms in (("fast", 1.0), ("slow", 10.0)):
        rows = [{"batch_size": 16, "method": "dense", "budget": None, "variant": "dense", "mode": "graph",
                 "ms_per_step": 12.0, "tokens_per_s": 1e3, "union_mean": 50.0, "kept_mean": 50.0}]
        profile = [{"batch_size": 16, "variant": "dense", "budget": None, "class": "expert FFN", "ms_per_step": ffn_ms,
                    "kernels_per_step": 4.0, "kernels_per_layer": 4.0, "graph_ms_per_step": 12.0}]
        run = tmp_path / model
        run.mkdir()
        (run / "report.json").write_text(json.dumps({"model": model, "routing": "uniform", "throughput": rows,
                                                     "profile": profile, "moe_layers": 4, "expert_bytes": 10e6,
                                                     "copy_gbps": 3000.0}))
    table, warnings = expert_bandwidth_table(profile_rows(tmp_path))
    share = table.set_index("model")["expert_of_copy"]
    # 4 layers x 50 experts x 10 MB = 2 GB per step: in 1 ms 2 TB/s (0.67 of 3 TB/s), in 10 ms 0.067
    assert share["fast"] == pytest.approx(2 / 3, abs=1e-3) and share["slow"] == pytest.approx(0.0667, abs=1e-3)
    assert share["slow"] < SLOW_EXPERTS_OF_COPY < share["fast"]
    assert len(warnings) == 1 and "`slow`" in warnings[0] and "0.07 of copy bandwidth" in warnings[0]


def test_throughput_headline_of_a_grid_without_dense_leaves_the_speed_ups_empty(tmp_path):
    """A grid of base and fixed alone (the run writes speedup_vs_dense as null): the table is made,
    the speed-ups empty, base's tokens/s kept."""
    rows = [{"batch_size": 16, "method": m, "budget": 8, "variant": m, "mode": "graph", "ms_per_step": ms,
             "tokens_per_s": 16e3 / ms, "union_mean": 60.0, "speedup_vs_dense": None} for m, ms in (("base", 4.9), ("fixed", 4.7))]
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "report.json").write_text(json.dumps({"model": "m", "routing": "uniform", "throughput": rows}))
    head = headline_table(collect(tmp_path)).iloc[0]
    assert pd.isna(head["base M=8"]) and pd.isna(head["dense tok/s"])


def test_throughput_overhead_is_against_fixed_at_the_same_budget_paired_by_round(tmp_path):
    """(ms - fixed ms) / fixed ms per round of the interleaved repeats (passes pair up by round):
    the median over rounds and its range; a run without repeats has one round."""
    def row(variant, budget, runs):
        ms = sorted(runs)[len(runs) // 2]
        return {"batch_size": 16, "method": variant, "budget": budget, "variant": variant, "mode": "graph",
                "ms_per_step": ms, "tokens_per_s": 16e3 / ms, "warmup_s": 3.0,
                "ms_runs": ";".join(str(x) for x in runs)}

    rows = [row("fixed", 16, [9.0, 10.0, 8.0]), row("base", 16, [9.9, 10.5, 8.0]), row("router_sum", 16, [9.0, 11.0, 8.8]),
            row("base", 8, [8.0]), row("fixed", 8, [6.4])]
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "report.json").write_text(json.dumps({"model": "m", "routing": "uniform", "throughput": rows}))
    out = overhead_table(collect(tmp_path)).set_index(["budget", "variant"])
    # base at 16: rounds +10 %, +5 %, 0 % -> median 5 %; router_sum: 0 %, +10 %, +10 %
    assert out.loc[(16, "base"), "overhead"] == pytest.approx(0.05)
    assert (out.loc[(16, "base"), "min"], out.loc[(16, "base"), "max"]) == pytest.approx((0.0, 0.1))
    assert out.loc[(16, "router_sum"), "overhead"] == pytest.approx(0.1)
    assert out.loc[(8, "base"), "overhead"] == pytest.approx(0.25) and out.loc[(8, "base"), "rounds"] == 1
    assert (8, "router_sum") not in out.index
    assert out.loc[(16, "base"), "max warm-up s"] == 3.0


def test_a_step_with_no_active_token_is_not_a_step_that_kept_nothing():
    """The continuous engine's last step after its requests ended on the device selects nothing:
    the selection summary leaves it out (an independent walkthrough saw kept_min 0 and kept_mean
    6.46 at M=8 from it); prefill rows are left out as before."""
    from base.run.outputs import selection_summary

    def row(step, kept, tokens, decode=True):
        return {"layer": 0, "step": step, "decode": decode, "kind": "decode" if decode else "prefill", "union": kept + 2,
                "kept": kept, "executed": kept, "weight_kept": 1.0, "weight_total": 1.0, "tokens_lost": 0.0,
                "tokens": tokens}

    (s,) = selection_summary([row(0, 12, 16, decode=False), row(1, 8, 16), row(2, 6, 4), row(3, 0, 0)])
    assert (s["kept_min"], s["kept_mean"], s["steps"], s["occupancy_mean"]) == (6, 7.0, 2, 10.0)


def test_summary_accuracy_averages_one_metric_per_top_level_task():
    """A group stands for its members; plain tasks count too (task=paper lost gsm8k, boolq, ... before)."""
    from base.run.outputs import summary_accuracy

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

    from base.eval.lmeval_logging import quiet_expected_warnings

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
    from analysis.paired import paired
    from analysis.stats import mcnemar_exact

    a = _samples([1] * 10 + [0] * 5 + [1] * 25)
    b = _samples([0] * 10 + [0] * 5 + [1] * 25)  # A alone right on 10 requests, B alone on none
    res = paired(a, b)
    assert (res["a_only"], res["b_only"], res["n"]) == (10, 0, 40)
    assert res["mcnemar_p"] == pytest.approx(2 * 0.5**10)
    assert res["diff"] == pytest.approx(0.25) and res["ci_low"] > 0 and res["call"] == "A higher"
    same = paired(a, a)  # no discordant request, but 40 cannot bound the difference within 1 point
    assert (same["diff"], same["call"], same["mcnemar_p"]) == (0, "inconclusive", 1.0)
    assert same["ci_low"] < -0.01 and same["ci_high"] > 0.01
    many = _samples([1] * 1500 + [0] * 500)
    tied = paired(many, many)  # 2000 prompts, none discordant: the TOST passes, reported, not a call
    assert tied["tost_p"] < 0.05 and tied["call"] == "inconclusive"
    assert mcnemar_exact(3, 3) == 1.0 and mcnemar_exact(0, 1) == 1.0


def test_paired_comparison_refuses_different_prompts():
    from analysis.paired import paired

    with pytest.raises(ValueError, match="prompts differ"):
        paired(_samples([1, 0]), _samples([1, 0], prompt="other"))


# ---- the selection-rule ablation (analysis/ablation.py) ---------------------------------------
@pytest.mark.slow
def test_ablation_intervals_paired_calls_and_the_grid_correction(tmp_path):
    from analysis.ablation import markdown, paired_table, run_table, runs

    n, rng = 1000, np.random.default_rng(0)
    base_correct = (rng.random(n) < 0.9).astype(int)
    worse = base_correct.copy()
    worse[np.flatnonzero(base_correct)[:40]] = 0  # 40 prompts lost, none gained
    batches = n // 4
    base_kl = rng.gamma(2.0, 0.05, n)
    _ablation_run(tmp_path, "base", 6, 0, base_correct, base_kl, [0.95] * batches, [0.05] * batches)
    _ablation_run(tmp_path, "router_sum", 6, 0, worse, base_kl + 0.4, [0.80] * batches,
                  0.05 + rng.normal(0, 1e-4, batches))  # error: the same as base within noise
    _ablation_run(tmp_path, "oracle", 6, 0, base_correct, base_kl, [0.95] * batches, [0.05] * batches)
    _ablation_run(tmp_path, "dense", None, 0, base_correct, [0.0] * n, [1.0] * batches, [0.0] * batches)
    df = runs(tmp_path)
    assert len(df) == 4 and set(df["model"]) == {"mini"}

    table = run_table(df).set_index(["method", "metric"])
    acc = table.loc[("router_sum", "accuracy")]
    assert acc["mean"] == pytest.approx(worse.mean()) and 0 <= acc["low"] < acc["mean"] < acc["high"] <= 1
    e = table.loc[("router_sum", "energy_retained")]
    assert e["mean"] == pytest.approx(0.80) and e["unit"] == "decode batches"
    assert table.loc[("dense", "kl"), "mean"] == 0

    paired = paired_table(df).set_index(["method", "metric"])
    a = paired.loc[("router_sum", "accuracy")]
    assert a["diff"] == pytest.approx(-40 / n) and a["call"] == "lower" and a["high"] < 0
    assert (a["a_only"], a["b_only"]) == (0, 40) and a["p"] == pytest.approx(2 * 0.5**40)
    assert paired.loc[("router_sum", "kl"), "call"] == "higher"
    assert paired.loc[("router_sum", "kl"), "diff"] == pytest.approx(0.4)
    assert paired.loc[("router_sum", "energy_retained"), "call"] == "lower"
    assert paired.loc[("router_sum", "out_error"), "call"] == "tie"  # within the 0.002 margin
    assert paired.loc[("oracle", "accuracy"), "call"] == "inconclusive"  # identical on 1000 prompts: no accuracy tie
    assert paired.loc[("oracle", "dll"), "call"] == "excluded"  # dll mirrors KL: reported, not called
    assert "dense" not in paired.index.get_level_values("method")  # no budget: not paired with base
    called = paired["call"] != "excluded"
    assert (paired["p_holm"] >= paired["p"])[called].all()  # one Holm family over the grid, dll left out

    text = markdown(run_table(df), paired_table(df))
    assert "router_sum" in text and "tie" in text and "lower" in text and "calls, Holm-corrected" in text


def test_ablation_refuses_to_pool_runs_of_different_prompt_pools(tmp_path):
    from analysis.ablation import runs

    _ablation_run(tmp_path, "base", 6, 0, [1, 1], [0.1, 0.1], [0.9], [0.1], limit=2)
    _ablation_run(tmp_path, "router_sum", 6, 0, [1, 1], [0.1, 0.1], [0.9], [0.1], limit=5)
    with pytest.raises(SystemExit, match="holds runs of 2 prompt pools, models or engines .*limit=2.*limit=5"):
        runs(tmp_path)


def test_ablation_header_names_the_experiment_of_its_folder():
    from analysis.ablation import made_by

    df = pd.DataFrame({"seed": [2, 0, 1, 0]})
    mini = made_by("outputs/ablation_mini", "results/ablation_mini", df)
    assert "`make ablation`" in mini and "experiment=ablation_mini eval.seed=0,1,2`" in mini
    other = made_by("outputs/ablation_mini_olmoe", "results/ablation_mini_olmoe", df)
    assert "`make ablation ABLATION_EXP=ablation_mini_olmoe`" in other
    assert "experiment=ablation_mini_olmoe eval.seed=0,1,2`" in other
    assert "analysis.ablation outputs/ablation_mini_olmoe results/ablation_mini_olmoe" in other
    seeds = made_by("outputs/quality_seeds_mini_olmoe", "results/quality_seeds_mini_olmoe", df)
    assert "`make quality-seeds QS_EXP=quality_seeds_mini_olmoe`" in seeds and "method.k0=1,2" in seeds


def test_ablation_refuses_to_pair_different_prompts(tmp_path):
    from analysis.ablation import paired_table, runs

    _ablation_run(tmp_path, "base", 6, 0, [1, 1], [0.1, 0.1], [0.9], [0.1])
    _ablation_run(tmp_path, "router_sum", 6, 0, [1, 0], [0.2, 0.2], [0.8], [0.2], hashes=["h0", "other"])
    with pytest.raises(ValueError, match="different prompts"):
        paired_table(runs(tmp_path))


def test_quality_pivot_gives_intervals_over_seeds():
    from analysis.quality import pivot_seeds, seeds_per_point

    rows = [{"variant": "base", "budget": 6, "batch_seed": s, "accuracy": a, "kept_mean": 5.9}
            for s, a in enumerate((0.90, 0.92, 0.94))]
    rows += [{"variant": "dense", "budget": None, "batch_seed": s, "accuracy": 0.99, "kept_mean": 11.9} for s in range(3)]
    table = pd.DataFrame(rows)
    assert seeds_per_point(table) == 3
    piv = pivot_seeds(table)
    mean, interval = piv.loc["base", "M=6"].split(" ", 1)
    low, high = (float(x) for x in interval.strip("[]").split(", "))
    assert float(mean) == pytest.approx(0.92) and (low, high) == (0.90, 0.94)  # the range over seeds
    assert piv.loc["dense", "accuracy (no budget)"] == "0.990 [0.990, 0.990]"  # no spread over seeds


def test_profile_attributes_every_kernel_to_the_innermost_class_range_of_its_launch():
    """GPU attribution (base/profile.attribute_trace) on a hand-made chrome trace: a kernel that
    Triton launched directly (a driver call inside the `expert FFN` range) goes to that range; an
    operator's kernels (runtime calls) to the range around the operator, the innermost one when
    ranges nest; a launch outside every range to `other`; a kernel whose launch is missing from the
    trace to `unlinked`; the total is every kernel's time."""
    from base.runtime.profile import attribute_trace

    def rng(name, ts, dur, tid=1):
        return {"ph": "X", "cat": "user_annotation", "name": f"cls:{name}", "tid": tid, "ts": ts, "dur": dur, "args": {}}

    def call(cat, ts, corr, tid=1):
        return {"ph": "X", "cat": cat, "name": "launch", "tid": tid, "ts": ts, "dur": 1, "args": {"correlation": corr}}

    def kernel(corr, dur, ext=None, name="k"):
        args = {"correlation": corr} | ({"External id": ext} if ext is not None else {})
        return {"ph": "X", "cat": "kernel", "name": name, "tid": 7, "ts": 10_000 + corr, "dur": dur, "args": args}

    trace = [
        {"ph": "M", "name": "process_name", "args": {}},
        rng("attention", 0, 100), rng("norms", 40, 10),  # a norm inside attention (nested)
        call("cuda_runtime", 20, 1), call("cuda_runtime", 45, 2),
        rng("expert FFN", 200, 100), call("cuda_driver", 250, 3),
        call("cuda_runtime", 400, 4),  # no range open
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": 1, "ts": 210, "dur": 5, "args": {"External id": 9}},
        kernel(1, 300.0), kernel(2, 20.0), kernel(3, 500.0, name="fused_moe"), kernel(4, 50.0),
        kernel(5, 30.0, ext=9),  # its launch call is not in the trace, its operator is
        kernel(6, 7.0),  # nothing links it
    ]
    per_class, total, count, names = attribute_trace(trace)
    assert per_class == pytest.approx({"attention": 0.3, "norms": 0.02, "expert FFN": 0.53, "other": 0.05,
                                       "unlinked": 0.007})
    assert total == pytest.approx(0.907)
    assert count == {"attention": 1, "norms": 1, "expert FFN": 2, "other": 1, "unlinked": 1}
    assert names[("expert FFN", "fused_moe")] == pytest.approx([0.5, 1]) and names[("expert FFN", "k")] == pytest.approx([0.03, 1])
    assert sum(n for _, n in names.values()) == 6


def test_ablation_labels_rule_variants_by_their_options():
    from analysis.ablation import variant_label

    assert variant_label("base", {"k0": None, "reassign": "backfill", "budget_split": "uniform"}) == "base"
    assert variant_label("base_anchor", {"k0": 1}) == "base_anchor(k0=1)"
    assert variant_label("base", {"reassign": "similar"}) == "base+similar"
    assert variant_label("base", {"budget_split": "sensitivity"}) == "base+split"
    assert variant_label("base", {"shrink": "auto"}) == "base(shrink=auto)"  # another rule: never merged with base
    assert variant_label("base", {"coverage": 0.9}) == "base@cov0.9"


def test_the_kernel_table_reads_each_runs_kernels_and_divides_time_by_launches(tmp_path):
    from analysis.throughput import kernel_rows, top_kernels

    run = tmp_path / "r"
    run.mkdir()
    (run / "report.json").write_text(json.dumps({"model": "m", "routing": "uniform", "throughput": []}))
    pd.DataFrame([
        {"batch_size": 16, "variant": "base", "budget": 16, "class": "expert FFN", "kernel": "gate_up",
         "ms_per_step": 1.2, "kernels_per_step": 48, "kernels_per_layer": 1.0},
        {"batch_size": 16, "variant": "base", "budget": 16, "class": "other", "kernel": "copy",
         "ms_per_step": 0.01, "kernels_per_step": 2, "kernels_per_layer": 2 / 48},
        {"batch_size": 16, "variant": "fixed", "budget": 16, "class": "expert FFN", "kernel": "gate_up",
         "ms_per_step": 1.1, "kernels_per_step": 48, "kernels_per_layer": 1.0},
    ]).to_csv(run / "profile_kernels.csv", index=False)
    df = kernel_rows(tmp_path)
    assert df.loc[df["kernel"] == "gate_up", "us_per_launch"].tolist() == pytest.approx([25.0, 1.1e3 / 48])
    top = top_kernels(df, n=1)
    assert top[["variant", "kernel"]].values.tolist() == [["base", "gate_up"]]  # fixed left out; the largest
