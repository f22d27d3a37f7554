"""Next-token fidelity of a budgeted model against dense, in one decode batch (`eval.fidelity=true`).

The dense model decodes greedily (its own continuation, each row to its own stop); the budgeted
model is fed that same continuation (teacher forcing) in the same decode batch, one step at a time,
with its own KV cache, so each decode step selects experts for the same rows as generation would.
Per decode step, over the rows still running:

    kl     KL(p_dense || p_budget) of the next-token distribution
    dll    log p_budget(x) - log p_dense(x), x the dense model's next token (log-likelihood change)
    agree  the budgeted model's greedy token equals x

The first new token comes from the prefill, which a budget leaves dense (apply_to=decode), so only
decode steps are measured, as in generation. The same sums are kept per row, so each request
carries its own kl, dll and agree totals (a paired comparison resamples prompts, not batches). Both passes run the same budgeted model, each
forward with its own inputs (base/hf/budget.py): the dense one as the reference (the model's own
routing), the budgeted one recording nothing (the selection statistics come from the
evaluation's own generation). Method `dense` gives KL and dll exactly 0.

Shapes: B rows, S prompt positions, V vocabulary.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from torch import Tensor, nn

from base.eval.generate import active_rows
from base.eval.stops import RowStops
from base.hf.budget import MoeBudget


def _positions(mask_BS: Tensor) -> Tensor:
    """Position ids as generate computes them for left-padded rows."""
    return (mask_BS.long().cumsum(-1) - 1).clamp_min(0)


@functools.cache
def _cache_kwarg(model_cls: type) -> str:
    """transformers renamed `past_key_values` to `cache` within the supported range (>=5.17): an
    unknown keyword would be swallowed by **kwargs and every step would run without its cache.
    Read once per model class, not at every teacher-forced step."""
    return "cache" if "cache" in inspect.signature(model_cls.forward).parameters else "past_key_values"


def _step(model: nn.Module, ids_BS: Tensor, mask_BS: Tensor, cache: Any) -> tuple[Tensor, Any]:
    pos_BS = _positions(mask_BS)[:, -ids_BS.shape[1]:]
    key = _cache_kwarg(type(model))
    out = model(input_ids=ids_BS, attention_mask=mask_BS, position_ids=pos_BS, use_cache=True, **{key: cache})
    return out.logits[:, -1].to(torch.float64), getattr(out, key)  # (B, V)


@torch.no_grad()
def teacher_forced(model: nn.Module, budget: MoeBudget, enc_BS: Tensor, mask_BS: Tensor, stops: RowStops,
                   max_new: int, pad_id: int, ended: tuple[int, ...]) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """(one row per decode step, one row per batch row): tokens scored and the sums of kl, dll and
    agree over them."""
    B = enc_BS.shape[0]
    ended_D = torch.tensor(ended, dtype=torch.long, device=enc_BS.device)
    prompt_T = mask_BS.reshape(-1).bool()
    with budget.bound(budget.inputs(False, prompt_T, reference=True)):
        logits_d_BV, cache_d = _step(model, enc_BS, mask_BS, None)
    with budget.bound(budget.inputs(False, prompt_T, record=False)):
        _, cache_b = _step(model, enc_BS, mask_BS, None)
    tok_B = logits_d_BV.argmax(-1)
    new = [tok_B.cpu()]
    done_B = stops.done_rows(torch.stack(new, 1))
    mask = mask_BS
    rows = []
    sums_4B = torch.zeros(4, B, dtype=torch.float64, device=enc_BS.device)  # tokens, kl, dll, agree per row
    for step in range(1, max_new):
        if bool(done_B.all()):
            break
        done_dev_B = done_B.to(enc_BS.device)
        ids_B1 = torch.where(done_dev_B, pad_id, tok_B)[:, None]
        mask = torch.cat([mask, mask.new_ones(B, 1)], dim=1)
        with budget.bound(budget.inputs(True, active_rows(ids_B1[:, 0], ended_D, done_dev_B), reference=True)):
            logits_d_BV, cache_d = _step(model, ids_B1, mask, cache_d)
        # finished rows neither score nor join the union
        with budget.bound(budget.inputs(True, active_rows(ids_B1[:, 0], ended_D, done_dev_B), record=False)):
            logits_b_BV, cache_b = _step(model, ids_B1, mask, cache_b)
        logp_d_BV, logp_b_BV = logits_d_BV.log_softmax(-1), logits_b_BV.log_softmax(-1)
        # fp64; clamped at 0 against rounding when the two distributions are nearly equal
        kl_B = (logp_d_BV.exp() * (logp_d_BV - logp_b_BV)).sum(-1).clamp_min(0.0)
        tok_B = logits_d_BV.argmax(-1)
        dll_B = (logp_b_BV - logp_d_BV).gather(1, tok_B[:, None])[:, 0]
        agree_B = (logits_b_BV.argmax(-1) == tok_B).double()
        live_B = (~done_dev_B).double()
        sums_4B += torch.stack([live_B, kl_B * live_B, dll_B * live_B, agree_B * live_B])
        rows.append({"step": step, "tokens": float(live_B.sum()), "kl_sum": float((kl_B * live_B).sum()),
                     "dll_sum": float((dll_B * live_B).sum()), "agree_sum": float((agree_B * live_B).sum())})
        new.append(tok_B.cpu())
        done_B = stops.done_rows(torch.stack(new, 1))
    per_row = [dict(zip(REQUEST_FIELDS, map(float, col))) for col in sums_4B.T.tolist()]
    return rows, per_row


REQUEST_FIELDS = ("fidelity_tokens", "kl_sum", "dll_sum", "agree_sum")  # per request, in samples.jsonl


def summarize(rows: list[dict[str, float]]) -> dict[str, float]:
    """Per-token means over every scored decode step of a run."""
    tokens = sum(r["tokens"] for r in rows)
    if tokens == 0:
        return {}
    return {"kl": sum(r["kl_sum"] for r in rows) / tokens, "dll": sum(r["dll_sum"] for r in rows) / tokens,
            "top1_agree": sum(r["agree_sum"] for r in rows) / tokens, "fidelity_tokens": tokens}
