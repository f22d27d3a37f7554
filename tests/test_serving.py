"""The serving benchmark (base/runtime/{arrivals,serve_metrics,serving}.py): the arrival schedule's
statistics and determinism, the metric formulas against hand computation, the rotation of the
variants' order, and a tiny end-to-end run through run.py's pipeline that fills every column."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from base.runtime.arrivals import arrival_times
from base.runtime.serve_metrics import Slo, request_metrics, stream_metrics
from base.runtime.serving import rotated, round_sizes

# ------------------------------------------------------------------------------------ arrivals


def test_poisson_arrivals_have_exponential_gaps_of_the_rate():
    n, rate = 20_000, 8.0
    t = np.asarray(arrival_times(n, rate, seed=3))
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert (gaps >= 0).all() and t[-1] == pytest.approx(n / rate)  # the n-th arrival at n / rate
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.03)  # exponential: CV 1
    # the gaps are exponential of mean 1/rate: Kolmogorov-Smirnov does not reject (a fixed seed, so no flake)
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 0.01
    # arrivals in windows of 1 s are Poisson: index of dispersion (variance / mean) near 1
    counts = np.bincount(t.astype(int))[: int(n / rate)]
    assert counts.mean() == pytest.approx(rate, rel=0.02) and counts.var() / counts.mean() == pytest.approx(1, abs=0.1)


def test_a_schedule_is_fixed_by_its_seed_and_scaled_across_rates():
    a = arrival_times(50, 4.0, seed=7)
    assert a == arrival_times(50, 4.0, seed=7)
    assert a != arrival_times(50, 4.0, seed=8)
    assert np.allclose(np.asarray(arrival_times(50, 16.0, seed=7)) * 4, a)  # one draw, scaled
    assert arrival_times(5, None, seed=7) == [0.0] * 5  # the closed burst
    with pytest.raises(ValueError, match="rate must be > 0"):
        arrival_times(5, 0.0, seed=0)


# ------------------------------------------------------------------------------------- metrics


def test_request_metrics_by_hand():
    # arrives at 1.0 s; tokens on the host at 1.3, 1.32, 1.36, 1.42 s
    r = request_metrics(1.0, [1.3, 1.32, 1.36, 1.42], prompt_tokens=100)
    assert r["output_tokens"] == 4 and r["prompt_tokens"] == 100
    assert r["ttft_ms"] == pytest.approx(300) and r["e2el_ms"] == pytest.approx(420)
    assert r["tpot_ms"] == pytest.approx((420 - 300) / 3)  # (latency - TTFT) / (output tokens - 1)
    assert r["itl_ms"] == pytest.approx([20, 40, 60])
    assert np.mean(r["itl_ms"]) == pytest.approx(r["tpot_ms"])
    one = request_metrics(0.0, [0.2], prompt_tokens=5)
    assert one["tpot_ms"] is None and one["itl_ms"] == []


def test_stream_metrics_by_hand():
    rows = [request_metrics(0.0, [0.1, 0.11, 0.12], 10),       # TTFT 100, TPOT 10: good
            request_metrics(0.0, [0.6, 0.61], 20),             # TTFT 600: misses the TTFT SLO
            request_metrics(0.5, [0.7, 0.75, 0.8, 0.85], 30),  # TTFT 200, TPOT 50: misses the TPOT SLO
            request_metrics(0.5, [0.9], 40)]                   # TTFT 400, one token: TPOT counts as 0, good
    s = stream_metrics(rows, duration_s=2.0, slo=Slo(ttft_ms=500, tpot_ms=25))
    assert s["completed"] == 4 and s["output_tokens"] == 10 and s["input_tokens"] == 100
    assert s["output_throughput"] == 5.0 and s["request_throughput"] == 2.0 and s["total_token_throughput"] == 55.0
    assert s["goodput"] == 1.0 and s["good_fraction"] == 0.5
    ttft = [100, 600, 200, 400]
    assert s["ttft_ms_mean"] == pytest.approx(325) and s["ttft_ms_p50"] == pytest.approx(300)
    # p99 by linear interpolation between the two largest of 4 sorted values: 400 + 0.97 * (600 - 400)
    assert s["ttft_ms_p99"] == pytest.approx(400 + (0.99 * 3 - 2) * 200) == pytest.approx(np.percentile(ttft, 99))
    assert s["tpot_ms_mean"] == pytest.approx((10 + 10 + 50) / 3)  # the one-token request has no TPOT
    assert s["tpot_ms_p50"] == pytest.approx(10)
    itl = [10, 10, 10, 50, 50, 50]  # every gap of every request, pooled
    assert s["itl_ms_mean"] == pytest.approx(np.mean(itl)) and s["itl_ms_p99"] == pytest.approx(50)
    assert s["e2el_ms_p50"] == pytest.approx(np.median([120, 610, 350, 400]))


# --------------------------------------------------------------------------------------- order


def test_the_order_rotates_so_no_variant_is_always_first():
    variants = ["dense", "b16", "b10", "a16", "a10"]
    orders = [rotated(variants, r, 3) for r in range(3)]
    assert all(sorted(o) == sorted(variants) for o in orders)
    assert [o[0] for o in orders] == ["dense", "b16", "a16"]  # starts at (r x 5) // 3 = 0, 1, 3
    assert [o.index("dense") + 1 for o in orders] == [1, 5, 3]  # dense's place moves through the order
    # as many repeats as variants: each variant leads exactly once, in its list's cyclic order
    assert [rotated(variants, r, 5)[0] for r in range(5)] == variants


def test_the_warm_up_rounds_cover_a_burst_and_sparse_arrivals():
    assert round_sizes(16) == [16, 1, 2, 4, 8] and round_sizes(3) == [3, 1, 2] and round_sizes(1) == [1]


# ----------------------------------------------------------------------------------- end to end


def _tiny_run(tmp_path: Path, mode: str, method: str, *more: str) -> list[str]:
    """The overrides of a tiny CPU throughput run in `mode` (serve or stream): batch 2, dense and
    `method` at M=2, prompts of 3-9 and outputs of 2-5 tokens; then `more`."""
    return ["model=tiny_qwen3", "task=smoke", "logger=none", f"artifacts_dir={tmp_path}/artifacts", "stage=throughput",
            f"throughput.mode={mode}", "throughput.batch_sizes=[2]", f"throughput.methods=[dense,{method}]",
            "throughput.budgets=[2]", "stream.prompt_len=[3,9]", "stream.output_len=[2,5]", *more]


def test_a_lean_serving_run_rotates_the_order_and_serves_every_variant_the_same_requests(compose, tmp_path):
    """`make test`'s serve run (the full one above is in the slow tier): two repeats of one burst,
    the order rotated, the same requests in every stream, each stream's totals its records' and a
    step probe per variant."""
    from omegaconf import OmegaConf

    import run
    from base.run.pipeline import run as run_pipeline

    cfg = compose(_tiny_run(tmp_path, "serve", "base", "serve.requests=2", "serve.rates=[null]", "serve.repeats=2", "seed=5"))
    out = tmp_path / "run"
    report = run_pipeline(run.build_config(cfg, out), OmegaConf.to_yaml(cfg, resolve=True))
    streams = pd.read_csv(out / "serve.csv")
    requests = pd.read_json(out / "requests.jsonl", lines=True)
    assert len(streams) == 2 * 2 and len(requests) == 2 * len(streams) and set(streams["arrivals"]) == {"burst"}
    assert [o["order"] for o in report["serve_info"]["orders"]] == [["dense", "base"], ["base", "dense"]]
    shape = requests.groupby(["repeat", "variant"])[["prompt_tokens", "output_tokens"]].agg(tuple)
    assert shape["prompt_tokens"].nunique() == 1 and shape["output_tokens"].nunique() == 1
    for _, s in streams.iterrows():
        g = requests[(requests["repeat"] == s["repeat"]) & (requests["variant"] == s["variant"])]
        assert s["output_tokens"] == g["output_tokens"].sum() and s["duration_s"] == pytest.approx(g["last_token_s"].max())
    assert pd.read_csv(out / "step_probe.csv")["variant"].tolist() == ["dense", "base"]


@pytest.mark.slow
def test_a_tiny_serving_run_fills_every_column(compose, tmp_path):
    """run.py's pipeline on the CPU: every (repeat, variant, rate) serves the same requests on the
    same seeded schedule; the records hold each metric and agree with the formulas."""
    from omegaconf import OmegaConf

    import run
    from base.run.pipeline import run as run_pipeline

    cfg = compose(_tiny_run(tmp_path, "serve", "base", "serve.requests=4", "serve.rates=[null,400]", "serve.repeats=2",
                            "seed=5", "serve.search_steps=2"))
    out = tmp_path / "run"
    report = run_pipeline(run.build_config(cfg, out), OmegaConf.to_yaml(cfg, resolve=True))
    streams = pd.read_csv(out / "serve.csv")
    requests = pd.read_json(out / "requests.jsonl", lines=True)
    # the rate search: two bisection steps per (repeat, variant) after the rates, from sqrt(1 * 64)
    search = streams[streams["arrivals"] == "search"]
    assert len(search) == 2 * 2 * 2 and (search[search["search_step"] == 0]["rate"] == 8.0).all()
    for _, g in search.groupby(["repeat", "variant"]):
        first = g.sort_values("search_step").iloc[0]
        assert g.sort_values("search_step")["rate"].iloc[1] == pytest.approx(
            (8.0 * 64) ** 0.5 if first["good_fraction"] >= 0.9 else (8.0 * 1) ** 0.5)
    keep = streams["arrivals"] != "search"
    requests = requests[requests["arrivals"] != "search"]
    streams = streams[keep].reset_index(drop=True)
    assert len(streams) == 2 * 2 * 2 and len(requests) == 4 * len(streams)  # repeats x variants x rates
    for col in ("output_throughput", "request_throughput", "goodput", "good_fraction", "duration_s",
                *(f"{m}_ms_{s}" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "p50", "p99"))):
        assert streams[col].notna().all() and (streams[col] >= 0).all(), col
    assert set(streams["arrivals"]) == {"burst", "poisson"} and set(streams["routing"]) == {"uniform"}
    for col in ("prefills", "prefill_s", "mixed_steps", "captures", "eager_steps", "steps", "rounds", "step_ms_median"):
        assert (streams[col] >= 0).all(), col
    # every prompt is prefilled once, packed (scheduler.* defaults: no chunks in mixed steps)
    key = ["repeat", "variant", "arrivals"]
    prompts = requests.groupby(key)["prompt_tokens"].sum()
    assert streams.set_index(key)["prompt_tokens"].sort_index().equals(prompts.sort_index())
    assert (streams["packing"] == "packed").all() and (streams["mixed_steps"] == 0).all()
    # the stream's own step timings, and the probe of each variant's step with every slot decoding
    assert (streams["gap_ms_median"] >= 0).all() and (streams["launch_ms_median"] > 0).all()
    probe = pd.read_csv(out / "step_probe.csv")
    assert probe["variant"].tolist() == ["dense", "base"] and (probe["slots"] == 2).all()
    assert (probe["full_step_ms"] > 0).all() and (probe["kernels_per_layer"] > 0).all()
    assert (probe["expert_FFN_ms"] > 0).all() and (probe["attention_kernels_per_layer"] > 0).all()
    assert (probe["prefill_tokens"] > 0).all() and (probe["prefill_tokens_per_s"] > 0).all()
    assert (probe["prefill_expert_FFN_ms"] > 0).all()
    # the probes decode from the median context the variant's first stream read, less half their
    # timed steps; the static engine's step at the same rows and context beside the engine's own
    from base.runtime.step_probe import STEPS

    first = streams[(streams["repeat"] == 0) & (streams["arrivals"] == "burst")].set_index("variant")
    assert (first["context_median"] > 0).all()
    assert probe.set_index("variant")["stream_context_median"].equals(first.loc[["dense", "base"], "context_median"])
    assert (probe["prompt_tokens"] == (probe["stream_context_median"].astype(int) - STEPS // 2).clip(lower=1)).all()
    assert (probe["static_step_ms"] > 0).all()
    # the thresholds each stream ran with
    assert (streams["min_prompt_tokens"] == 1).all() and (streams["max_wait_steps"] == 0).all()
    # the order rotates: dense first in repeat 0, second in repeat 1
    dense = streams[streams["variant"] == "dense"].drop_duplicates("repeat").set_index("repeat")["position"]
    assert dense.to_dict() == {0: 1, 1: 2}
    assert [o["order"] for o in report["serve_info"]["orders"]] == [["dense", "base"], ["base", "dense"]]
    # every stream serves the same requests: prompt and output lengths (EOS ignored)
    shape = requests.groupby(["repeat", "variant", "arrivals"])[["prompt_tokens", "output_tokens"]].agg(tuple)
    assert shape["prompt_tokens"].nunique() == 1 and shape["output_tokens"].nunique() == 1
    assert requests["output_tokens"].between(2, 5).all()
    # ... on the seeded schedule of its rate
    poisson = requests[requests["arrivals"] == "poisson"]
    for _, g in poisson.groupby(["repeat", "variant"]):
        assert g.sort_values("request")["arrival_s"].tolist() == pytest.approx(arrival_times(4, 400.0, seed=5 + 2))
    assert (requests.loc[requests["arrivals"] == "burst", "arrival_s"] == 0).all()
    # each record agrees with the formulas, and each stream's summary with its records
    assert np.allclose(requests["ttft_ms"], 1e3 * (requests["first_token_s"] - requests["arrival_s"]))
    assert np.allclose(requests["tpot_ms"], (requests["e2el_ms"] - requests["ttft_ms"]) / (requests["output_tokens"] - 1))
    assert (requests["itl_ms"].map(len) == requests["output_tokens"] - 1).all()
    for _, s in streams.iterrows():
        g = requests[(requests["repeat"] == s["repeat"]) & (requests["variant"] == s["variant"])
                     & (requests["arrivals"] == s["arrivals"])]
        assert s["output_tokens"] == g["output_tokens"].sum()
        assert s["duration_s"] == pytest.approx(g["last_token_s"].max())
        assert s["tpot_ms_p50"] == pytest.approx(np.percentile(g["tpot_ms"], 50))
        assert s["output_throughput"] == pytest.approx(s["output_tokens"] / s["duration_s"])
        assert math.isclose(s["goodput"], ((g["ttft_ms"] <= 500) & (g["tpot_ms"] <= 25)).sum() / s["duration_s"])


def test_a_token_buffer_reused_before_it_was_read_is_refused():
    from base.runtime.continuous import TokenRing

    ring = TokenRing(4, torch.long, pin=False)
    first, gen = ring.next()
    assert ring.holds(gen)
    for _ in range(TokenRing.SIZE - 1):
        ring.next()
    assert ring.holds(gen)  # SIZE - 1 later snapshots: its buffer is still its own
    again, _ = ring.next()
    assert again is first and not ring.holds(gen)


# ------------------------------------------------------------------------------------- analysis


def _stream_row(variant, budget, rate, repeat, position, tok_s, tpot, goodput):
    return {"model": "m", "routing": "uniform", "slots": 4, "variant": variant, "method": variant, "budget": budget,
            "rate": rate, "repeat": repeat, "position": position, "output_throughput": tok_s,
            "request_throughput": tok_s / 10, "ttft_ms_p50": 10.0, "ttft_ms_p99": 20.0, "tpot_ms_p50": tpot,
            "tpot_ms_p99": 2 * tpot, "itl_ms_p50": tpot, "itl_ms_p99": 3 * tpot, "e2el_ms_p50": 100.0,
            "e2el_ms_p99": 200.0, "goodput": goodput, "good_fraction": 1.0, "slo_ttft_ms": 500.0, "slo_tpot_ms": 25.0}


def _finished(run: Path) -> None:
    """The report.json that marks a serving run folder finished (analysis.serving skips the others)."""
    (run / "report.json").write_text('{"stage": "throughput", "model": "m", "device": "cuda:0"}')


def test_the_serving_table_pairs_each_repeat_with_dense_and_takes_medians(tmp_path):
    from analysis import serving

    rows = [_stream_row("dense", None, None, r, 1 + r, tok, 20.0, 2.0) for r, tok in enumerate([100, 200, 400])]
    rows += [_stream_row("base", 16, None, r, 2 - r, tok, 10.0 + r, g)
             for r, (tok, g) in enumerate([(150, 3.0), (500, 5.0), (600, 4.0)])]
    rows += [_stream_row("dense", None, 4.0, 0, 1, 50, 15.0, 1.0), _stream_row("base", 16, 4.0, 0, 2, 60, 8.0, 1.5)]
    (tmp_path / "run").mkdir()
    pd.DataFrame(rows).to_csv(tmp_path / "run" / "serve.csv", index=False)
    _finished(tmp_path / "run")
    t = serving.summary(serving.load(tmp_path)).set_index(["variant", "arrivals"])
    burst = t.loc[("base", "burst")]
    # speed-ups paired within a repeat: 150/100, 500/200, 600/400 -> median 1.5, range [1.5, 2.5]
    assert burst["speedup"] == pytest.approx(1.5) and burst["speedup_max"] == pytest.approx(2.5)
    assert burst["tok_s"] == 500 and burst["tok_s_min"] == 150 and burst["repeats"] == 3
    assert burst["tpot_p50"] == 11.0 and burst["positions"] == "0,1,2"
    assert t.loc[("base", "poisson"), "repeats"] == 1 and t.loc[("base", "poisson"), "speedup"] == pytest.approx(1.2)
    best = serving.best_goodput(serving.summary(serving.load(tmp_path))).set_index("variant")
    assert best.loc["base", "goodput_req_s"] == 4.0 and best.loc["base", "at"] == "burst"
    assert best.loc["base", "over_dense"] == pytest.approx(2.0)
    serving.main(str(tmp_path), str(tmp_path / "out" / "summary"))
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"summary.csv", "summary.md", "summary_tpot.png",
                                                              "summary_tpot.svg"}


# ----------------------------------------------------------------------------------- rate search


def test_the_rate_search_bisects_to_the_highest_rate_that_attains():
    """Geometric bisection: each step halves log(high / low) around the threshold; the highest
    attaining rate ends within the last step's factor of it, and a threshold below the range
    attains nowhere."""
    from base.runtime.serving import bisect_rates

    calls = []
    tried = bisect_rates(1.0, 64.0, 8, lambda rate, step: calls.append(step) or rate <= 7.3)
    assert calls == list(range(8)) and tried[0][0] == pytest.approx(8.0)  # sqrt(1 * 64)
    best = max(r for r, ok in tried if ok)
    assert best <= 7.3 and 7.3 / best < 64 ** (1 / 2 ** 8) * 1.0001
    assert all(ok == (r <= 7.3) for r, ok in tried)
    assert not any(ok for _, ok in bisect_rates(1.0, 64.0, 5, lambda rate, step: rate <= 0.5))


def test_a_bad_search_range_is_refused_with_its_valid_range(compose):
    import run
    from base.config import ConfigError

    for bad, match in ((["serve.search_range=[8.0,2.0]"], "low must be below high"),
                       (["serve.search_range=[0.0,2.0]"], "search_range"),
                       (["serve.search_attainment=1.5"], "search_attainment"),
                       (["serve.search_steps=-1"], "search_steps")):
        with pytest.raises(ConfigError, match=match):
            run.build_config(compose(["model=tiny_qwen3", "task=smoke", "logger=none", *bad]), Path("/tmp/unused"))


def test_the_sustained_rate_table_from_search_streams():
    from analysis.serving import sustained

    def row(variant, repeat, step, rate, good):
        return {"model": "m", "routing": "uniform", "slots": 4, "variant": variant, "method": variant,
                "budget": None if variant == "dense" else 16, "repeat": repeat, "arrivals": "search",
                "search_step": step, "search_attainment": 0.9, "rate": rate, "good_fraction": good}

    df = pd.DataFrame([row("dense", 0, 0, 8.0, 1.0), row("dense", 0, 1, 22.6, 0.5),
                       row("base", 0, 0, 8.0, 1.0), row("base", 0, 1, 22.6, 0.95),
                       row("dense", 1, 0, 8.0, 0.95), row("dense", 1, 1, 22.6, 0.2),
                       row("base", 1, 0, 8.0, 0.5), row("base", 1, 1, 2.8, 0.91)])
    t = sustained(df).set_index("variant")
    assert t.loc["dense", "sustained"] == 8.0 and t.loc["dense", "steps"] == 2
    assert t.loc["base", "sustained_min"] == 2.8 and t.loc["base", "sustained_max"] == 22.6
    assert t.loc["base", "over_dense_min"] == pytest.approx(2.8 / 8) and t.loc["base", "over_dense_max"] == pytest.approx(22.6 / 8)


def test_runs_with_other_scheduler_thresholds_are_other_cells(tmp_path):
    """Two runs of the same variants, one with the default scheduler (a run from before serve.csv
    recorded its thresholds: the columns absent) and one with scheduler.min_prompt_tokens=1024:
    two cells per variant, each paired with its own dense, the thresholds and the stream's rounds
    and prefill time in the tables."""
    from analysis import serving

    old = [_stream_row("dense", None, None, 0, 1, 100, 20.0, 2.0), _stream_row("base", 16, None, 0, 2, 150, 10.0, 3.0)]
    new = [{**_stream_row("dense", None, None, 0, 1, 110, 19.0, 2.0), "min_prompt_tokens": 1024, "max_wait_steps": 8},
           {**_stream_row("base", 16, None, 0, 2, 220, 9.0, 3.0), "min_prompt_tokens": 1024, "max_wait_steps": 8}]
    for rows, rounds, prefill in ((old, 45, 1.36), (new, 15, 0.8)):
        for r in rows:
            r.update(rounds=rounds, prefill_s=prefill)
    for name, rows in (("old", old), ("new", new)):
        (tmp_path / name).mkdir()
        pd.DataFrame(rows).to_csv(tmp_path / name / "serve.csv", index=False)
        _finished(tmp_path / name)
    t = serving.summary(serving.load(tmp_path)).set_index(["variant", "min_prompt_tokens"])
    assert len(t) == 4 and t.loc[("base", 1), "speedup"] == pytest.approx(1.5)
    assert t.loc[("base", 1024), "speedup"] == pytest.approx(2.0) and t.loc[("base", 1024), "max_wait_steps"] == 8
    assert t.loc[("base", 1024), "rounds"] == 15 and t.loc[("base", 1), "prefill_s"] == pytest.approx(1.36)
    best = serving.best_goodput(serving.summary(serving.load(tmp_path)))
    assert len(best) == 4 and "min_prompt_tokens" in best
    serving.main(str(tmp_path), str(tmp_path / "out" / "summary"))
    text = (tmp_path / "out" / "summary.md").read_text()
    assert "min_prompt_tokens" in text and "prefill_s" in text and "1024" in text


def test_the_probe_table_sets_the_first_rates_stream_step_beside_both_probes(tmp_path):
    """analysis.serving.probe_table: per run and variant, the median over repeats of the streams'
    step at the variant's first rate (the burst here, not the Poisson rate run after it), against
    the engine's probe and the static engine's step; the same variant at another budget (M=10) is
    another row, its streams not pooled with M=16's."""
    from analysis.serving import probe_table

    run = tmp_path / "uniform"
    run.mkdir()
    base = {"routing": "uniform", "slots": 16, "variant": "base", "budget": 16, "occupancy_mean": 13.0}
    m10 = {**base, "budget": 10, "step_ms_median": 4.0}
    pd.DataFrame([{**base, "repeat": 0, "position": 1, "rate": None, "arrivals": "burst", "step_ms_median": 6.0},
                  {**base, "repeat": 0, "position": 1, "rate": 4.0, "arrivals": "poisson", "step_ms_median": 9.0},
                  {**base, "repeat": 1, "position": 2, "rate": None, "arrivals": "burst", "step_ms_median": 6.2},
                  {**base, "repeat": 1, "position": 2, "rate": 4.0, "arrivals": "poisson", "step_ms_median": 9.0},
                  {**m10, "repeat": 0, "position": 2, "rate": None, "arrivals": "burst"},
                  {**m10, "repeat": 1, "position": 1, "rate": None, "arrivals": "burst"}]
                 ).to_csv(run / "serve.csv", index=False)
    pd.DataFrame([{"model": "m", "routing": "uniform", "slots": 16, "variant": "base", "budget": 16, "prompt_tokens": 284,
                   "full_step_ms": 5.5, "static_step_ms": 5.0, "stream_context_median": 300.0}]
                 ).to_csv(run / "step_probe.csv", index=False)
    _finished(run)
    row = probe_table(tmp_path).iloc[0]
    assert row["in_stream_ms"] == pytest.approx(6.1) and pd.isna(row["rate"])
    assert (row["context"], row["probe_from"], row["min_prompt_tokens"]) == (300.0, 284, 1)
    assert row["stream_over_static"] == pytest.approx(0.22) and row["probe_over_static"] == pytest.approx(0.1)
    assert row["stream_over_probe"] == pytest.approx(6.1 / 5.5 - 1)
    assert len(probe_table(tmp_path)) == 1  # M=10 has no probe of its own here


