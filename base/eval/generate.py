"""transformers' `generate` over a budgeted model (`eval.engine=off`, the CPU default).

    new_BN = budgeted_generate(model, budget, ids_BP, mask_BP, max_new, stops, ended_D, pad_id)

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

    def __init__(self, budget: MoeBudget, stops: RowStops, ended_D: Tensor) -> None:
        self.budget, self.stops, self.ended_D = budget, stops, ended_D

    def __call__(self, input_ids: Tensor, scores: Tensor, **kwargs: Any) -> Tensor:
        done_B = self.stops(input_ids, scores)
        self.budget.bind(self.budget.inputs(True, active_rows(input_ids[:, -1], self.ended_D, done_B)))
        return done_B


@torch.no_grad()
def budgeted_generate(model: nn.Module, budget: MoeBudget | None, ids_BP: Tensor, mask_BP: Tensor, max_new: int,
                      stops: RowStops, ended: tuple[int, ...], pad_id: int, **sampling: Any) -> Tensor:
    """The new tokens (B, N) of `generate` with the budget applied as described above."""
    kwargs = dict(input_ids=ids_BP, attention_mask=mask_BP, max_new_tokens=max_new, pad_token_id=pad_id,
                  use_cache=True, **sampling)
    if budget is None:
        out = model.generate(**kwargs, stopping_criteria=StoppingCriteriaList([stops]))
        return out[:, ids_BP.shape[1]:]
    ended_D = torch.tensor(ended, dtype=torch.long, device=ids_BP.device)
    with budget.bound(budget.inputs(False, mask_BP.reshape(-1).bool())):
        out = model.generate(**kwargs, stopping_criteria=StoppingCriteriaList([_NextStep(budget, stops, ended_D)]))
    return out[:, ids_BP.shape[1]:]
