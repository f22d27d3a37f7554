"""Who decodes when: requests through the continuous-batching engine, one forward at a time.

    done, stats = serve(engine, [Request(ids, max_new=24, done=stop), ...], pad_id=0, policy=SchedulerConfig())
    done[i].tokens, done[i].ttft_s, done[i].round
    stats.summary()          # rounds, decode and mixed steps, mixed share, occupancy, prefill time

A request waits until it has arrived (`arrival_s` after the start; 0: all at once) and a slot is
free. Each turn the scheduler launches one forward of the engine (base/runtime/continuous.py):

- decode first: while requests decode, waiting requests are admitted only when the policy says
  so (`SchedulerConfig`: the round that would be admitted now, the first waiting requests that the
  free slots take in arrival order, holds `min_prompt_tokens` prompt tokens; or a free slot and a waiting request
  have both waited `max_wait_steps` steps; or no slot is decoding). Both count what a round can
  take, not the whole queue: in a burst the queue always holds enough tokens and its oldest
  request has waited since the start, so a threshold on the queue would admit every freed slot
  at once, one small round each. The requests admitted together are one admission round (FIFO in the
  given order, or base/runtime/admission.py's policies).
- prefill: `packing=packed` prefills a round's prompts as packed streams (each at most the largest
  bucket; a longer prompt continues in the next stream) and, with `chunked`, as chunks of at most
  `chunk_tokens` riding in mixed steps beside the decoding rows; `packing=padded` as one left-padded
  eager forward (the engine before issue 26).
- decode steps otherwise.

The host stays off the critical path: a request's token limit is known when a step is launched,
so its slot is freed (and refilled) without waiting for its tokens; the engine ends rows at their
limit, EOS or stop strings on the device (`Request.stops`, a mask of the engine's StopTable), in
the step that made the last token. The host reads forward i's tokens (an asynchronous copy) after
launching forward i+1, so a slot that EOS or a stop string freed in forward i is refilled in
forward i+2. That schedule is the same with `overlap` off, where the host also waits for each
forward to finish before launching the next (a sync per step, for timing the host's share): which
requests share a step, and so every selection, never depends on host timing. A stop that only the
host's own check (`Request.done`) sees ends its request one forward late: that row takes part in
forward i+1 (its selection and statistics), its token is dropped, and the stream counts it
(`ServeStats.late_rows`; 0 when every stop string is on the device).

Shapes: B slots.
"""
from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from base.config import SchedulerConfig
from base.runtime.continuous import HostTokens
from base.runtime.packing import Chunk


@dataclass
class Request:
    ids: list[int]  # prompt tokens
    max_new: int  # new-token limit (the prefill's token is the first)
    done: Callable[[list[int]], bool] | None = None  # host stop check on the new tokens so far
    arrival_s: float = 0.0  # when it arrives, seconds after the start
    stops: int = 0  # its stop strings on the device: a mask of the engine's StopTable (base/runtime/stops.py)


