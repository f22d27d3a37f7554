"""Request-stream throughput: requests through continuous batching as a server receives them.

    rows = measure_stream(model, make_budget, variants, throughput_cfg, stream_cfg, seed)

`throughput.mode=stream`. For each slot count (`throughput.batch_sizes`) one stream of
slots x `stream.requests_per_slot` requests, random prompt tokens, prompt and output lengths drawn
uniformly from `stream.prompt_len` and `stream.output_len`, or from a task's own requests
(`stream.lengths_from`: an evaluate run's samples.jsonl) (EOS ignored), arriving all at once or
at a Poisson `stream.rate`; every (method, budget) variant serves the same stream
(base/runtime/scheduler.py; admission by `scheduler.admission`, base/runtime/admission.py). Per variant:

  warm-up    ContinuousEngine.warm_up: compiles the regions and captures the decode step and the
             packed prefill (and mixed step, `scheduler.chunked`) of every token bucket, so the
             stream captures nothing (`captures` counts the graphs captured during it: 0)
  timed      the stream with statistics off: output tokens/s (all new tokens over the time from the
             first arrival to the last token), time per output token and time to first token
             (p50, p90 over requests), mean occupancy, the steady decode step (replays only), the
             prefill forwards' time and prompt tokens/s against the compute floor (`prefill_floor_s`:
             2 x active parameters x prompt tokens at the GPU's dense bf16 peak), mixed steps
             and their share of the steps that decode (`scheduler.*`: base/runtime/scheduler.py)
  statistics a stream of slots x `stream.stats_requests_per_slot` requests with statistics on:
             mean union before selection and kept experts per layer, in decode-only steps (where
             the budget binds) and in mixed steps (`_mixed`)

On a CPU the same code runs eagerly: a check of the bookkeeping, not a speed figure.

Resuming: `emit(rows)` gets the rows after every variant; a stopped run's rows (`earlier`) are
taken as they were for the (slots, variant) they cover, and only the others are served (each row
names the attempt that served it).
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from base.config import SchedulerConfig, StreamConfig, ThroughputConfig, cache_length
from base.hf.budget import MoeBudget
from base.progress import progress, say
from base.runtime.admission import UnionAdmission, fifo, prompt_experts
from base.runtime.continuous import ContinuousEngine
from base.runtime.scheduler import Finished, Request, ServeStats, forwards_bound, serve
from base.runtime.throughput import Variant


def _quantile(xs: list[float], q: float) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else None


# Dense bf16 tensor-core peaks (FLOP/s) by device name, for the prefill's compute floor
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


def active_parameters(model: nn.Module) -> int:
    """Weights a prompt token is multiplied with: the decoder's, top-k of E routed experts counted;
    the embedding (a lookup) and the LM head (prefill computes the last token's logits only) left out."""
    from base.hf.families import find_moe_layers

    layers = find_moe_layers(model)
    skip = {id(p) for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
            for p in m.parameters()}
    total = sum(p.numel() for p in model.parameters() if id(p) not in skip)
    experts = sum(p.numel() for layer in layers for p in layer.experts.parameters())
    return total - experts + experts * layers[0].top_k // layers[0].num_experts


def prefill_floor_s(active_params: int, prompt_tokens: int, device: torch.device) -> float | None:
    """Seconds the prompt tokens need at the GPU's dense bf16 peak (2 FLOP per parameter and
    token; attention left out); None off a GPU or for an unknown one."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    peak = next((f for key, f in PEAK_BF16_FLOPS.items() if key in name), None)
    return 2 * active_params * prompt_tokens / peak if peak else None


def make_stream(n: int, vocab: int, cfg: StreamConfig, seed: int,
                lengths: list[tuple[int, int]] | None = None) -> list[Request]:
    """n requests: random prompt tokens, uniform lengths (or pairs drawn from `lengths`, a task's
    own), Poisson arrivals (or all at time 0)."""
    g = torch.Generator().manual_seed(seed)
    if lengths:
        pick = torch.randint(0, len(lengths), (n,), generator=g).tolist()
        plen, olen = [lengths[i][0] for i in pick], [lengths[i][1] for i in pick]
    else:
        lo, hi = cfg.prompt_len
        plen = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
        olen = torch.randint(cfg.output_len[0], cfg.output_len[1] + 1, (n,), generator=g).tolist()
    gaps = torch.empty(n).exponential_(generator=g) / cfg.rate if cfg.rate else torch.zeros(n)
    arrival = gaps.cumsum(0).tolist() if cfg.rate else [0.0] * n
    return [Request(torch.randint(3, vocab, (p,), generator=g).tolist(), o, None, a)
            for p, o, a in zip(plen, olen, arrival)]


def _pick(scheduler: SchedulerConfig, model: nn.Module, budget: MoeBudget | None, requests: list[Request]):
    if scheduler.admission == "fifo":
        return fifo
    if budget is None:
        raise ValueError("scheduler.admission=union predicts experts through the owned MoE blocks: it needs a budget")
    per_layer = 2 * budget.layers[0].top_k
    predicted = [prompt_experts(model, budget, r.ids, per_layer) for r in requests]
    return UnionAdmission(lambda i: predicted[i], scheduler.max_wait_rounds)


def _serve(model: nn.Module, budget: MoeBudget | None, v: Variant, slots: int, length: int, tp: ThroughputConfig,
           cfg: StreamConfig, requests: list[Request],
           scheduler: SchedulerConfig) -> tuple[list[Finished], ServeStats, float]:
    """The stream of variant v (its budget given) through a fresh engine after its warm-up;
    (finished, stats, s to predict experts)."""
    engine = ContinuousEngine(model, slots, length, budget=budget, compile=None if tp.compile else False,
                              buckets=scheduler.buckets)
    try:
        if scheduler.packing == "packed":
            engine.warm_up(mixed=scheduler.chunked, reserve=forwards_bound(requests, scheduler.buckets))
        else:  # padded prefill is eager: one round captures the decode step
            serve(engine, [Request(r.ids, 3) for r in requests[:slots]], pad_id=0, stop_at_eos=False,
                  policy=scheduler)
        t0 = time.perf_counter()
        pick = _pick(scheduler, model, budget, requests)
        predict_s = time.perf_counter() - t0
        done, stats = serve(engine, requests, pad_id=0, pick=pick, stop_at_eos=False, policy=scheduler)
    finally:
        engine.release()
    return done, stats, predict_s


def measure_stream(model: nn.Module, make_budget: Callable[[Variant, bool], MoeBudget | None],
                   variants: list[Variant], tp: ThroughputConfig, cfg: StreamConfig, seed: int,
                   lengths: list[tuple[int, int]] | None = None,
                   scheduler: SchedulerConfig | None = None, earlier: list[dict] | None = None,
                   emit: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """One row per (slots, variant); see the module doc for the columns. `lengths`: a task's own
    (prompt, output) token lengths to draw from (stream.lengths_from); `earlier`, `emit`: resuming
    (the module doc)."""
    scheduler = scheduler or SchedulerConfig()
    earlier = earlier or []
    attempt = 1 + max((int(r.get("attempt") or 0) for r in earlier), default=-1)
    active_params = active_parameters(model)
    vocab = model.config.vocab_size
    length = cache_length(cfg.longest(lengths))
    rows = []
    bar = progress(total=len(tp.batch_sizes) * len(variants), desc="stream", unit="variant")
    for slots in tp.batch_sizes:
        stream = make_stream(slots * cfg.requests_per_slot, vocab, cfg, seed + slots, lengths)
        short = make_stream(slots * cfg.stats_requests_per_slot, vocab, cfg, seed + slots + 1, lengths)
        for v in variants:
            before = next((r for r in earlier if r.get("slots") == slots and r.get("variant") == v.label
                           and r.get("budget") == v.budget), None)
            if before is not None:  # served by a stopped attempt of this run
                rows.append({k: val for k, val in before.items() if k != "speedup_vs_dense"})
                bar.update()
                continue
            budget = make_budget(v, False)
            try:
                done, stats, predict_s = _serve(model, budget, v, slots, length, tp, cfg, stream, scheduler)
            finally:
                if budget is not None:
                    budget.remove()
            span = max(d.finished_s for d in done) - min(d.arrival_s for d in done)
            tokens = sum(len(d.tokens) for d in done)
            steady = stats.summary()
            floor_s = prefill_floor_s(active_params, stats.prompt_tokens, next(model.parameters()).device)
            row = {
                "slots": slots, "method": v.method, "budget": v.budget, "k0": v.k0, "variant": v.label,
                "admission": scheduler.admission, "rate": cfg.rate, "requests": len(done), "output_tokens": tokens,
                "seconds": span, "tokens_per_s": tokens / span,
                "tpot_ms_p50": 1e3 * _quantile([d.tpot_s for d in done], 0.5),
                "tpot_ms_p90": 1e3 * _quantile([d.tpot_s for d in done], 0.9),
                "ttft_ms_p50": 1e3 * _quantile([d.ttft_s for d in done], 0.5),
                "ttft_ms_p90": 1e3 * _quantile([d.ttft_s for d in done], 0.9),
                "occupancy_mean": steady["occupancy_mean"], "rounds": stats.rounds, "steps": stats.steps,
                "step_ms_median": steady["step_ms_median"],
                "prefill_s": stats.prefill_s, "predict_s": predict_s,
                "prompt_tokens": stats.prompt_tokens, "prefill_tokens_per_s": steady["prefill_tokens_per_s"],
                "prefill_floor_s": floor_s, "prefill_over_floor": stats.prefill_s / floor_s if floor_s else None,
                "prefills": stats.prefills, "mixed_steps": stats.mixed_steps, "mixed_share": steady["mixed_share"],
                "mixed_s": steady["mixed_s"], "mixed_prompt_tokens": stats.mixed_prompt_tokens,
                "captures": stats.captures, "packing": scheduler.packing, "chunked": scheduler.chunked,
                "attempt": attempt,
            }
            budget = make_budget(v, True)
            try:
                _, _, _ = _serve(model, budget, v, slots, length, tp, cfg, short, scheduler)
                recorded = budget.stats_rows() if budget is not None else []
            finally:
                if budget is not None:
                    budget.remove()
            for suffix, kind in (("", "decode"), ("_mixed", "mixed")):
                kept = [r for r in recorded if r["kind"] == kind]
                n = max(1, len(kept))
                row[f"union_mean{suffix}"] = sum(r["union"] for r in kept) / n if kept else None
                row[f"kept_mean{suffix}"] = sum(r["kept"] for r in kept) / n if kept else None
            rows.append(row)
            if emit is not None:
                emit(rows)
            bar.update()
            say(f"[stream] {slots} slots {v.label} budget={v.budget}: {row['tokens_per_s']:.0f} tok/s, "
                f"TPOT p50 {row['tpot_ms_p50']:.2f} ms, TTFT p50 {row['ttft_ms_p50']:.0f} ms, "
                f"occupancy {row['occupancy_mean']:.1f}")
    bar.close()
    dense = {r["slots"]: r["tokens_per_s"] for r in rows if r["variant"] == "dense"}
    for r in rows:
        r["speedup_vs_dense"] = r["tokens_per_s"] / dense[r["slots"]] if r["slots"] in dense else None
    return rows
