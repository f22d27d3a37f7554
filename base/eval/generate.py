"""transformers' `generate` over a budgeted model (`eval.engine=off`, the CPU default).

    out = budgeted_generate(model, budget, ids_BP, mask_BP, ended, stops, max_new_tokens=N, pad_token_id=pad)

generate runs every forward itself, so this driver cannot wrap each one: it binds the prefill's
inputs before generate starts and, from a stopping criterion generate calls after every new
token, the next decode step's (base/hf/budget.py). A row is inactive in a decode step (neither
scores nor joins the union) when its stop strings or token limit ended it, or when the token it
is fed ends a sequence (generate feeds a finished row its EOS once, then the pad token).

Shapes: B rows, P prompt positions, N new tokens, D ids that end a row.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import StoppingCriteria, StoppingCriteriaList

from base.eval.stops import RowStops
from base.hf.budget import MoeBudget


def ended_token_ids(model: nn.Module, tokenizer) -> tuple[int, ...]:
    """The pad token and the model's EOS ids: a row fed one of these has ended."""
    eos = model.generation_config.eos_token_id or tokenizer.eos_token_id
    eos = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    return tuple(t for t in (tokenizer.pad_token_id, *eos) if t is not None)


def active_rows(ids_B: Tensor, ended_D: Tensor, done_B: Tensor) -> Tensor:
    """Rows that take part in a decode step fed ids_B: not done, not fed an ending token."""
    return ~done_B & ~torch.isin(ids_B, ended_D)


class _NextStep(StoppingCriteria):
    """After every new token: the rows' stops, then the next decode step's inputs for the blocks."""

    def __init__(self, budget: MoeBudget, stops: RowStops | None, ended_D: Tensor) -> None:
        self.budget, self.stops, self.ended_D = budget, stops, ended_D

    def __call__(self, input_ids: Tensor, scores: Tensor, **kwargs: Any) -> Tensor:
        if self.stops is not None:
            done_B = self.stops(input_ids, scores)
        else:
            done_B = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        self.budget.bind(self.budget.inputs(True, active_rows(input_ids[:, -1], self.ended_D, done_B)))
        return done_B


@torch.no_grad()
def budgeted_generate(model: nn.Module, budget: MoeBudget | None, input_ids: Tensor, attention_mask: Tensor,
                      ended: tuple[int, ...], stops: RowStops | None = None, **generate_kwargs: Any) -> Any:
    """`model.generate(...)` with the budget applied as described above; returns what generate
    returns. `stops` ends rows at their own stop strings and limits."""
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, **generate_kwargs)
    if budget is None:
        return model.generate(**kwargs, stopping_criteria=StoppingCriteriaList([stops] if stops else []))
    ended_D = torch.tensor(ended, dtype=torch.long, device=input_ids.device)
    with budget.bound(budget.inputs(False, attention_mask.reshape(-1).bool())):
        return model.generate(**kwargs, stopping_criteria=StoppingCriteriaList([_NextStep(budget, stops, ended_D)]))