def test_prefill_buckets_rebuilds_the_forwards_and_recovers_a_linear_cost(tmp_path):
    """analysis/prefill_buckets.py: a round in forwards of at most the largest bucket, each padded to
    the smallest bucket that holds it; the fit recovers a cost made exactly linear in forwards and
    padded tokens."""
    import pandas as pd
    import pytest

    from analysis.prefill_buckets import fit, forwards

    assert forwards([100, 4425, 64], [64, 128, 256, 512, 1024, 2048]) == [128, 2048, 2048, 512, 64]
    assert forwards([100], [64, 96, 128]) == [128]
    df = pd.DataFrame({"forwards": [47, 23, 23, 10], "padded_tokens": [24320, 25344, 24576, 9000]})
    df["prefill_s"] = 0.0135 * df["forwards"] + 3e-5 * df["padded_tokens"]
    a, b = fit(df)
    assert a == pytest.approx(0.0135) and b == pytest.approx(3e-5)


class _Killed(Exception):
    """Stands for SIGTERM after a stream: the run stops where emit was called."""


def _stopped_then_resumed(monkeypatch, cfg, out: Path, writer: str, name: str, read) -> list[dict]:
    """Runs `cfg` into `out`, stopped right after pipeline.outputs.<writer> wrote the file `name`,
    then the same command again; returns read(path, rows) of that write, what the stop left."""
    from omegaconf import OmegaConf

    import run
    from base.run import pipeline

    text, real, first = OmegaConf.to_yaml(cfg, resolve=True), getattr(pipeline.outputs, writer), []

    def stop(path, rows):
        real(path, rows)
        if path.name == name:
            first.extend(read(path, rows))
            raise _Killed

    monkeypatch.setattr(pipeline.outputs, writer, stop)
    with pytest.raises(_Killed):
        pipeline.run(run.build_config(cfg, out), text)
    monkeypatch.setattr(pipeline.outputs, writer, real)
    pipeline.run(run.build_config(cfg, out), text)
    return first


