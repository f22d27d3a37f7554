"""A serving benchmark after `vllm bench serve`: Poisson arrivals at several rates, repeats with the
variants' order rotated, per-request latency and goodput.

    requests, streams, info = measure_serving(model, make_budget, variants, tp, stream_cfg, serve_cfg, seed,
                                              scheduler=scheduler_cfg)

`throughput.mode=serve` (conf/experiment/serve.yaml; `serve.*`). For each slot count
(`throughput.batch_sizes`):

  requests  `serve.requests` requests with random prompt tokens, prompt and output lengths drawn as
            in stream mode (`stream.prompt_len`, `stream.output_len` or `stream.lengths_from`),
            EOS ignored: the same requests at every rate, in every repeat and for every variant
  arrivals  per rate of `serve.rates`, the seeded Poisson schedule of base/runtime/arrivals.py
            (one draw, scaled to each rate); a null rate is the closed burst (all at time 0)
  warm-up   before anything is timed, once per slot count: every prompt of the stream is prefilled
            once, in admission rounds whose sizes cycle over the slot count and the powers of two
            below it (the round shapes of a burst and of sparse arrivals), so no variant meets a
            prefill shape first in its timed streams (the variants prefill alike: the budget binds
            decode steps, `method.apply_to=decode`); then per engine its warm-up, which captures the
            decode step and every token bucket's packed prefill (and mixed step) before its first
            stream (`scheduler.packing=padded`: one round, which captures the decode step)
  search    with serve.search_steps > 0, after the rates: a geometric bisection over
            serve.search_range (requests/s) for the highest rate at which at least
            serve.search_attainment of a stream's requests meet both SLOs, one stream per step
            (`arrivals` "search"; analysis/serving.py reads the sustained rate from them)
  order     repeat r serves the variants in the list's order started at variant (r x V) // R
            (V variants, R = serve.repeats), so the first place rotates; each variant serves every
            rate in the listed order through one engine, reset before each stream
  serving   through base/runtime/scheduler.py with the run's `scheduler.*` (packing, chunked
            prefill in mixed steps, when a prefill is due, the host one step behind)
  records   per request: TTFT, TPOT, E2EL, its inter-token latencies (base/runtime/serve_metrics.py),
            arrival, admission round; per stream: mean / p50 / p99 of each, achieved tokens/s and
            requests/s, goodput under serve.slo_ttft_ms / slo_tpot_ms, occupancy, rounds, prefill
            forwards and their seconds and prompt tokens/s, mixed steps and their share, the median
            replayed decode step, the steps run eagerly and the graphs captured during the stream
            (0 after a warm-up that covered every shape; on a CPU every step is eager, and the
            figures check the bookkeeping, not speed); the device time between forwards (`gap`)
            and the host time to launch each step
  probe     once per variant and slot count (first repeat, packed prefill), after its streams:
            the engine's decode step with every slot decoding from the median context the first
            stream's decode steps read and its packed prefill of the largest token bucket, each
            replayed back to back, and their kernels by class and name (base/runtime/step_probe.py);
            then, its engine released, the static engine's decode step at the same rows and
            context (`static_step_ms`, base/runtime/throughput.py): the stream's step against both
            -> step_probe.csv, step_probe_kernels.csv

Statistics are not recorded (the recorder adds kernels to the step): union and kept experts per
variant are what stream mode measures.

Resuming: `earlier` holds the rows a stopped attempt of the same run wrote as it went (its
requests, streams and step probes: the run folder's requests.jsonl, serve.csv, step_probe.jsonl).
A stream already served is not served again: its rows are taken as they were, in their place in
the order, and a variant whose streams and probe are all done is not even built; the search
reuses the outcomes of its earlier steps, so it bisects to the same rates. Each stream row says
which attempt served it (`attempt`: 0 the first, counting up), so a reader can tell resumed rows apart.
"""
from __future__ import annotations

import functools
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from torch import nn

