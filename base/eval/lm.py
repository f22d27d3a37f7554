"""lm-eval's model interface over a budgeted model: generation requests go to the decode batches.

lm-eval calls `generate_until` with its requests; this class turns each into a Request (its
context, stop strings and token limit, with eval.gen_toks / eval.max_gen_toks applied) and hands
them to DecodeBatches (base/eval/batches.py), which schedules, decodes and keeps the statistics.
Log-likelihood requests run through HFLM unchanged.
"""
from __future__ import annotations

from typing import Any

import torch
from lm_eval.models.huggingface import HFLM

from base.config import ConfigError, EvalConfig, SchedulerConfig
from base.eval.batches import DecodeBatches, Request
from base.hf.budget import MoeBudget

HFLM_MAX_GEN_TOKS = 256  # lm-eval's HFLM: new tokens of a task that names no max_gen_toks


def new_tokens(gen_kwargs: dict[str, Any], cfg: EvalConfig, default: int = HFLM_MAX_GEN_TOKS) -> int:
    """A request's new-token limit: its task's max_gen_toks, replaced by eval.gen_toks or capped by
    eval.max_gen_toks."""
    if cfg.gen_toks is not None:
        return cfg.gen_toks  # set: the paper's 384 whatever the task says
    asked = int(gen_kwargs.get("max_gen_toks", default))
    return asked if cfg.max_gen_toks is None else min(asked, cfg.max_gen_toks)


def overflow(where: str, prompt: int, new: int, context: int, model: str, fix: str) -> ConfigError:
    """The error for a request that needs more positions than the model has (HFLM would cut its prompt)."""
    return ConfigError(f"{where}: a prompt of {prompt} tokens plus {new} new tokens needs {prompt + new} positions, "
                       f"but {model} has {context}; {fix}")


SHORTEN = ("shorten the prompts (task.num_fewshot) or the generation (eval.gen_toks / eval.max_gen_toks), or use a "
           "model with more positions")


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