@pytest.mark.slow
def test_a_serve_run_killed_after_each_stream_resumes_with_every_stream_exactly_once(compose, tmp_path, monkeypatch):
    """Fault injection (issue 43: a rerun of a stopped serve run deleted its finished streams and
    served nothing again). The run is stopped right after its k-th stream's rows are written, for
    k = 1, 2, ...; each time the same command is run again. At the end every stream (and every
    request of it) is there exactly once, the streams served before a stop are the rows written then,
    and the search steps bisect to the same rates as an uninterrupted run's."""
    from omegaconf import OmegaConf

    import run
    from base.run import pipeline

    cfg = compose(_tiny_run(tmp_path, "serve", "router_sum", "serve.requests=3", "serve.rates=[null,400]",
                            "serve.repeats=2", "seed=5", "serve.search_steps=1"))
    text = OmegaConf.to_yaml(cfg, resolve=True)
    out = tmp_path / "run"
    real = pipeline.outputs.write_table
    written: dict[str, list] = {"before": []}

    def stop_after(k: int):
        def write_table(path, rows):
            real(path, rows)
            if path.name == "serve.csv" and len(rows) >= k:
                written["before"] = [dict(r) for r in rows]
                raise _Killed
        return write_table

    total = 2 * 2 * 3  # repeats x variants x (two rates + one search step)
    attempts = 0
    for k in range(1, total + 1):
        monkeypatch.setattr(pipeline.outputs, "write_table", stop_after(k))
        try:
            pipeline.run(run.build_config(cfg, out), text)
        except _Killed:
            attempts += 1
            continue
        break
    monkeypatch.setattr(pipeline.outputs, "write_table", real)
    if not (out / "report.json").exists():
        pipeline.run(run.build_config(cfg, out), text)
    assert attempts >= total - 1
    streams = pd.read_csv(out / "serve.csv")
    requests = pd.read_json(out / "requests.jsonl", lines=True)
    key = ["repeat", "variant", "arrivals", "search_step"]
    assert len(streams) == total and not streams.duplicated(key).any()
    assert len(requests) == 3 * total and not requests.duplicated([*key, "request"]).any()
    assert sorted(streams["attempt"].unique()) == list(range(streams["attempt"].max() + 1))
    before = pd.DataFrame(written["before"])  # the last stop's rows stay as they were written
    cols = ["variant", "repeat", "arrivals", "output_tokens", "duration_s"]
    assert streams.iloc[:len(before)][cols].values.tolist() == before[cols].values.tolist()
    fresh = tmp_path / "fresh"
    pipeline.run(run.build_config(cfg, fresh), text)
    again = pd.read_csv(fresh / "serve.csv")
    assert streams[key[:3]].equals(again[key[:3]])  # the same streams in the same order
    search = streams["arrivals"] == "search"
    assert streams.loc[search, "rate"].tolist() == pytest.approx(again.loc[search, "rate"].tolist())