from base.config import (
    SchedulerConfig,
    ServeConfig,
    StreamConfig,
    ThroughputConfig,
    cache_length,
)
from base.hf.budget import MoeBudget
from base.progress import progress, say
from base.runtime.arrivals import arrival_times
from base.runtime.continuous import ContinuousEngine
from base.runtime.scheduler import Finished, Request, ServeStats, serve
from base.runtime.serve_metrics import Slo, request_metrics, stream_metrics
from base.runtime.step_probe import STEPS, longest_context, probe_forwards
from base.runtime.stream import make_stream
from base.runtime.throughput import Variant, static_step_ms

Emit = Callable[[list[dict], list[dict], list[dict]], None]
STREAM_KEY = ("slots", "repeat", "variant", "budget", "rate", "arrivals", "search_step")


def stream_key(row: dict) -> tuple:
    """A stream's identity within a run (CSV-read rows: NaN is None, whole floats are ints)."""
    def norm(v):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return None
        if isinstance(v, float) and v.is_integer():
            return int(v)
        return v
    key = [norm(row.get(k)) for k in STREAM_KEY]
    if row.get("arrivals") == "search":  # a search step is known by its number (its rate follows from the earlier ones)
        key[STREAM_KEY.index("rate")] = None
    return tuple(key)


@dataclass
class Earlier:
    """What a stopped attempt of the run served: its rows, by stream (see the module doc)."""

    requests: list[dict] = field(default_factory=list)
    streams: list[dict] = field(default_factory=list)
    probes: list[dict] = field(default_factory=list)

    def stream(self, keys: dict) -> tuple[dict, list[dict]] | None:
        key = stream_key(keys)
        for row in self.streams:
            if stream_key(row) == key:
                return row, [r for r in self.requests if stream_key(r) == key]
        return None

    def probe(self, slots: int, label: str) -> dict | None:
        return next((p for p in self.probes if p.get("slots") == slots and p.get("variant") == label), None)

    @property
    def attempt(self) -> int:
        return 1 + max((int(r.get("attempt") or 0) for r in self.streams), default=-1)


def rotated(items: list, repeat: int, repeats: int) -> list:
    """Repeat `repeat`'s order of `items`: the list started at item (repeat x len) // repeats."""
    start = (repeat * len(items)) // repeats % len(items)
    return items[start:] + items[:start]


def bisect_rates(low: float, high: float, steps: int,
                 attained: Callable[[float, int], bool]) -> list[tuple[float, bool]]:
    """The highest request rate in [low, high] at which `attained(rate, step)` holds, by `steps`
    geometric bisections (each serves one stream): (rate, attained) per step. The sustained rate is
    the highest rate that attained; none did if every step failed (the rate is below `low`)."""
    tried = []
    for step in range(steps):
        rate = math.sqrt(low * high)
        ok = attained(rate, step)
        tried.append((rate, ok))
        low, high = (rate, high) if ok else (low, rate)
    return tried


def round_sizes(slots: int) -> list[int]:
    """The warm-up's admission round sizes: the slot count, then the powers of two below it."""
    return [slots] + [1 << k for k in range(slots.bit_length()) if (1 << k) < slots]


def _sized_rounds(slots: int):
    """An admission policy (scheduler.serve's `pick`) whose round sizes cycle over round_sizes."""
    sizes = itertools.cycle(round_sizes(slots))
    return lambda waiting, free, running: waiting[:min(free, next(sizes))]


class _Engine:
    """A variant's budget installed and a fresh continuous engine over it (released on exit)."""

    def __init__(self, model: nn.Module, make_budget: Callable[[Variant, bool], MoeBudget | None], v: Variant,
                 slots: int, length: int, tp: ThroughputConfig, scheduler: SchedulerConfig) -> None:
        self.budget = make_budget(v, False)
        try:
            self.engine = ContinuousEngine(model, slots, length, budget=self.budget,
                                           compile=None if tp.compile else False,
                                           buckets=scheduler.buckets)
        except BaseException:
            self._remove()
            raise

    def __enter__(self) -> ContinuousEngine:
        return self.engine

    def __exit__(self, *exc) -> None:
        try:
            self.engine.release()
        finally:
            self._remove()

    def _remove(self) -> None:
        if self.budget is not None:
            self.budget.remove()


