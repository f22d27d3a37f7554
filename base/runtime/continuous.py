"""Continuous batching: a fixed number of slots; a finished request's slot takes the next one.

    engine = ContinuousEngine(model, slots=16, max_len=640, budget=budget, eos_ids=(2,), pad_id=0)
    engine.reset()
    first_n = engine.admit([3, 7], ids_nP, mask_nP)  # prefill two arrivals into slots 3 and 7
    engine.decode(1)                                 # one step of every occupied slot
    engine.tok_B1, engine.finished_B                 # each slot's new token; which slots ended
    engine.end(3)                                    # slot 3's request is over: inactive until refilled

Each slot is a row of the KV cache (base/hf/attention.py) with its own write slot, position and
mask, so a request admitted mid-way decodes exactly as it would alone: its prompt is prefilled,
dense as in the static engine, into its row at slots [0, P) (several arrivals together, left-padded
to the longest), and its decode steps write at P, P+1, ... while the other rows go on where they
are. The decode step is the static engine's step with per-row write slots, one CUDA graph per slot
count (eager on a CPU, the same code). A slot that holds no request, or whose request ended, is
inactive: it neither scores nor joins the union, and what it computes is discarded.

Admission happens between steps (base/runtime/scheduler.py decides who). Each admission is one
prefill forward of the arrivals only, eager, outside the graph: while it runs no slot decodes,
which is the cost of interleaving (a server's time to first token; vLLM's chunked prefill would
run them in one forward).

Shapes: B slots, n arrivals, P their prompt length, L cache slots per row.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import Tensor

from base.hf.attention import StaticKV
from base.runtime.engine import DecodeEngine


class ContinuousEngine(DecodeEngine):
    """The decode engine with per-slot admission (see the module doc)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cache = StaticKV(self.L, self.device, batch=self.B)  # B rows even when fewer arrive first
        self.slot_B1 = torch.zeros(self.B, 1, dtype=torch.long, device=self.device)  # each row's next write slot

    def reset(self) -> None:
        """Every slot empty (inactive, attending to one blank slot so that nothing divides by zero)."""
        if not self.cache.owns(self.model):
            self.cache.claim(self.model)
            self._graph = None
        self.cache.zero_()
        self.valid_BL.zero_()
        self.valid_BL[:, 0] = True
        self.slot_B1.fill_(1)
        self.rowpos_B1.zero_()
        self.tok_B1.fill_(self.pad_id)
        self.finished_B.fill_(True)
        self.cache.set_write_pos(self.slot_B1)

    @torch.no_grad()
    def admit(self, slots: list[int], ids_nP: Tensor, mask_nP: Tensor, stop_at_eos: bool = True) -> Tensor:
        """Prefill the arrivals (left-padded prompts) into `slots`; returns their first new tokens
        (n,). Their rows' old contents are replaced; the other rows are untouched."""
        n, P = ids_nP.shape
        if P >= self.L:
            raise ValueError(f"prompt of {P} tokens does not fit the engine's {self.L} cache slots")
        dev = self.device
        rows_n = torch.tensor(slots, dtype=torch.long, device=dev)
        ids, mask = ids_nP.to(dev), mask_nP.to(dev)
        if not self.cache.owns(self.model):
            self.reset()
        self.valid_BL[rows_n] = False
        self.valid_BL[rows_n, :P] = mask.bool()
        pos_nP = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as generate does for left padding
        causal_PP = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
        allowed_n1PL = torch.zeros(n, 1, P, self.L, dtype=torch.bool, device=dev)
        allowed_n1PL[:, 0, :, :P] = causal_PP & mask.bool()[:, None, :]
        allowed_n1PL[:, 0, :, :P] |= torch.eye(P, dtype=torch.bool, device=dev)  # pad queries: themselves
        self.cache.set_write_rows(rows_n)
        self.cache.set_write_pos(torch.arange(P, device=dev))
        try:
            out = self._forward(ids, allowed_n1PL, pos_nP, False, mask.reshape(-1).bool())
        finally:
            self.cache.set_write_rows(None)
            self.cache.set_write_pos(self.slot_B1)  # decode steps write at each row's slot
        first_n = self.sampling.next_token(out.logits[:, -1])
        self.slot_B1[rows_n] = P
        self.rowpos_B1[rows_n] = pos_nP[:, -1:] + 1
        self.tok_B1[rows_n] = first_n[:, None]
        self.finished_B[rows_n] = torch.isin(first_n, self.eos_D) & stop_at_eos
        self.stop_at_eos.fill_(stop_at_eos)
        return first_n

    def end(self, slot: int) -> None:
        """The slot's request is over (a host stop check): inactive until the next admission."""
        self.finished_B[slot] = True

    def _step(self) -> None:
        """One decode step of every row at its own slot; no host sync (captured as is)."""
        self.cache.sync()
        self.valid_BL.scatter_(1, self.slot_B1, True)
        with self.regions.enabled() if self.regions is not None else nullcontext():
            out = self._forward(self.tok_B1, self.valid_BL[:, None, None, :], self.rowpos_B1, True, ~self.finished_B)
        nxt_B = torch.where(self.finished_B, self.pad_id, self.sampling.next_token(out.logits[:, -1]))
        self.finished_B |= self.stop_at_eos & torch.isin(nxt_B, self.eos_D)
        self.tok_B1.copy_(nxt_B[:, None])
        # an ended row keeps writing its last slot (its contents are discarded at its next admission)
        self.slot_B1.add_(1).clamp_(max=self.L - 1)
        self.rowpos_B1 += 1