@dataclass
class Finished:
    tokens: list[int]  # new tokens, the last one the one that ended it
    round: int  # the admission round that admitted it
    slot: int  # the engine row it decoded in
    arrival_s: float
    admitted_s: float  # when its prefill started
    first_token_s: float  # when its first token was on the host
    finished_s: float
    decode_steps: int = 0  # steps it was decoded in (new tokens after the prefill's)
    token_s: list[float] = field(default_factory=list)  # when each new token was on the host (the
    # first is first_token_s): inter-token latencies for a serving benchmark

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Seconds per output token after the first."""
        n = len(self.tokens) - 1
        return (self.finished_s - self.first_token_s) / n if n > 0 else None


@dataclass
class ServeStats:
    """What a stream did. Times are device time between CUDA events around each forward on a GPU
    (nothing synced per step), host time on a CPU."""

    steps: int = 0  # decode-only steps
    mixed_steps: int = 0  # steps that carried prompt chunks beside the decoding rows
    prefills: int = 0  # prefill forwards (nothing decodes in them)
    rounds: int = 0  # admission rounds
    occupied: list[int] = field(default_factory=list)  # requests decoding in each decode-only step
    mixed_occupied: list[int] = field(default_factory=list)  # ... in each mixed step
    step_s: list[float] = field(default_factory=list)  # each decode-only step
    eager: list[bool] = field(default_factory=list)  # each decode-only step ran eagerly (capture; CPU: all)
    mixed_s: list[float] = field(default_factory=list)  # each mixed step
    prefill_s: float = 0.0  # the prefill forwards
    prompt_tokens: int = 0  # prompt tokens in prefill forwards
    mixed_prompt_tokens: int = 0  # prompt tokens in mixed steps
    gap_s: list[float] = field(default_factory=list)  # each decode-only step: device time from the end of
    # the forward before it to its start (the GPU idle, waiting for the host), 0 for the first forward
    launch_s: list[float] = field(default_factory=list)  # each decode-only step: host time to launch it
    context: list[int] = field(default_factory=list)  # each decode-only step: the cache slots its longest
    # decoding row reads (prompt and tokens so far; decode attention reads every row that far)
    captures: int = 0  # CUDA graphs captured during the stream (0 after a warm-up that covered every shape)
    late_rows: int = 0  # rows that decoded a step after their request had ended: a stop only the host saw
    # (read one forward late); each took part in that step's selection and statistics

    def summary(self) -> dict[str, float | int | None]:
        """Counts, the mixed share, mean occupancy (decode and mixed steps), the steady decode rate
        (steps per second over the replayed decode-only steps; on a CPU, over all) and the prefill
        rate (prompt tokens per second of prefill forwards)."""
        steady = [s for s, e in zip(self.step_s, self.eager) if not e] or self.step_s
        occupied = self.occupied + self.mixed_occupied
        decoding = self.steps + self.mixed_steps
        return {"rounds": self.rounds, "steps": self.steps, "mixed_steps": self.mixed_steps,
                "mixed_share": self.mixed_steps / decoding if decoding else None, "prefills": self.prefills,
                "occupancy_mean": sum(occupied) / len(occupied) if occupied else None,
                "steady_decode_steps_per_s": len(steady) / sum(steady) if steady and sum(steady) > 0 else None,
                "prefill_s": self.prefill_s, "prompt_tokens": self.prompt_tokens,
                "prefill_tokens_per_s": self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else None,
                "mixed_s": sum(self.mixed_s), "mixed_prompt_tokens": self.mixed_prompt_tokens,
                "eager_steps": sum(self.eager), "captures": self.captures, "late_rows": self.late_rows,
                "step_ms_median": _median(self.step_s, self.eager, 1e3),
                "gap_ms_median": _median(self.gap_s, self.eager, 1e3),
                "launch_ms_median": _median(self.launch_s, self.eager, 1e3),
                "context_median": _median(self.context, self.eager)}


def _median(values: list[float], eager: list[bool], scale: float = 1.0) -> float | None:
    """Over the replayed steps (on a CPU, where every step is eager: over all), times `scale`."""
    replayed = [v for v, e in zip(values, eager) if not e] or values
    return scale * statistics.median(replayed) if replayed else None


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """(ids_nP, mask_nP): the prompts right-aligned, as the engines take them."""
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), P, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, P - len(p):] = 1
    return ids, mask


def forwards_bound(requests: list[Request], buckets: tuple[int, ...] | list[int]) -> int:
    """At most this many forwards serve `requests` (statistics rows to reserve): a step gives each
    running request a token (one more for a late host stop), a prefill forward carries at least
    one chunk."""
    return sum(r.max_new + 2 + len(r.ids) // buckets[0] for r in requests) + 8


def prefill_due(policy: SchedulerConfig, decoding: bool, round_tokens: int, waited_steps: int) -> bool:
    """Decode first: admit waiting requests into free slots when nothing decodes, the round
    admitted now would prefill enough prompt tokens (`round_tokens`), or a free slot and a waiting
    request have both waited long enough (`waited_steps`, in decode or mixed steps)."""
    return (not decoding or round_tokens >= policy.min_prompt_tokens
            or waited_steps >= policy.max_wait_steps)


class _Clock:
    """Times each forward without syncing: CUDA events around it (read once at the end), or the
    host's clock on a CPU (where a forward is synchronous)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def around(self, launch: Callable[[], None]):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            launch()
            end.record()
            return start, end
        t = time.perf_counter()
        launch()
        return time.perf_counter() - t

    def seconds(self, span) -> float:
        if self.cuda:
            span[1].synchronize()
            return span[0].elapsed_time(span[1]) / 1e3
        return span

    def gap(self, before, span) -> float:
        """Device time from the end of `before` to the start of `span` (0 on a CPU, where the
        host's own gaps are the launch times)."""
        if self.cuda and before is not None:
            return max(0.0, before[1].elapsed_time(span[0]) / 1e3)
        return 0.0


@dataclass
class _Forward:
    kind: str  # prefill | decode | mixed
    emits: list[tuple[int, int, bool]]  # (slot, request, first token?) whose token it makes
    tokens: HostTokens | None
    span: object
    eager: bool
    prompt_tokens: int
    launch_s: float  # host time the launch took
    occupied: int = 0  # requests that took a token from it as a decode step (set when read)
    context: int = 0  # a decode step: the cache slots its longest decoding row reads


