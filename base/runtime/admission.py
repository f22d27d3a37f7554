"""Who joins the batch when several requests wait: FIFO, or the one whose experts the batch already runs.

    pick = UnionAdmission(lambda i: predicted_LE[i], max_wait_rounds=4)
    done, stats = serve(engine, requests, pad_id, pick=pick)      # base/runtime/scheduler.py

Union-aware admission (beyond the paper): a request's experts are predicted from its prompt's
routing (the ELDR paper reports that prefill experts predict decode experts, correlation 0.70-0.92
on Qwen3-30B-A3B): per MoE layer, the experts that receive most of the prompt's routing weight
(`prompt_experts`, one dense forward of the prompt, observed through the owned MoE blocks).
Each free slot goes to the waiting request whose predicted experts overlap most with the union of
the running requests' (and those already chosen this round), the share of its experts the batch
already reads; ties keep the waiting order. A request passed over `max_wait_rounds` admission
rounds goes next, oldest first, so none starves.

Shapes: L MoE layers, E experts, T prompt tokens, K top-k.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from base.hf.budget import MoeBudget
from base.hf.moe_block import StepInputs
from base.method.routing import RoutedBatch, aggregate_E


def fifo(waiting: list[int], free: int, running: list[int]) -> list[int]:
    """The first `free` waiting requests, in their order."""
    return waiting[:free]


@torch.no_grad()
def prompt_experts(model: nn.Module, budget: MoeBudget, ids: list[int], per_layer: int) -> Tensor:
    """bool (L, E): per layer, the `per_layer` experts with the most routing weight over the prompt's
    tokens, from one dense forward of the prompt (no cache; the model's own routing, nothing recorded)."""
    device = next(model.parameters()).device
    layers = len(budget.layers)
    E = budget.layers[0].num_experts
    weight_LE = torch.zeros(layers, E, device=device)

    def observe(layer: int, batch: RoutedBatch, decision=None) -> None:
        weight_LE[layer] = aggregate_E(batch.topk_w_TK, batch.topk_idx_TK, batch.active_T, E).to(device)

    ids_1T = torch.tensor([ids], dtype=torch.long, device=device)
    active_T = torch.ones(ids_1T.shape[1], dtype=torch.bool, device=device)
    with budget.bound(StepInputs(active_T, select=False, recorder=None, decode=False, observe=observe)):
        model(input_ids=ids_1T, use_cache=False)
    top_LK = weight_LE.topk(min(per_layer, E), dim=-1).indices
    return torch.zeros(layers, E, dtype=torch.bool, device=device).scatter_(1, top_LK, True).cpu()


class UnionAdmission:
    """The scheduler's `pick`: free slots to the waiting requests that overlap the batch most."""

    def __init__(self, predicted: Callable[[int], Tensor], max_wait_rounds: int = 4) -> None:
        self.predicted, self.max_wait = predicted, max_wait_rounds
        self.passed: dict[int, int] = {}  # request -> admission rounds it waited through

    def __call__(self, waiting: list[int], free: int, running: list[int]) -> list[int]:
        overdue = sorted((i for i in waiting if self.passed.get(i, 0) >= self.max_wait), key=waiting.index)
        chosen = overdue[:free]
        union_LE = torch.zeros_like(self.predicted(waiting[0]))
        for i in [*running, *chosen]:
            union_LE |= self.predicted(i)
        rest = [i for i in waiting if i not in chosen]
        while len(chosen) < free and rest:
            overlap = [float((self.predicted(i) & union_LE).sum()) / max(1, int(self.predicted(i).sum())) for i in rest]
            best = rest[max(range(len(rest)), key=lambda j: (overlap[j], -j))]  # ties: the earlier request
            chosen.append(best)
            rest.remove(best)
            union_LE |= self.predicted(best)
        for i in rest:
            self.passed[i] = self.passed.get(i, 0) + 1
        return chosen
