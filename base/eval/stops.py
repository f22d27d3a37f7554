"""Per-row stopping for batched generation (no lm-eval import: GPU code paths use it too).

A row is done at its own stop string, token limit or EOS; whoever drives the decoding turns the
done rows into the next forward's inactive rows (base/eval/generate.py, base/runtime/engine.py).
"""
from __future__ import annotations

from typing import Any

import torch
from transformers import StoppingCriteria


class RowStops(StoppingCriteria):
    """Per-row stop: a row is done at its own stop string, token limit or EOS."""

    def __init__(self, tokenizer, prompt_len: int, untils: list[list[str]], max_new: list[int],
                 eos_ids: set[int]) -> None:
        self.tok, self.prompt_len, self.untils, self.max_new = tokenizer, prompt_len, untils, max_new
        self.eos_ids = eos_ids
        self.done: torch.Tensor | None = None
        self.lengths: dict[int, int] = {}  # row -> new tokens when it finished

    def done_rows(self, new_bN: torch.Tensor) -> torch.Tensor:
        """Which rows are done, given each row's new tokens so far (host tensor)."""
        b = new_bN.shape[0]
        if self.done is None:
            self.done = torch.zeros(b, dtype=torch.bool)
        for i in range(b):
            if self.done[i]:
                continue
            toks = new_bN[i].tolist()
            text = self.tok.decode(toks, skip_special_tokens=False)
            if (len(toks) >= self.max_new[i] or (toks and toks[-1] in self.eos_ids)
                    or any(s and s in text for s in self.untils[i])):  # "" is no stop (lm-eval's truncation)
                self.done[i] = True
                self.lengths[i] = len(toks)
        return self.done.clone()

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.done_rows(input_ids[:, self.prompt_len:].cpu()).to(input_ids.device)
