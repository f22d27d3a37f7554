"""Mixed steps and the host off the critical path (base/runtime/scheduler.py,
base/runtime/continuous.py, base/runtime/graphs.py) on a tiny random Qwen3-MoE:

- chunked prefill: prompt chunks ride in the decode step; no request is lost, duplicated or
  reordered, and dense greedy outputs equal each request decoded alone;
- the budget binds in decode-only steps; mixed steps run every token's own routing and are
  recorded as `mixed`;
- decode first: the prefill policy admits only when it says so;
- no CUDA graph is captured again after the warm-up (a CPU stand-in for capture counts them), and
  the count does catch a re-capture when the statistics recorder is not pre-reserved;
- with the host one step behind, a host stop check ends its request one step late.
GPU tests: graph replay equals eager for packed prefill and mixed steps."""
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
from base.runtime.scheduler import Request, forwards_bound, left_pad, prefill_due, serve
from tests.helpers import ROOT, budgeted, loaded_tiny_qwen3, tiny_model_config, torch_threads

BUCKETS = [4, 8, 16]
CHUNKED = {"chunked": True, "chunk_tokens": 3, "buckets": BUCKETS}


model = pytest.fixture(scope="module")(loaded_tiny_qwen3)


def requests(n: int, seed: int, longest: int = 12, most_new: int = 7) -> list[Request]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, longest + 1, (n,), generator=g).tolist()
    return [Request(torch.randint(3, 200, (p,), generator=g).tolist(),
                    int(torch.randint(1, most_new + 1, (1,), generator=g))) for p in lengths]


def alone(model, r: Request) -> list[int]:
    engine = DecodeEngine(model, 1, 32, pad_id=0)
    try:
        return engine.generate(*left_pad([r.ids], 0), r.max_new, stop_at_eos=False).tokens_BN[0].tolist()
    finally:
        engine.release()


def run(model, reqs, slots: int, budget=None, eager_capture: bool = False, **policy):
    policy = SchedulerConfig(**policy)
    engine = ContinuousEngine(model, slots, 32, budget=budget, pad_id=0, buckets=policy.buckets)
    try:
        with torch_threads(1):
            if eager_capture:
                engine.use_eager_capture()
                engine.warm_up(mixed=policy.chunked, reserve=forwards_bound(reqs, policy.buckets))
            done, stats = serve(engine, reqs, pad_id=0, stop_at_eos=False, policy=policy)
        return done, stats, engine.graphs
    finally:
        engine.release()


def test_mixed_steps_lose_duplicate_or_reorder_no_request(model):
    reqs = requests(13, seed=0)
    done, stats, _ = run(model, reqs, slots=3, **CHUNKED)
    assert stats.mixed_steps > 0 and stats.steps > 0  # chunks rode in steps, and some steps only decoded
    assert [len(d.tokens) for d in done] == [r.max_new for r in reqs]
    assert [d.round for d in done] == sorted(d.round for d in done)  # FIFO
    assert sum(stats.occupied) + sum(stats.mixed_occupied) == sum(d.decode_steps for d in done)
    assert stats.prompt_tokens + stats.mixed_prompt_tokens == sum(len(r.ids) for r in reqs)  # every prompt token once
    for r, d in zip(reqs, done):
        assert d.tokens == alone(model, r)


@pytest.mark.slow
@pytest.mark.parametrize("policy", [
    {"chunked": True, "chunk_tokens": 16, "buckets": [16, 32]},  # whole prompts ride in one step
    {"chunked": True, "chunk_tokens": 1, "buckets": [2, 4]},  # one prompt token per step
    {"chunked": True, "chunk_tokens": 5, "buckets": [8], "min_prompt_tokens": 20, "max_wait_steps": 3},
    {"buckets": [4, 8]},  # rounds of their own, long prompts over several forwards
    {"packing": "padded"},
    {"overlap": False, **CHUNKED},
])
def test_every_policy_decodes_each_request_as_alone(model, policy):
    reqs = requests(11, seed=1)
    done, stats, _ = run(model, reqs, slots=4, **policy)
    assert sum(stats.occupied) + sum(stats.mixed_occupied) == sum(d.decode_steps for d in done)
    for r, d in zip(reqs, done):
        assert d.tokens == alone(model, r)


