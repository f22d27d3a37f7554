"""Continuous batching (base/runtime/continuous.py, base/runtime/scheduler.py) on a tiny random
Qwen3-MoE: a finished slot takes the next request at the next step, every request decodes exactly
as it would alone (dense, greedy), none is lost or duplicated when requests outnumber slots, FIFO
admission keeps the given order, and a budget sees exactly the occupied rows. (Packed prefill,
mixed steps and graph captures: test_packed_prefill.py, test_mixed_steps.py; stops: test_stops.py.)"""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from base.config import SchedulerConfig
from base.hf.budget import BudgetOptions
from base.hf.loading import load_model
from base.method.selectors import build_selector
from base.runtime.continuous import ContinuousEngine
from base.runtime.engine import DecodeEngine
from base.runtime.scheduler import Request, left_pad, serve
from tests.helpers import ROOT, budgeted, loaded_tiny_qwen3, tiny_model_config


model = pytest.fixture(scope="module")(loaded_tiny_qwen3)


def random_requests(n: int, seed: int) -> list[Request]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 9, (n,), generator=g).tolist()
    return [Request(torch.randint(3, 200, (p,), generator=g).tolist(), int(torch.randint(2, 8, (1,), generator=g)))
            for p in lengths]


def alone(model, r: Request) -> list[int]:
    """The request decoded by itself in the static engine."""
    engine = DecodeEngine(model, 1, 32, pad_id=0)
    try:
        ids, mask = left_pad([r.ids], 0)
        return engine.generate(ids, mask, r.max_new, stop_at_eos=False).tokens_BN[0].tolist()
    finally:
        engine.release()


def run(model, reqs: list[Request], slots: int, budget=None, **policy):
    """Serve through a fresh engine under SchedulerConfig(**policy)."""
    policy = SchedulerConfig(**policy)
    engine = ContinuousEngine(model, slots, 32, budget=budget, pad_id=0, buckets=policy.buckets)
    try:
        return serve(engine, reqs, pad_id=0, stop_at_eos=False, policy=policy)
    finally:
        engine.release()


def test_every_request_decodes_as_it_would_alone(model):
    reqs = random_requests(11, seed=0)
    done, stats = run(model, reqs, slots=4)
    assert stats.rounds > 1 and max(stats.occupied) == 4  # slots were refilled
    for r, d in zip(reqs, done):
        assert d.tokens == alone(model, r)


@pytest.mark.parametrize("overlap", [True, False])
def test_a_finished_slot_takes_the_next_request_at_the_next_step(model, overlap):
    """Two slots. Request 0 wants 2 tokens (the prefill's and one step's), request 1 wants 6,
    request 2 wants 3: request 2 takes request 0's slot right after step 1. The slot is given
    back when the step that ends request 0 is launched (its limit is known), before that step's
    token is read, with overlap or without (the schedule never depends on it)."""
    reqs = [Request([5, 6, 7], 2), Request([8, 9], 6), Request([10, 11, 12, 13], 3)]
    done, stats = run(model, reqs, slots=2, overlap=overlap)
    assert [(d.round, d.slot) for d in done] == [(0, 0), (0, 1), (1, 0)]
    assert [len(d.tokens) for d in done] == [2, 6, 3] and [d.decode_steps for d in done] == [1, 5, 2]
    assert stats.occupied == [2, 2, 2, 1, 1] and stats.rounds == 2
    assert done[2].admitted_s < done[0].finished_s


def test_no_request_is_lost_or_duplicated_and_admission_keeps_the_order(model):
    reqs = random_requests(23, seed=1)
    done, stats = run(model, reqs, slots=3)
    assert len(done) == 23 and all(len(d.tokens) == r.max_new for r, d in zip(reqs, done))
    rounds = [d.round for d in done]
    assert rounds == sorted(rounds)  # FIFO: a later request never joins before an earlier one
    assert sum(stats.occupied) == sum(d.decode_steps for d in done)  # every occupied step is one request's


def test_a_request_waits_for_its_arrival(model):
    reqs = random_requests(4, seed=2)
    reqs[3].arrival_s = 0.3
    done, _ = run(model, reqs, slots=4)
    assert done[3].admitted_s >= 0.3 and done[3].round > 0 and done[3].ttft_s >= 0


def test_a_budget_sees_exactly_the_occupied_rows(model):
    reqs = random_requests(9, seed=3)
    with budgeted(model, "qwen3_moe", build_selector("router_sum"), BudgetOptions(budget=2)) as budget:
        done, stats = run(model, reqs, slots=4, budget=budget)
        rows = pd.DataFrame(budget.stats_rows())
    decode = rows[rows["decode"]]
    assert decode.loc[decode["layer"] == 0, "tokens"].tolist() == stats.occupied
    assert decode["kept"].max() <= 2 and (decode["union"] > 2).any()
    assert len(done) == 9


