"""Who decodes when: requests through the continuous-batching engine, one admission round at a time.

    done = serve(engine, [Request(ids, max_new=24, done=stop), ...], pad_id=0)
    done[i].tokens, done[i].ttft_s, done[i].round

A request waits until it has arrived (`arrival_s` after the start; 0: all at once) and a slot is
free. Between decode steps the scheduler ends the requests whose stop check or token limit says
so, frees their slots, and admits waiting requests into the free slots (FIFO, in the given order;
base/runtime/admission.py has the policies), all of one round in one prefill
(base/runtime/continuous.py). The host reads every slot's new token after each step, as a server
streams them, so each step syncs once.

Shapes: B slots, n arrivals of a round, P their longest prompt.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from base.runtime.continuous import ContinuousEngine


@dataclass
class Request:
    ids: list[int]  # prompt tokens
    max_new: int  # new-token limit (the prefill's token is the first)
    done: Callable[[list[int]], bool] | None = None  # host stop check on the new tokens so far
    arrival_s: float = 0.0  # when it arrives, seconds after the start


@dataclass
class Finished:
    tokens: list[int]  # new tokens, the last one the one that ended it
    round: int  # the admission round that admitted it (requests of one round share a prefill)
    slot: int  # the engine row it decoded in
    arrival_s: float
    admitted_s: float  # when its prefill started
    first_token_s: float  # when its first token was on the host
    finished_s: float
    decode_steps: int = 0  # steps it was decoded in (new tokens after the prefill's)
    token_s: list[float] = field(default_factory=list)  # when each new token was on the host (the
    # first is first_token_s): inter-token latencies for a serving benchmark (base/runtime/serving.py)

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
    steps: int = 0  # decode steps
    rounds: int = 0  # admission rounds (prefill forwards)
    occupied: list[int] = field(default_factory=list)  # requests decoding in each step
    step_s: list[float] = field(default_factory=list)  # host time of each decode step (sync included)
    eager: list[bool] = field(default_factory=list)  # each step ran eagerly (GPU: the capture's warm-up; CPU: all)
    prefill_s: float = 0.0  # host time of the admission rounds' prefills

    def summary(self) -> dict[str, float | int | None]:
        """Mean occupancy, and the steady decode rate: steps per second over the replayed steps
        (compile and capture left out; on a CPU, where every step is eager, over all steps)."""
        steady = [s for s, e in zip(self.step_s, self.eager) if not e] or self.step_s
        return {"rounds": self.rounds, "steps": self.steps,
                "occupancy_mean": sum(self.occupied) / len(self.occupied) if self.occupied else None,
                "steady_decode_steps_per_s": len(steady) / sum(steady) if steady and sum(steady) > 0 else None,
                "prefill_s": self.prefill_s, "eager_steps": sum(self.eager)}


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """(ids_nP, mask_nP): the prompts right-aligned, as the engines take them."""
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), P, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, P - len(p):] = 1
    return ids, mask


def _sync(engine: ContinuousEngine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def serve(engine: ContinuousEngine, requests: list[Request], pad_id: int, pick=None,
          stop_at_eos: bool = True) -> tuple[list[Finished], ServeStats]:
    """Decode every request to its end; results in the requests' order. `pick(waiting, free,
    running)` chooses whom to admit (indices into `requests`, at most `free`; base/runtime/admission.py);
    default FIFO."""
    pick = pick or (lambda waiting, free, running: waiting[:free])
    engine.reset()
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)  # stable: ties keep their order
    waiting: list[int] = []
    slot_of: dict[int, int] = {}  # slot -> request
    free = list(range(engine.B))
    tokens: dict[int, list[int]] = {}
    out: dict[int, Finished] = {}
    stats = ServeStats()
    t0 = time.perf_counter()
    clock = lambda: time.perf_counter() - t0

    eos = set(engine.eos_D.tolist()) - {-1} if stop_at_eos else set()  # the engine ends these rows itself

    def ended(i: int) -> bool:
        r = requests[i]
        return (len(tokens[i]) >= r.max_new or tokens[i][-1] in eos
                or (r.done is not None and r.done(tokens[i])))

    def finish(slot: int) -> None:
        i = slot_of.pop(slot)
        out[i].finished_s = clock()
        out[i].tokens = tokens[i]
        engine.end(slot)
        free.append(slot)
        free.sort()

    while order or waiting or slot_of:
        now = clock()
        while order and requests[order[0]].arrival_s <= now:
            waiting.append(order.pop(0))
        if free and waiting:
            chosen = pick(list(waiting), len(free), sorted(slot_of.values()))
            for i in chosen:
                waiting.remove(i)
            slots = free[:len(chosen)]
            del free[:len(chosen)]
            ids, mask = left_pad([requests[i].ids for i in chosen], pad_id)
            admitted = clock()
            first = engine.admit(slots, ids, mask, stop_at_eos=stop_at_eos).tolist()  # syncs
            seen = clock()  # the round's first tokens are on the host together
            stats.prefill_s += seen - admitted
            for slot, i, tok in zip(slots, chosen, first):
                slot_of[slot], tokens[i] = i, [tok]
                out[i] = Finished([], stats.rounds, slot, requests[i].arrival_s, admitted, seen, 0.0, token_s=[seen])
                if ended(i):
                    finish(slot)
            stats.rounds += 1
        if not slot_of:
            if order:  # idle until the next arrival
                time.sleep(max(0.0, requests[order[0]].arrival_s - clock()))
            continue
        occupied = sorted(slot_of)
        t = time.perf_counter()
        _, eager = engine.decode(1)
        new = engine.tok_B1[:, 0].tolist()  # syncs
        seen = time.perf_counter()
        stats.step_s.append(seen - t)
        stats.eager.append(eager > 0)
        stats.steps += 1
        stats.occupied.append(len(occupied))
        for slot in occupied:
            i = slot_of[slot]
            tokens[i].append(new[slot])
            out[i].token_s.append(seen - t0)
            out[i].decode_steps += 1
            if ended(i):
                finish(slot)
    _sync(engine)
    return [out[i] for i in range(len(requests))], stats