def serve(engine, requests: list[Request], pad_id: int, pick=None, stop_at_eos: bool = True,
          policy: SchedulerConfig | None = None,
          progress: Callable[[int], None] | None = None) -> tuple[list[Finished], ServeStats]:
    """Decode every request to its end; results in the requests' order. `pick(waiting, free,
    running)` chooses whom to admit (indices into `requests`, at most `free`;
    base/runtime/admission.py); default FIFO. `engine`: a ContinuousEngine. `progress(n)` is
    called as n more requests end (a progress bar's update; host work between forwards)."""
    policy = policy or SchedulerConfig()
    pick = pick or (lambda waiting, free, running: waiting[:free])
    for n, r in enumerate(requests):
        if not r.ids or len(r.ids) + r.max_new > engine.L or r.max_new < 1:
            raise ValueError(f"request {n}: {len(r.ids)} prompt + {r.max_new} new tokens must be 1.. and fit the "
                             f"engine's {engine.L} cache slots")
    packed, big = policy.packing == "packed", engine.buckets[-1]
    engine.reset(stop_at_eos, reserve=forwards_bound(requests, engine.buckets))
    captures0 = engine.graphs.captures
    order = deque(sorted(range(len(requests)), key=lambda i: requests[i].arrival_s))  # stable: ties keep their order
    waiting: list[int] = []
    due_since: int | None = None  # decoding steps launched when a free slot and a waiting request last met
    running: dict[int, int] = {}  # slot -> request decoding there, as launched
    prefilling: dict[int, list[int]] = {}  # slot -> [request, prompt tokens in so far] (admission order)
    free = list(range(engine.B))
    launched: dict[int, int] = {}  # request -> its tokens made by the forwards launched so far
    live: set[int] = set()  # admitted, last token not yet read
    tokens: dict[int, list[int]] = {}
    out: dict[int, Finished] = {}
    forwards: list[_Forward] = []
    inflight: deque[_Forward] = deque()
    stats = ServeStats()
    clock = _Clock(engine.device)
    t0 = time.perf_counter()
    now = lambda: time.perf_counter() - t0
    steps_launched = 0
    eos = set(engine.eos_D.tolist()) - {-1} if stop_at_eos else set()  # the engine ends these rows itself

    def ended(i: int, on_device: bool) -> bool:
        """Whether request i's tokens so far end it (`on_device`: its row ended in that forward)."""
        r = requests[i]
        return (on_device or len(tokens[i]) >= r.max_new or tokens[i][-1] in eos
                or (r.done is not None and r.done(tokens[i])))

    def free_slot(slot: int) -> None:
        free.append(slot)
        free.sort()

    def read(f: _Forward) -> None:
        """Hand a launched forward's tokens to their requests; end those whose stop says so."""
        new, ended_B = f.tokens.get()
        f.tokens = None  # its page-locked buffer goes back to the engine's ring
        t = now()
        after = forwards[-1] if forwards[-1] is not f else None  # launched after f (at most one)
        for slot, i, first in f.emits:
            if i not in live:  # ended before this forward's token (a late host stop): dropped
                continue
            tokens[i].append(new[slot])
            out[i].token_s.append(t)
            if first:
                out[i].first_token_s = t
            else:
                out[i].decode_steps += 1
                f.occupied += 1
            if ended(i, ended_B[slot]):
                live.discard(i)
                out[i].finished_s, out[i].tokens = t, tokens[i]
                if progress is not None:
                    progress(1)
                if running.get(slot) == i:  # ended by EOS or a stop, before its limit
                    del running[slot]
                    engine.end(slot)
                    free_slot(slot)
                    if after is not None and not ended_B[slot] and (slot, i, False) in after.emits:
                        stats.late_rows += 1  # a stop the device did not see: the row decoded in `after`

    def launch(kind: str, run: Callable[[], None], emits: list[tuple[int, int, bool]], prompt: int = 0,
               context: int = 0) -> None:
        eager0 = engine.graphs.eager
        t = time.perf_counter()
        span = clock.around(run)
        t = time.perf_counter() - t
        f = _Forward(kind, emits, engine.snapshot(), span, engine.graphs.eager > eager0 or kind == "padded",
                     prompt, t, context=context)
        forwards.append(f)
        inflight.append(f)
        if not policy.overlap and f.tokens.event is not None:
            f.tokens.event.synchronize()  # the forward is done before the host goes on (timing only)
        while len(inflight) > 1:  # the host acts one forward behind, overlap or not (see the module doc)
            read(inflight.popleft())

    def decoding_emits() -> list[tuple[int, int, bool]]:
        """The running requests as a step that decodes them is launched; one whose limit this step
        reaches gives its slot back now (the engine ends its row in the step)."""
        emits = []
        for slot, i in list(running.items()):
            emits.append((slot, i, False))
            launched[i] += 1
            if launched[i] >= requests[i].max_new:
                del running[slot]
                free_slot(slot)
        return emits

    def take_chunks(budget: int) -> tuple[list[Chunk], list[tuple[int, int, bool]], int]:
        """Prompt chunks of the prefilling requests, oldest first, up to `budget` tokens."""
        chunks, emits, used = [], [], 0
        for slot, state in list(prefilling.items()):
            if used >= budget:
                break
            i, start = state
            ids = requests[i].ids
            n = min(len(ids) - start, budget - used)
            final = start + n == len(ids)
            chunks.append(Chunk(slot, ids[start:start + n], start, final, requests[i].max_new, requests[i].stops))
            used += n
            if final:
                del prefilling[slot]
                emits.append((slot, i, True))
                launched[i] = 1
                if requests[i].max_new > 1:
                    running[slot] = i
                else:
                    free_slot(slot)
            else:
                state[1] = start + n
        return chunks, emits, used

    def admit() -> list[int]:
        chosen = pick(list(waiting), len(free), sorted(list(running.values()) + [s[0] for s in prefilling.values()]))
        t = now()
        for i in chosen:
            waiting.remove(i)
            slot = free.pop(0)
            prefilling[slot] = [i, 0]
            live.add(i)
            tokens[i] = []
            out[i] = Finished([], stats.rounds, slot, requests[i].arrival_s, t, 0.0, 0.0)
        stats.rounds += 1
        return chosen

    while order or waiting or running or prefilling or inflight:
        while order and requests[order[0]].arrival_s <= now():
            i = order.popleft()
            waiting.append(i)
        if not (free and waiting):
            due_since = None
        elif due_since is None:
            due_since = steps_launched
        if due_since is not None and prefill_due(policy, bool(running), sum(len(requests[i].ids) for i in
                                                                            waiting[:len(free)]),
                                                 steps_launched - due_since):
            admit()
            due_since = None
        if prefilling and packed:
            if policy.chunked and running:
                emits = decoding_emits()
                chunks, firsts, used = take_chunks(policy.chunk_tokens)
                launch("mixed", lambda c=chunks: engine.run_packed(c, mixed=True), emits + firsts, used)
                steps_launched += 1
            else:
                chunks, firsts, used = take_chunks(big)
                launch("prefill", lambda c=chunks: engine.run_packed(c, mixed=False), firsts, used)
        elif prefilling:  # padded: the whole round in one left-padded forward
            slots = list(prefilling)
            chosen = [prefilling[s][0] for s in slots]
            _, firsts, used = take_chunks(sum(len(requests[i].ids) for i in chosen))
            ids, mask = left_pad([requests[i].ids for i in chosen], pad_id)
            limits, masks = [requests[i].max_new for i in chosen], [requests[i].stops for i in chosen]
            launch("padded", lambda s=slots, a=ids, m=mask, n=limits, k=masks: engine.admit(s, a, m, stop_at_eos, n, k),
                   firsts, used)
        elif running:
            context = max(len(requests[i].ids) + launched[i] for i in running.values())
            emits = decoding_emits()
            launch("decode", engine.step, emits, context=context)
            steps_launched += 1
        elif inflight:
            read(inflight.popleft())
        elif order:  # idle until the next arrival
            time.sleep(max(0.0, requests[order[0]].arrival_s - now()))
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    before = None
    for f in forwards:
        s = clock.seconds(f.span)
        gap, before = clock.gap(before, f.span), f.span
        if f.kind == "decode":
            stats.steps += 1
            stats.occupied.append(f.occupied)
            stats.step_s.append(s)
            stats.eager.append(f.eager)
            stats.gap_s.append(gap)
            stats.launch_s.append(f.launch_s)
            stats.context.append(f.context)
        elif f.kind == "mixed":
            stats.mixed_steps += 1
            stats.mixed_occupied.append(f.occupied)
            stats.mixed_s.append(s)
            stats.mixed_prompt_tokens += f.prompt_tokens
        else:
            stats.prefills += 1
            stats.prefill_s += s
            stats.prompt_tokens += f.prompt_tokens
    stats.captures = engine.graphs.captures - captures0
    return [out[i] for i in range(len(requests))], stats