def test_dense_evaluation_answers_the_same_under_both_batchings(compose, tmp_path):
    """lm-eval through continuous batching (3 slots for 8 requests) gives every request the answer
    static batching gives it, for dense greedy decoding."""
    from omegaconf import OmegaConf

    import run
    from base.run.pipeline import run as run_pipeline

    samples, reports = {}, {}
    for batching in ("continuous", "static"):
        cfg = compose(["model=tiny_qwen3", "task=smoke", "logger=none", "method=dense", "batch_size=3",
                       f"eval.batching={batching}", f"artifacts_dir={tmp_path}/a"])
        out = tmp_path / batching
        report = run_pipeline(run.build_config(cfg, out), OmegaConf.to_yaml(cfg, resolve=True))
        samples[batching] = pd.read_json(out / "samples.jsonl", lines=True).set_index(["task", "doc_id"])
        reports[batching] = report
        assert report["eval"]["batching"] == batching
    cont, static = samples["continuous"], samples["static"]
    assert len(cont) == 8 and (cont["generation"] == static.loc[cont.index, "generation"]).all()
    # finished rows make room at once instead of idling until their batch ends (here all run 6 tokens)
    occupancy = {b: r["summary"]["occupancy_mean"] for b, r in reports.items()}
    assert occupancy["continuous"] >= occupancy["static"]
    assert reports["continuous"]["eval"]["steps"] == reports["continuous"]["eval"]["decode_steps"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["dense", "base"])
def test_gpu_graph_replay_equals_eager_under_refill(method):
    from base.hf.experts_impl import register_base_triton
    from tests.helpers import model_artifacts

    register_base_triton()
    cfg = tiny_model_config("qwen3")
    cfg.device, cfg.experts_impl = "cuda", "base_triton"
    gpu_model = load_model(cfg, ROOT, seed=0, experts_impl="base_triton")
    reqs = random_requests(13, seed=4)
    results = {}
    for graph in (False, True):
        sel = None if method == "dense" else build_selector(method, model_artifacts(gpu_model))
        with budgeted(gpu_model, "qwen3_moe", sel, BudgetOptions(budget=3, backend="triton")) as budget:
            engine = ContinuousEngine(gpu_model, 4, 32, budget=budget, pad_id=0, graph=graph, compile=False)
            try:
                done, stats = serve(engine, reqs, pad_id=0, stop_at_eos=False)
            finally:
                engine.release()
            results[graph] = ([d.tokens for d in done], budget.stats_rows(), stats.eager)
    (eager_toks, eager_rows, _), (graph_toks, graph_rows, graph_eager) = results[False], results[True]
    assert graph_toks == eager_toks and sum(graph_eager) == 1  # one capture, then replays
    assert [(r["layer"], r["union"], r["kept"], r["tokens"]) for r in graph_rows] == \
        [(r["layer"], r["union"], r["kept"], r["tokens"]) for r in eager_rows]


# ---- admission -----------------------------------------------------------------------------------
def _sets(*rows: list[int], E: int = 6) -> torch.Tensor:
    """bool (1, E) predicted experts of one request (one layer)."""
    out = torch.zeros(1, E, dtype=torch.bool)
    out[0, list(rows[0])] = True
    return out


def test_union_admission_takes_the_best_overlap_and_bounds_the_wait():
    from base.runtime.admission import UnionAdmission

    predicted = {0: _sets([0, 1]), 1: _sets([4, 5]), 2: _sets([0, 2]), 3: _sets([1, 0]), 4: _sets([3, 5])}
    pick = UnionAdmission(lambda i: predicted[i], max_wait_rounds=2)
    # request 0 runs: 3 shares both its experts, 2 one of two, 1 and 4 none
    assert pick([1, 2, 3, 4], free=1, running=[0]) == [3]
    assert pick([1, 2, 4], free=2, running=[0]) == [2, 1]  # then 1 (ties go to the earlier request)
    assert pick.passed == {1: 1, 2: 1, 4: 2}
    # request 4 was passed over twice: it goes first now, whatever its overlap
    assert pick([4], free=1, running=[0])[0] == 4


def test_prompt_experts_are_the_most_weighted_experts_of_the_prompt(model):
    from base.runtime.admission import prompt_experts
    from tests.helpers import MoeProbe

    ids = [5, 9, 17, 33, 65, 129]
    probe = MoeProbe(model)
    with budgeted(model, "qwen3_moe", None, BudgetOptions(budget=None)) as budget, probe:
        got_LE = prompt_experts(model, budget, ids, per_layer=3)
    probe.remove()
    for layer in range(got_LE.shape[0]):
        idx_TK, w_TK = probe.routed[0, layer][:2]
        weight_E = torch.zeros(got_LE.shape[1]).index_add_(0, idx_TK.reshape(-1), w_TK.reshape(-1).float())
        assert set(torch.nonzero(got_LE[layer]).flatten().tolist()) == set(weight_E.topk(3).indices.tolist())


def test_union_admission_in_the_scheduler_serves_everyone(model):
    from base.runtime.admission import UnionAdmission, prompt_experts

    reqs = random_requests(10, seed=5)
    with budgeted(model, "qwen3_moe", None, BudgetOptions(budget=None)) as budget:
        predicted = [prompt_experts(model, budget, r.ids, 4) for r in reqs]
        engine = ContinuousEngine(model, 3, 32, budget=budget, pad_id=0)
        try:
            done, _ = serve(engine, reqs, 0, pick=UnionAdmission(lambda i: predicted[i], 1), stop_at_eos=False)
        finally:
            engine.release()
    assert [len(d.tokens) for d in done] == [r.max_new for r in reqs]
    for r, d in zip(reqs, done):  # who shares a step changes nothing for dense greedy decoding
        assert d.tokens == alone(model, r)
