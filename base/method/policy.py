"""What a budgeted step keeps and how tokens are rerouted (Policy), and what one layer decided
(Decision). Backends (base/method/backends.py) turn a policy into decisions.

Shapes: T tokens, E experts, K top-k.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from base.method.routing import RoutedBatch, pair_counts_E
from base.method.selectors import Selector


@dataclass
class Policy:
    """The method of a run, resolved for one model; `selector=None` is dense."""

    selector: Selector | None
    budget: int | None
    reassign: str = "backfill"
    renormalize: bool = True  # resolved for the model (method.renormalize=model|always|never)
    layer_budgets: dict[int, int] | None = None  # per-layer budgets (base/method/budget_split.py), else `budget`

    def budget_of(self, layer: int) -> int | None:
        return self.layer_budgets.get(layer, self.budget) if self.layer_budgets else self.budget


@dataclass
class Decision:
    """One layer's selection in one step."""

    keep_E: Tensor  # bool kept set
    topk_idx_TK: Tensor | None  # rerouted experts; None = the router's own
    topk_w_TK: Tensor | None
    keep_M: Tensor | None = None  # kept ids by rank, -1 padded (the kernels' work list); None: not computed


def dense_decision(batch: RoutedBatch) -> Decision:
    """Keep the whole union and the router's own routing (what dense runs record)."""
    return Decision(pair_counts_E(batch.topk_idx_TK, batch.active_T, batch.num_experts) > 0, None, None)