@pytest.mark.slow
def test_a_stream_run_stopped_after_a_variant_resumes_from_it(compose, tmp_path, monkeypatch):
    """throughput.mode=stream: stopped after its first variant's row was written, the same command
    serves only the others; the first row stays as it was written."""
    cfg = compose(_tiny_run(tmp_path, "stream", "router_sum", "stream.requests_per_slot=2",
                            "stream.stats_requests_per_slot=1"))
    out = tmp_path / "run"
    first = _stopped_then_resumed(monkeypatch, cfg, out, "write_table", "stream.csv",
                                  lambda path, rows: [dict(r) for r in rows])
    rows = pd.read_csv(out / "stream.csv")
    assert rows["variant"].tolist() == ["dense", "router_sum"] and rows["attempt"].tolist() == [0, 1]
    assert rows.iloc[0]["tokens_per_s"] == pytest.approx(first[0]["tokens_per_s"], rel=1e-12)


def test_a_throughput_run_stopped_after_a_batch_size_resumes_from_it(compose, tmp_path, monkeypatch):
    """throughput.mode=steps: stopped after its first batch size (every variant and repeat of it),
    the same command measures only the second; the first batch size's rows stay as written."""
    from base.run import pipeline

    cfg = compose(["model=tiny_qwen3", "task=smoke", "logger=none", f"artifacts_dir={tmp_path}/artifacts",
                   "stage=throughput", "throughput.batch_sizes=[1,2]", "throughput.methods=[dense,router_sum]",
                   "throughput.budgets=[2]", "throughput.prompt_len=4", "throughput.gen_tokens=5", "throughput.repeats=2",
                   "throughput.profile_batch=null"])
    out = tmp_path / "run"
    first = _stopped_then_resumed(  # stopped once the first batch size's kernel rows are written
        monkeypatch, cfg, out, "write_jsonl", "kernel_rows.jsonl",
        lambda path, rows: [dict(r) for r in pipeline.outputs.read_jsonl(path.with_name("throughput_rows.jsonl"))])
    assert {r["batch_size"] for r in first} == {1}
    rows = pd.read_csv(out / "throughput.csv")
    assert sorted(set(rows["batch_size"])) == [1, 2] and len(rows) == 4
    was = {(r["variant"], r["mode"]): r["ms_per_step"] for r in first}
    for _, r in rows[rows["batch_size"] == 1].iterrows():
        assert r["ms_per_step"] == pytest.approx(was[(r["variant"], r["mode"])], rel=1e-12)