@pytest.mark.slow
def test_mixed_steps_through_the_triton_kernel(model, monkeypatch):
    """Mixed steps with the Triton varlen kernel (interpreted) as a GPU runs them: decode tokens
    and prompt chunks of the same rows in one stream."""
    import kernels.varlen_attention as va

    monkeypatch.setattr(va, "varlen_attention_reference", va.varlen_attention)
    reqs = requests(6, seed=6)
    done, stats, _ = run(model, reqs, slots=3, **CHUNKED)
    assert stats.mixed_steps > 0
    for r, d in zip(reqs, done):
        assert d.tokens == alone(model, r)


def test_decode_first_admits_only_when_the_policy_says(model):
    """With thresholds no stream reaches, a round is admitted only when nothing decodes: 9
    requests in 3 slots take exactly 3 rounds; admitting at once takes more."""
    reqs = [Request([5 + i, 6, 7], 2 + i % 4) for i in range(9)]
    _, lazy, _ = run(model, reqs, slots=3, min_prompt_tokens=10**6, max_wait_steps=10**6)
    _, eager, _ = run(model, reqs, slots=3)
    assert lazy.rounds == 3 < eager.rounds
    assert prefill_due(SchedulerConfig(min_prompt_tokens=50, max_wait_steps=4), True, 49, 3) is False
    assert prefill_due(SchedulerConfig(min_prompt_tokens=50, max_wait_steps=4), True, 50, 0) is True
    assert prefill_due(SchedulerConfig(min_prompt_tokens=50, max_wait_steps=4), True, 0, 4) is True
    assert prefill_due(SchedulerConfig(min_prompt_tokens=50, max_wait_steps=4), False, 0, 0) is True


def test_in_a_burst_the_thresholds_count_what_a_round_can_take(model):
    """All requests arrive at once, so the queue always holds more tokens than any threshold and
    its oldest request has waited since the start: the thresholds must count the round the free
    slots can take, and the steps a free slot has stood empty. 3-token prompts in 3 slots that free
    one at a time: `min_prompt_tokens=6` admits two or more at a time while others decode (a lone
    leftover only last), and
    `max_wait_steps=2` lets a free slot stand two steps first; both take fewer rounds than
    admitting at once, and every request still decodes as alone."""
    reqs = [Request([5 + i, 6, 7], 2 + (i * 5) % 7) for i in range(12)]
    _, eager, _ = run(model, reqs, slots=3)
    done, by_tokens, _ = run(model, reqs, slots=3, min_prompt_tokens=6, max_wait_steps=10**6)
    _, by_wait, _ = run(model, reqs, slots=3, min_prompt_tokens=10**6, max_wait_steps=2)
    assert by_tokens.rounds < eager.rounds and by_wait.rounds < eager.rounds
    sizes = {}
    for d in done:
        sizes[d.round] = sizes.get(d.round, 0) + 1
    assert sizes[0] == 3 and all(n >= 2 for r, n in sizes.items() if r < max(sizes))  # the last: what is left
    for r, d in zip(reqs, done):
        assert d.tokens == alone(model, r)


def test_the_budget_binds_in_decode_only_steps_and_mixed_steps_are_recorded(model):
    reqs = requests(9, seed=3)
    with budgeted(model, "qwen3_moe", build_selector("router_sum"), BudgetOptions(budget=2)) as budget:
        done, stats, _ = run(model, reqs, slots=4, budget=budget, **CHUNKED)
        rows = pd.DataFrame(budget.stats_rows())
    first = rows[rows["layer"] == 0]
    assert first["kind"].tolist().count("mixed") == stats.mixed_steps > 0
    assert first["kind"].tolist().count("decode") == stats.steps and "prefill" not in set(first["kind"])
    decode, mixed = rows[rows["kind"] == "decode"], rows[rows["kind"] == "mixed"]
    assert decode["kept"].max() <= 2 and (decode["union"] > 2).any()
    assert (mixed["kept"] == mixed["union"]).all() and (mixed["kept"] > 2).any()  # every token's own routing
    assert decode.loc[decode["layer"] == 0, "tokens"].tolist() == stats.occupied
    assert len(done) == 9