def warm_prefill(model: nn.Module, make_budget: Callable[[Variant, bool], MoeBudget | None], v: Variant,
                 slots: int, length: int, tp: ThroughputConfig, scheduler: SchedulerConfig,
                 requests: list[Request]) -> float:
    """Prefill every prompt once in rounds of round_sizes(slots) through variant v; seconds taken."""
    t0 = time.perf_counter()
    with _Engine(model, make_budget, v, slots, length, tp, scheduler) as engine:
        _warm_engine(engine, scheduler, requests)
        serve(engine, [Request(r.ids, 2) for r in requests], pad_id=0, pick=_sized_rounds(slots), stop_at_eos=False,
              policy=scheduler)
    return time.perf_counter() - t0


def _probe_context(engine: ContinuousEngine, stream: dict, requests: list[Request]) -> int:
    """The step probes' prompt length: the median context the stream's decode steps read (its
    longest decoding row's prompt and tokens so far; decode attention reads every row that far),
    less half the probe's timed steps (it decodes on from there), within what the probe can hold.
    Without a decode step in the stream: the requests' median prompt."""
    median = stream.get("context_median")
    if median is None:
        median = sorted(len(r.ids) for r in requests)[len(requests) // 2]
    return max(1, min(int(median) - STEPS // 2, longest_context(engine)))


def _warm_engine(engine: ContinuousEngine, scheduler: SchedulerConfig, requests: list[Request]) -> None:
    """Capture every forward shape of the engine before its first timed stream."""
    if scheduler.packing == "packed":
        engine.warm_up(mixed=scheduler.chunked)
    else:  # padded prefill is eager: one round captures the decode step
        serve(engine, [Request(r.ids, 3) for r in requests[:engine.B]], pad_id=0, stop_at_eos=False, policy=scheduler)


def _records(done: list[Finished], requests: list[Request], keys: dict[str, Any]) -> list[dict]:
    return [{**keys, "request": i, "round": d.round, "arrival_s": d.arrival_s, "first_token_s": d.token_s[0],
             "last_token_s": d.token_s[-1], "decode_steps": d.decode_steps,
             **request_metrics(d.arrival_s, d.token_s, len(r.ids))}
            for i, (d, r) in enumerate(zip(done, requests))]


def _summary(rows: list[dict], stats: ServeStats, keys: dict[str, Any], slo: Slo) -> dict:
    counts = stats.summary()
    return {**keys, "requests": len(rows),
            **stream_metrics(rows, max(r["last_token_s"] for r in rows), slo),
            **{k: counts[k] for k in ("occupancy_mean", "steps", "mixed_steps", "mixed_share", "rounds", "prefills",
                                      "prefill_s", "prompt_tokens", "prefill_tokens_per_s", "eager_steps",
                                      "captures", "step_ms_median", "gap_ms_median", "launch_ms_median",
                                      "context_median")}}


class _Rows:
    """The run's rows so far, handed to `emit` after every stream and probe; `bar` counts the streams."""

    def __init__(self, emit: Emit | None, streams: int = 0) -> None:
        self.requests: list[dict] = []
        self.streams: list[dict] = []
        self.probes: list[dict] = []
        self._emit = emit
        self.bar = progress(total=streams, desc="serve", unit="stream")

    def emit(self) -> None:
        if self._emit is not None:
            self._emit(self.requests, self.streams, self.probes)


def _serve_stream(engine: ContinuousEngine | None, requests: list[Request], seed: int, scheduler: SchedulerConfig,
                  slo: Slo, rows_so_far: _Rows, earlier: Earlier, attempt: int, keys: dict[str, Any]) -> dict:
    """Serve `requests` arriving at keys["rate"] (None: the burst; the seeded draw, scaled) through
    the engine, or take the stream's rows from an earlier attempt; the rows go to `rows_so_far`
    (emitted); returns the stream's row."""
    rate = keys["rate"]
    served = earlier.stream(keys)
    if served is not None:  # a stopped attempt of this run served it
        summary, rows = served
        rows_so_far.requests.extend(rows)
        rows_so_far.streams.append(summary)
        rows_so_far.emit()
        rows_so_far.bar.update()
        return summary
    stream = [replace(r, arrival_s=a) for r, a in zip(requests, arrival_times(len(requests), rate, seed))]
    done, stats = serve(engine, stream, pad_id=0, stop_at_eos=False, policy=scheduler)
    rows = _records(done, stream, keys)
    summary = {**_summary(rows, stats, keys, slo), "attempt": attempt}
    rows_so_far.requests.extend(rows)
    rows_so_far.streams.append(summary)
    rows_so_far.emit()
    rows_so_far.bar.update()
    say(f"[serve] {keys['slots']} slots, repeat {keys['repeat']}, {keys['variant']} budget={keys['budget']}, "
        f"{'burst' if rate is None else f'{rate:g} req/s'}{' (search)' if keys['arrivals'] == 'search' else ''}: "
        f"{summary['output_throughput']:.0f} tok/s, TTFT p50 {summary['ttft_ms_p50']:.0f} ms, "
        f"TPOT p50 {summary['tpot_ms_p50'] or float('nan'):.2f} ms, goodput {summary['goodput']:.2f} req/s")
    return summary


def _stream_plan(cfg: ServeConfig, keys: dict[str, Any]) -> list[dict[str, Any]]:
    """The keys of a variant's rate streams (the search's depend on their outcomes: not planned)."""
    return [{**keys, "rate": rate, "arrivals": "burst" if rate is None else "poisson"} for rate in cfg.rates]


def _all_done(cfg: ServeConfig, keys: dict[str, Any], earlier: Earlier) -> bool:
    """Every stream of a variant served by an earlier attempt (the search's steps replayed from it)."""
    if any(earlier.stream(k) is None for k in _stream_plan(cfg, keys)):
        return False
    if not cfg.search_steps:
        return True
    done = [r for r in earlier.streams if stream_key(r)[:4] == stream_key(keys)[:4] and r.get("arrivals") == "search"]
    return len(done) >= cfg.search_steps


def measure_serving(model: nn.Module, make_budget: Callable[[Variant, bool], MoeBudget | None],
                    variants: list[Variant], tp: ThroughputConfig, stream_cfg: StreamConfig, cfg: ServeConfig,
                    seed: int, lengths: list[tuple[int, int]] | None = None, emit: Emit | None = None,
                    scheduler: SchedulerConfig | None = None,
                    earlier: Earlier | None = None) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """(request rows, stream rows, info) as the module doc says; `emit(requests, streams, probes)`
    gets the rows so far after every stream and probe (a run folder holds them before the run
    ends); `earlier`: a stopped attempt's rows, resumed from (the module doc)."""
    scheduler = scheduler or SchedulerConfig()
    earlier = earlier or Earlier()
    attempt = earlier.attempt
    vocab = model.config.vocab_size
    length = cache_length(stream_cfg.longest(lengths))
    slo = Slo(cfg.slo_ttft_ms, cfg.slo_tpot_ms)
    rows = _Rows(emit, len(tp.batch_sizes) * cfg.repeats * len(variants) * (len(cfg.rates) + cfg.search_steps))
    info: dict[str, Any] = {"warmup_s": {}, "orders": [], "step_probe": rows.probes, "resumed_streams": 0,
                            "attempt": attempt}
    for slots in tp.batch_sizes:
        requests = make_stream(cfg.requests, vocab, stream_cfg, seed + slots, lengths)  # stream.rate: null
        plans = []
        for repeat in range(cfg.repeats):
            order = rotated(variants, repeat, cfg.repeats)
            info["orders"].append({"slots": slots, "repeat": repeat, "order": [v.label for v in order]})
            for position, v in enumerate(order, 1):
                keys = {"slots": slots, "repeat": repeat, "position": position, "variant": v.label,
                        "method": v.method, "budget": v.budget, "k0": v.k0, "packing": scheduler.packing,
                        "chunked": scheduler.chunked, "min_prompt_tokens": scheduler.min_prompt_tokens,
                        "max_wait_steps": scheduler.max_wait_steps}
                probing = repeat == 0 and scheduler.packing == "packed"
                done = _all_done(cfg, keys, earlier) and (not probing or earlier.probe(slots, v.label) is not None)
                plans.append((v, keys, probing, done))
        if not all(done for *_, done in plans):
            if not info["warmup_s"]:  # calibration and predictor fits, before anything is timed
                for v in variants:
                    budget = make_budget(v, False)
                    if budget is not None:
                        budget.remove()
            info["warmup_s"][slots] = warm_prefill(model, make_budget, variants[0], slots, length, tp, scheduler,
                                                   requests)
        for v, keys, probing, done in plans:
            if done:  # every stream and the probe from the earlier attempt: no engine to build
                _replay(cfg, keys, earlier, rows, requests, seed + slots, scheduler, slo, attempt)
                if probing:
                    rows.probes.append(earlier.probe(slots, v.label))
                info["resumed_streams"] += len(_stream_plan(cfg, keys)) + cfg.search_steps
                rows.emit()
                continue
            with _Engine(model, make_budget, v, slots, length, tp, scheduler) as engine:
                _warm_engine(engine, scheduler, requests)
                first = _replay(cfg, keys, earlier, rows, requests, seed + slots, scheduler, slo, attempt, engine)
                info["resumed_streams"] += sum(earlier.stream(k) is not None for k in _stream_plan(cfg, keys))
                probe = earlier.probe(slots, v.label) if probing else None
                if probing and probe is None:
                    probe = probe_forwards(engine, [r.ids for r in requests],
                                           prompt_tokens=_probe_context(engine, first or {}, requests))
                    probe = {"slots": slots, "variant": v.label, "budget": v.budget,
                             "stream_context_median": (first or {}).get("context_median"), **probe}
                    fresh = True
                else:
                    fresh = False
            if probing and fresh:  # the static engine's step at the same rows and context, its engine released first
                probe["static_step_ms"] = static_step_ms(model, make_budget, v, slots, probe["prompt_tokens"], tp)
                say(f"[serve] {slots} slots, {v.label} budget={v.budget}: every slot decoding from "
                    f"{probe['prompt_tokens']} tokens of context, {probe['full_step_ms']:.2f} ms per replayed "
                    f"step (the static engine's {probe['static_step_ms']:.2f} ms), "
                    f"{probe['kernels_per_layer']:.1f} kernels per layer; a packed prefill of "
                    f"{probe['prefill_tokens']} prompt tokens {probe['prefill_ms']:.1f} ms "
                    f"({probe['prefill_tokens_per_s']:.0f} tokens/s)")
            if probing:
                rows.probes.append(probe)
                rows.emit()
    rows.bar.close()
    return rows.requests, rows.streams, info


def _replay(cfg: ServeConfig, keys: dict[str, Any], earlier: Earlier, rows: _Rows, requests: list[Request], seed: int,
            scheduler: SchedulerConfig, slo: Slo, attempt: int, engine: ContinuousEngine | None = None) -> dict | None:
    """A variant's streams in order: each served through `engine`, or taken from `earlier`
    (engine None: all of them are there); returns its first stream's row."""
    stream_at = functools.partial(_serve_stream, engine, requests, seed, scheduler, slo, rows, earlier, attempt)
    first = None
    for stream_keys in _stream_plan(cfg, keys):
        row = stream_at(stream_keys)
        first = first or row
    if cfg.search_steps:
        bisect_rates(*cfg.search_range, cfg.search_steps,
                     lambda rate, step: stream_at({**keys, "rate": rate, "arrivals": "search", "search_step": step,
                                                   "search_attainment": cfg.search_attainment})["good_fraction"]
                     >= cfg.search_attainment)
    return first
