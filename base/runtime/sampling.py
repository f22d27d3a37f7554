"""The next token of every row, in the decode graph: greedy, or temperature / top-k / top-p sampling.

Shapes: B batch, V vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Sampling:
    """Greedy (do_sample False) or temperature / top-k / top-p sampling, in the graph."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def next_token(self, logits_BV: Tensor) -> Tensor:
        if not self.do_sample:
            return logits_BV.argmax(-1)
        logits_BV = logits_BV.float() / max(self.temperature, 1e-5)
        if self.top_k:
            kth_B1 = logits_BV.topk(min(self.top_k, logits_BV.shape[-1]), dim=-1).values[:, -1:]
            logits_BV = logits_BV.masked_fill(logits_BV < kth_B1, float("-inf"))
        if self.top_p is not None and self.top_p < 1.0:
            sorted_BV, order_BV = logits_BV.sort(dim=-1, descending=True)
            cum_BV = sorted_BV.softmax(-1).cumsum(-1)
            drop_BV = (cum_BV - sorted_BV.softmax(-1)) > self.top_p  # keep the first token always
            logits_BV = logits_BV.scatter(1, order_BV, sorted_BV.masked_fill(drop_BV, float("-inf")))
        probs_BV = logits_BV.softmax(-1)
        # Exponential race: argmax p / Exp(1) samples from p; graph-safe (no multinomial).
        return (probs_BV / torch.empty_like(probs_BV).exponential_()).argmax(-1)