def test_no_graph_is_captured_again_after_the_warm_up(model):
    """A CPU stand-in for capture (base/runtime/graphs.py: eager_capture) counts what a GPU would
    capture: the warm-up captures the decode step and a prefill and a mixed step per bucket, the
    stream (statistics on, the recorder pre-reserved) none."""
    reqs = requests(20, seed=4, most_new=16)
    with budgeted(model, "qwen3_moe", build_selector("router_sum"), BudgetOptions(budget=2)) as budget:
        _, stats, graphs = run(model, reqs, slots=3, budget=budget, eager_capture=True, **CHUNKED)
        steps = int(budget.recorder.count_D)
    assert graphs.captures == 1 + 2 * len(BUCKETS) and stats.captures == 0
    assert graphs.replays == stats.steps + stats.mixed_steps + stats.prefills > 64  # past the recorder's first size
    assert steps == stats.steps + stats.mixed_steps  # every recorded forward's row kept


def test_the_capture_count_sees_a_recorder_that_grows_mid_stream(model):
    """Without a reservation the recorder grows past its first 64 rows and the decode step is
    captured again: what the reservation prevents, and what the count would show."""
    with budgeted(model, "qwen3_moe", build_selector("router_sum"), BudgetOptions(budget=2)) as budget:
        engine = ContinuousEngine(model, 2, 32, budget=budget, pad_id=0, buckets=BUCKETS)
        try:
            with torch_threads(1):
                engine.use_eager_capture()
                engine.reset(stop_at_eos=False, reserve=0)
                for _ in range(70):
                    engine.step()
        finally:
            engine.release()
    assert engine.graphs.captures == 2


@pytest.mark.parametrize("overlap", [True, False])
def test_a_host_stop_check_ends_its_request_one_step_late_and_is_counted(model, overlap):
    """Request 0 stops (a host check, not on the device) after 3 tokens of its 9: its tokens are
    the first 3 of its lone decoding; the host acting one forward behind (overlap or not), its row
    decodes one more step (dropped), which the union statistics see and the stream counts."""
    reqs = [Request([5, 6, 7], 9, done=lambda toks: len(toks) >= 3), Request([8, 9, 10, 11], 8)]
    with budgeted(model, "qwen3_moe", None, BudgetOptions(budget=None)) as budget:
        done, stats, _ = run(model, reqs, slots=2, budget=budget, overlap=overlap)
        rows = pd.DataFrame(budget.stats_rows())
    assert done[0].tokens == alone(model, Request([5, 6, 7], 9))[:3] and done[0].decode_steps == 2
    assert done[1].tokens == alone(model, reqs[1])
    rows_tokens = int(rows.loc[(rows["layer"] == 0) & (rows["kind"] == "decode"), "tokens"].sum())
    assert rows_tokens == sum(stats.occupied) + 1 and stats.late_rows == 1


@pytest.mark.slow
@pytest.mark.parametrize("chunked", [False, True])
def test_compiled_packed_prefill_decodes_each_request_as_alone(model, chunked):
    """Where the engine compiles its regions, packed prefills (and mixed steps) run through the
    compiled attention halves too (Inductor on the CPU here; the packed K/V write and varlen attention as custom ops):
    every request's tokens as decoded alone, and the packed shapes compiled (more graphs than the
    decode step's half and final norm)."""
    reqs = requests(9, seed=4)
    policy = SchedulerConfig(buckets=BUCKETS, chunked=chunked, chunk_tokens=3)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    engine = ContinuousEngine(model, 3, 32, pad_id=0, buckets=policy.buckets, compile=True)
    try:
        with torch_threads(1):
            done, stats = serve(engine, reqs, pad_id=0, stop_at_eos=False, policy=policy)
    finally:
        engine.release()
    assert (stats.mixed_steps > 0) == chunked
    for r, d in zip(reqs, done):
        assert d.tokens == alone(model, r)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 2


