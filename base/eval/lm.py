"""lm-eval's model interface over a budgeted model: generation requests go to the decode batches.

lm-eval calls `generate_until` with its requests; this class turns each into a Request (its
context, stop strings and token limit, with eval.gen_tokens / eval.max_gen_tokens applied) and hands
them to DecodeBatches (base/eval/batches.py), which schedules, decodes and keeps the statistics.
Log-likelihood requests run through HFLM unchanged.
"""
from __future__ import annotations

import torch
from lm_eval.models.huggingface import HFLM

from base.config import EvalConfig, SchedulerConfig
from base.eval.batches import DecodeBatches, Request
from base.eval.gen_lengths import SHORTEN, new_tokens, overflow
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
        max_new = new_tokens(gen_kwargs, self.eval_cfg, self.max_gen_toks)
        return Request(context, until, max_new, getattr(req, "task_name", None) or "?", getattr(req, "doc_id", index))

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        reqs = [self._request(r, i) for i, r in enumerate(requests)]
        self._check_fits(reqs)
        return self.batches.run(reqs, disable_tqdm)

    def _check_fits(self, reqs: list[Request]) -> None:
        """No prompt is cut: tok_batch_encode would left-truncate it to max_length minus the new tokens
        (under static batching, the batch's largest). Preflight checks the same before the run starts."""
        largest = max((r.max_new for r in reqs), default=0)
        for r in reqs:
            new = largest if self.eval_cfg.batching == "static" else r.max_new
            prompt = len(self.tok_encode(r.context))
            if prompt + new > self.max_length:
                raise overflow(f"task {r.task} doc {r.doc_id}", prompt, new, self.max_length,
                               getattr(self._model.config, "name_or_path", "the model"), SHORTEN)
