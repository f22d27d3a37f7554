"""lm-eval's model interface over a budgeted model: generation requests go to the decode batches.

lm-eval calls `generate_until` with its requests; this class turns each into a Request (its
context, stop strings and token limit, with eval.gen_toks / eval.max_gen_toks applied) and hands
them to DecodeBatches (base/eval/batches.py), which schedules, decodes and keeps the statistics.
Log-likelihood requests run through HFLM unchanged.
"""
from __future__ import annotations

import torch
from lm_eval.models.huggingface import HFLM

from base.config import EvalConfig, SchedulerConfig
from base.eval.batches import DecodeBatches, Request
from base.hf.budget import MoeBudget


class BudgetedLM(HFLM):
    def __init__(self, model: torch.nn.Module, tokenizer, batch_size: int, eval_cfg: EvalConfig, seed: int,
                 budget: MoeBudget | None, max_length: int | None = None,
                 scheduler: SchedulerConfig | None = None) -> None:
        super().__init__(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length)
        self.eval_cfg = eval_cfg
        self.batches = DecodeBatches(model, tokenizer, budget, self, int(self.batch_size), eval_cfg, seed,
                                     self.max_length, torch.device(self.device), scheduler)

    def _request(self, req, index: int) -> Request:
        context, gen_kwargs = req.args
        until = gen_kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        max_new = int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))
        if self.eval_cfg.gen_toks is not None:
            max_new = self.eval_cfg.gen_toks  # set: the paper's 384 whatever the task says
        elif self.eval_cfg.max_gen_toks is not None:
            max_new = min(max_new, self.eval_cfg.max_gen_toks)
        return Request(context, until, max_new, getattr(req, "task_name", None) or "?", getattr(req, "doc_id", index))

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        return self.batches.run([self._request(r, i) for i, r in enumerate(requests)], disable_tqdm)