@pytest.mark.slow
def test_compiled_packed_prefill_under_a_budget_serves_as_the_eager_prefill(model):
    """With a budget (router_sum at 2 of 16 experts, chunked): the compiled engine's packed forwards
    and decode steps give the eager engine's tokens and statistics rows."""
    reqs = requests(7, seed=8)
    policy = SchedulerConfig(**CHUNKED)
    results = []
    for compile in (False, True):
        torch._dynamo.reset()
        with budgeted(model, "qwen3_moe", build_selector("router_sum"), BudgetOptions(budget=2)) as budget:
            engine = ContinuousEngine(model, 3, 32, budget=budget, pad_id=0, buckets=policy.buckets,
                                      compile=compile)
            try:
                with torch_threads(1):
                    done, stats = serve(engine, reqs, pad_id=0, stop_at_eos=False, policy=policy)
            finally:
                engine.release()
            rows = budget.stats_rows()
        results.append(([d.tokens for d in done], [(r["layer"], r["kind"], r["union"], r["kept"], r["tokens"])
                                                   for r in rows], stats.mixed_steps))
    assert results[0] == results[1] and results[1][2] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("method,chunked,compile,warm", [
    ("dense", False, False, True), ("dense", True, False, True), ("base", False, False, True),
    ("base", True, False, True), ("base", True, True, True), ("dense", False, True, True),
    ("base", False, True, False)])
def test_gpu_graph_replay_equals_eager_for_packed_prefill_and_mixed_steps(method, chunked, compile, warm):
    """On a GPU: the same stream served eagerly and from CUDA graphs (packed prefill per bucket,
    mixed steps, decode step; `compile`: the regions compiled, the decode step's and the packed
    forwards', as the benchmarks run it) gives the same tokens and statistics; after the warm-up
    nothing is captured again. Without a warm-up (`warm` false: the evaluation's engine,
    base/eval/batches.py) each packed shape compiles and is captured at its first use."""
    from base.hf.experts_impl import register_base_triton
    from tests.helpers import model_artifacts

    register_base_triton()
    cfg = tiny_model_config("qwen3")
    cfg.device, cfg.experts_impl = "cuda", "base_triton"
    gpu_model = load_model(cfg, ROOT, seed=0, experts_impl="base_triton")
    reqs = requests(17, seed=5, longest=20)
    policy = SchedulerConfig(chunked=chunked, chunk_tokens=6, buckets=[8, 16, 32])
    results = {}
    for graph in (False, True):
        sel = None if method == "dense" else build_selector(method, model_artifacts(gpu_model))
        with budgeted(gpu_model, "qwen3_moe", sel, BudgetOptions(budget=3, backend="triton")) as budget:
            engine = ContinuousEngine(gpu_model, 4, 48, budget=budget, pad_id=0, graph=graph,
                                      compile=compile and graph, buckets=policy.buckets)
            try:
                if warm:
                    engine.warm_up(mixed=chunked, reserve=forwards_bound(reqs, policy.buckets))
                done, stats = serve(engine, reqs, pad_id=0, stop_at_eos=False, policy=policy)
            finally:
                engine.release()
            results[graph] = ([d.tokens for d in done], budget.stats_rows(), stats)
    (eager_toks, eager_rows, _), (graph_toks, graph_rows, graph_stats) = results[False], results[True]
    assert graph_toks == eager_toks
    assert (graph_stats.captures == 0 and not any(graph_stats.eager)) or not warm
    assert (graph_stats.mixed_steps > 0) == chunked
    assert [(r["layer"], r["kind"], r["union"], r["kept"], r["tokens"]) for r in graph_rows] == \
        [(r["layer"], r["kind"], r["union"], r["kept"], r["tokens"]) for r in eager_rows]


def test_a_step_that_cannot_be_captured_says_which_and_why(model):
    from base.runtime.graphs import CaptureError, StepGraphs

    def no_capture(step):
        raise RuntimeError("operation not permitted when stream is capturing")

    engine = ContinuousEngine(model, 2, 16, pad_id=0, buckets=BUCKETS)
    engine.graphs = StepGraphs(True, no_capture)
    try:
        engine.reset()
        with pytest.raises(CaptureError, match=r"the \('decode',\) step cannot be captured .*not permitted.*"
                                               r"experts implementation"):
            engine.step()
    finally:
        engine.release()


