"""A trace of a budgeted model's selecting forwards, and their selection recomputed offline.

    trace = Trace()
    with trace.on(budget):                      # every selecting forward's layers, as the model ran them
        serve(engine, requests, ...)            # eager (a CPU): a CUDA graph replay calls no Python
    mismatches = replay(trace, selector, budget=8)   # [] when the online selection is the offline one

Why (issue 41): a rule that keeps more of the true removal cost offline can still lose online. The
first question is whether the online path selects what the rule says on the states it met; the
replay answers it by rebuilding each traced layer's routed batch and selecting again through the
reference (base/method/routing.py select_top_m via the selector), away from the engine. The same
records feed the per-token analysis (experiments/heldout/trace.py): what each token lost, in
router weight and in true cost, under the rule that ran and under another rule on the same states.

Shapes: T rows of a forward, H hidden, E experts, K top-k.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor

from base.method.policy import Decision, Policy
from base.method.routing import RoutedBatch


@dataclass
class Record:
    """One layer of one selecting forward, on the CPU."""

    forward: int  # the selecting forward's number within the trace
    layer: int
    z_TH: Tensor
    probs_TE: Tensor
    topk_idx_TK: Tensor
    topk_w_TK: Tensor
    active_T: Tensor
    keep_E: Tensor  # what the online selection kept
    idx_TK: Tensor | None  # the online routing after selection (None: the router's own)

    def batch(self) -> RoutedBatch:
        return RoutedBatch(self.z_TH, self.probs_TE, self.topk_idx_TK, self.topk_w_TK, self.active_T, self.layer)


@dataclass
class Trace:
    records: list[Record] = field(default_factory=list)
    _forward: int = -1
    _last_layer: int | None = None

    def observe(self, layer: int, batch: RoutedBatch, decision: Decision | None) -> None:
        if self._last_layer is None or layer <= self._last_layer:  # layer 0 opens the next forward
            self._forward += 1
        self._last_layer = layer
        cpu = lambda t: None if t is None else t.detach().to("cpu").clone()
        self.records.append(Record(self._forward, layer, cpu(batch.z_TH).float(), cpu(batch.probs_TE).float(),
                                   cpu(batch.topk_idx_TK), cpu(batch.topk_w_TK).float(), cpu(batch.active_T),
                                   cpu(decision.keep_E), cpu(decision.topk_idx_TK)))

    @contextmanager
    def on(self, budget) -> Iterator[Trace]:
        """Trace the budget's selecting forwards for the with-block (base/hf/budget.py MoeBudget.observe)."""
        before, budget.observe = budget.observe, self.observe
        try:
            yield self
        finally:
            budget.observe = before


def replay(trace: Trace, policy: Policy) -> list[str]:
    """Each traced layer selected again offline by `policy` (the reference path); one line per
    record whose kept set differs from the online one, [] when every one agrees."""
    from base.method.backends import TorchSelection

    out, by_layer = [], {}
    for r in trace.records:
        selection = by_layer.setdefault(r.layer, TorchSelection(policy, r.layer, torch.device("cpu")))
        offline = selection.select(r.batch())
        if not torch.equal(offline.keep_E.cpu(), r.keep_E):
            online = r.keep_E.nonzero().flatten().tolist()
            again = offline.keep_E.cpu().nonzero().flatten().tolist()
            out.append(f"forward {r.forward} layer {r.layer}: online kept {online}, offline {again}")
    return out