def test_the_step_probe_fills_every_slot_over_as_many_prefills_as_it_takes(model):
    """The probe's rows hold `prompt_tokens` each even when all of them exceed the largest token
    bucket (3 slots x 12 tokens in buckets of at most 16: three packed prefills) and it times the
    step there; a context the largest bucket cannot hold is refused."""
    from base.runtime.packing import Chunk
    from base.runtime.step_probe import _rounds, probe_forwards

    prompts = [list(range(5 + i, 17 + i)) for i in range(3)]
    assert [[c.slot for c in r] for r in _rounds([Chunk(s, p, 0, True) for s, p in enumerate(prompts)], 16)] == [
        [0], [1], [2]]
    engine = ContinuousEngine(model, 3, 64, pad_id=0, buckets=[8, 16])
    try:
        with torch_threads(1):
            row = probe_forwards(engine, prompts, steps=2, prompt_tokens=12, profiled=1, prefills=1)
            assert row["prompt_tokens"] == 12 and row["full_step_ms"] > 0 and row["kernels_per_layer"] > 0
            with pytest.raises(ValueError, match="prompt_tokens=17 must be in 1..16"):
                probe_forwards(engine, prompts, steps=2, prompt_tokens=17, profiled=1, prefills=1)
    finally:
        engine.release()


def test_decode_attention_reads_up_to_the_last_slot_of_a_row_still_decoding(model):
    """A row that has ended keeps its last slot until it is admitted again; the decode step's
    attention then reads only as far as the rows still decoding (the longest ended row set it
    before)."""
    from base.runtime.packing import Chunk

    with budgeted(model, "qwen3_moe", None, BudgetOptions(budget=None)) as budget:
        engine = ContinuousEngine(model, 2, 32, budget=budget, pad_id=0, buckets=BUCKETS)
        try:
            with torch_threads(1):
                engine.use_eager_capture()
                engine.reset(stop_at_eos=False)
                engine.run_packed([Chunk(0, [5, 6, 7], 0, True, 20), Chunk(1, list(range(3, 15)), 0, True, 20)],
                                  mixed=False)
                engine.step()
                last = engine.cache._last[engine.device]
                assert last.tolist() == [12]  # both rows decoding: row 1 wrote slot 12
                engine.end(1)
                engine.step()
                assert last.tolist() == [4]  # row 0 alone: its slot 4, not row 1's old one
                assert engine.slot_B1[1, 0].item() == 13  # row 1 stays where it ended
        finally:
            engine.release()


@pytest.mark.parametrize("overlap", [True, False])
def test_each_decode_step_records_the_context_its_longest_decoding_row_reads(model, overlap):
    """Prompts of 3 and 5 tokens, 4 and 2 new tokens, admitted together: the first decode step
    reads 6 slots (the 5-token prompt and its first token), then the 3-token request decodes
    alone (5, then 6); the stream's median is theirs."""
    reqs = [Request([5, 6, 7], 4), Request([8, 9, 10, 11, 12], 2)]
    _, stats, _ = run(model, reqs, slots=2, overlap=overlap)
    assert stats.context == [6, 5, 6]
    assert stats.summary()["context_median"] == 6.0


@pytest.mark.slow
def test_compiled_packed_prefill_compiles_each_shape_once(model):
    """The compiled packed prefill: the K/V buffers exist before the first compiled forward, so a
    packed shape compiles once. Before, the first compiled forward traced the buffers' allocation,
    its guards failed at the next run and dynamo recompiled: on a GPU inside the CUDA graph's
    capture, which fails (capture_outputs runs a step eagerly, then captures the same step)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    engine = ContinuousEngine(model, 3, 32, pad_id=0, buckets=BUCKETS, compile=True)
    try:
        with torch_threads(1):
            engine.reset()
            assert engine.cache.modules  # allocated eagerly, before anything compiled ran
            engine.run_packed([], mixed=False, bucket=BUCKETS[0])
            compiled = dict(torch._dynamo.utils.counters["stats"])
            for _ in range(2):
                engine.run_packed([], mixed=False, bucket=BUCKETS[0])
            assert dict(torch._dynamo.utils.counters["stats"]) == compiled
            assert not torch._dynamo.utils.counters["recompiles"]
    finally:
        engine.release()
