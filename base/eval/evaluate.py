"""Task evaluation through lm-eval's HFLM over the patched model.

Decode batches must look like concurrent serving. lm-eval sorts generation requests by length,
which groups similar requests and hides the union growth BASE targets; with `order=mixed` the
requests of all tasks of a run are shuffled with the run's seed and cut into batches of
`batch_size`, each row keeping its own stop strings and token limit.
"""
from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lm_eval.models.huggingface import HFLM
from tqdm.auto import tqdm
from transformers import StoppingCriteriaList

from base.config import EvalConfig, TaskConfig
from base.eval.lmeval_logging import quiet_expected_warnings
from base.hf.patch import BudgetPatch
from base.eval.stops import RowStops

quiet_expected_warnings()

# lm-eval's standard errors: closed form for mean metrics; a bootstrap only for other aggregations.
BOOTSTRAP_ITERS = 1000


def _truncate(text: str, until: list[str]) -> str:
    for stop in until:
        if stop:
            text = text.split(stop)[0]
    return text


class BudgetedHFLM(HFLM):
    """HFLM whose generation batches are shuffled across tasks and whose finished rows are tracked."""

    def __init__(self, model, tokenizer, batch_size: int, eval_cfg: EvalConfig, seed: int,
                 patch: BudgetPatch | None, max_length: int | None = None) -> None:
        super().__init__(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length)
        self.eval_cfg, self.seed, self.patch = eval_cfg, seed, patch
        self.decode_batches = 0
        on_gpu = torch.device(self.device).type == "cuda"
        self.use_engine = eval_cfg.engine == "on" or (eval_cfg.engine == "auto" and on_gpu)
        self._engine = None
        self.decode_steps = 0
        self.decode_steps_by_task: dict[str, int] = {}  # row decode steps per task (the budget applies to these)
        self.fidelity_rows: list[dict[str, float]] = []  # eval.fidelity: one row per (decode batch, step)
        self.last_row_steps: list[int] = []
        self.batch_of: dict[tuple[str, int], int] = {}  # (task, doc id) -> its decode batch

    def _sampling(self) -> dict[str, Any]:
        c = self.eval_cfg
        if c.do_sample:
            return {"do_sample": True, "temperature": c.temperature, "top_p": c.top_p, "top_k": c.top_k}
        return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}

    def generate_batch(self, contexts: list[str], untils: list[list[str]], max_new: list[int]) -> list[str]:
        enc, mask = self.tok_batch_encode(contexts, left_truncate_len=self.max_length - max(max_new))
        enc, mask = enc.to(self.device), mask.to(self.device)
        eos = {self.tokenizer.eos_token_id} | ({self.tokenizer.pad_token_id} - {None})
        stops = RowStops(self.tokenizer, enc.shape[1], untils, max_new, eos, self.patch)
        if self.use_engine:
            new = self._engine_generate(enc, mask, max(max_new), stops)
        else:
            new = self._hf_generate(enc, mask, max(max_new), stops)
        if self.eval_cfg.fidelity and self.patch is not None:
            from base.eval.fidelity import teacher_forced

            dense_stops = RowStops(self.tokenizer, enc.shape[1], untils, max_new, eos, None)
            for row in teacher_forced(self.model, self.patch, enc, mask, dense_stops, max(max_new),
                                      self.tokenizer.pad_token_id):
                self.fidelity_rows.append({"decode_batch": self.decode_batches, **row})
        self.decode_batches += 1
        self.decode_steps += max(0, new.shape[1] - 1)  # the first new token comes from the prefill
        # each row's decode steps (tokens after the prefill's) until it finished
        self.last_row_steps = [max(0, stops.lengths.get(i, new.shape[1]) - 1) for i in range(len(contexts))]
        texts = []
        for row, until, n in zip(new.tolist(), untils, max_new):
            texts.append(_truncate(self.tok_decode(row[:n], skip_special_tokens=True), until))
        return texts

    def _hf_generate(self, enc, mask, max_new: int, stops: RowStops) -> torch.Tensor:
        if self.patch is not None:
            self.patch.ctx.finished_B = None
        with torch.no_grad():
            out = self.model.generate(
                input_ids=enc, attention_mask=mask, max_new_tokens=max_new,
                stopping_criteria=StoppingCriteriaList([stops]), pad_token_id=self.tokenizer.pad_token_id,
                use_cache=True, **self._sampling(),
            )
        if self.patch is not None:
            self.patch.ctx.finished_B = None
        return out[:, enc.shape[1]:]

    def _engine_generate(self, enc, mask, max_new: int, stops: RowStops) -> torch.Tensor:
        """The same decoding through base/runtime/engine.py: one CUDA graph per evaluation, reused by every
        batch (a short last batch fills its spare rows with finished padding). The host checks the
        stop strings after every step, so rows finish exactly when generate's would."""
        from base.runtime.engine import DecodeEngine, Sampling

        need = enc.shape[1] + max_new
        if self._engine is None or self._engine.L < need:
            if self._engine is not None:
                self._engine.release()
            c = self.eval_cfg
            sampling = Sampling(True, c.temperature, c.top_k, c.top_p) if c.do_sample else Sampling()
            self._engine = DecodeEngine(self.model, int(self.batch_size), -(-need // 256) * 256, patch=self.patch,
                                        eos_ids=tuple(sorted(stops.eos_ids)), pad_id=self.tokenizer.pad_token_id,
                                        sampling=sampling)
        return self._engine.generate(enc, mask, max_new, stop=stops.done_rows).tokens_BN

    def _request_args(self, req) -> tuple[str, list[str], int]:
        context, gen_kwargs = req.args
        until = gen_kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        max_new = int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))
        if self.eval_cfg.gen_toks is not None:
            max_new = self.eval_cfg.gen_toks  # set: the paper's 384 whatever the task says
        elif self.eval_cfg.max_gen_toks is not None:
            max_new = min(max_new, self.eval_cfg.max_gen_toks)
        return context, until, max_new

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        order = list(range(len(requests)))
        if self.eval_cfg.order == "mixed":
            random.Random(self.seed).shuffle(order)
        else:  # lm-eval's grouping: longest contexts first
            order.sort(key=lambda i: -len(self.tok_encode(requests[i].args[0])))
        results: list[str | None] = [None] * len(requests)
        bs = int(self.batch_size)
        for start in tqdm(range(0, len(order), bs), desc="generate", disable=disable_tqdm):
            ids = order[start:start + bs]
            args = [self._request_args(requests[i]) for i in ids]
            texts = self.generate_batch(*map(list, zip(*args)))
            for i, text, n in zip(ids, texts, self.last_row_steps):
                results[i] = text
                task = getattr(requests[i], "task_name", None) or "?"
                self.batch_of[(task, getattr(requests[i], "doc_id", i))] = self.decode_batches - 1
                self.decode_steps_by_task[task] = self.decode_steps_by_task.get(task, 0) + n
        return results  # type: ignore[return-value]


@dataclass
class EvalResult:
    metrics: list[dict[str, Any]]  # one row per (task, metric)
    raw: dict[str, Any]  # lm-eval's output without samples (results, groups, configs, ...)
    decode_batches: int
    decode_steps: int  # decode forwards over all batches
    decode_steps_by_task: dict[str, int]  # per task: its rows' decode steps (0: the budget never applied)
    engine: bool  # decoded through base/runtime/engine.py (CUDA graphs on a GPU)
    samples: list[dict[str, Any]]  # one row per request (sample_rows)
    fidelity: list[dict[str, float]]  # eval.fidelity: per (decode batch, step) KL / dll sums (base/eval/fidelity.py)


def evaluate(model, tokenizer, task: TaskConfig, eval_cfg: EvalConfig, batch_size: int, seed: int,
             patch: BudgetPatch | None, root: Path) -> EvalResult:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    include = str(root / task.include_path) if task.include_path else None
    if eval_cfg.confirm_unsafe_code:
        os.environ["HF_ALLOW_CODE_EVAL"] = "1"  # what lm-eval's code-execution metrics (code_eval) ask for
    batch_seed = seed if eval_cfg.seed is None else eval_cfg.seed  # the mixing order only
    lm = BudgetedHFLM(model, tokenizer, batch_size, eval_cfg, batch_seed, patch,
                      max_length=getattr(model.config, "max_position_embeddings", 2048))
    # Task YAMLs name their local data relative to the repo root.
    with contextlib.chdir(root):
        out = simple_evaluate(
            model=lm, tasks=list(task.tasks), num_fewshot=task.num_fewshot, limit=task.limit,
            task_manager=TaskManager(include_path=include), random_seed=seed, numpy_random_seed=seed,
            torch_random_seed=seed, fewshot_random_seed=seed, log_samples=True, bootstrap_iters=BOOTSTRAP_ITERS,
            confirm_run_unsafe_code=eval_cfg.confirm_unsafe_code,
        )
    rows = []
    groups = out.get("groups") or {}
    for section in ("results", "groups"):
        for name, metrics in (out.get(section) or {}).items():
            if section == "results" and name in groups:
                continue  # lm-eval lists a group under both
            for key, value in metrics.items():
                if "," not in key or "stderr" in key or not isinstance(value, (int, float)):
                    continue
                metric, filt = key.split(",", 1)
                stderr = metrics.get(f"{metric}_stderr,{filt}")
                rows.append({"task": name, "kind": section[:-1], "metric": metric, "filter": filt,
                             "value": float(value), "stderr": float(stderr) if isinstance(stderr, (int, float)) else None,
                             "n": (out.get("n-samples", {}).get(name) or {}).get("effective")})
    raw = {k: v for k, v in out.items() if k != "samples"}
    samples = sample_rows(out.get("samples") or {}, lm.batch_of)
    if lm._engine is not None:
        lm._engine.release()
    return EvalResult(rows, raw, lm.decode_batches, lm.decode_steps, lm.decode_steps_by_task, lm.use_engine, samples,
                      lm.fidelity_rows)


def sample_rows(samples: dict[str, list[dict]], batch_of: dict[tuple[str, int], int]) -> list[dict[str, Any]]:
    """One row per request: what a paired comparison of two runs over the same prompts needs."""
    rows = []
    for task, items in samples.items():
        for s in items:
            metric = (s.get("metrics") or ["?"])[0]
            value = s.get(metric)
            filtered = s.get("filtered_resps") or [""]
            rows.append({
                "task": task, "doc_id": s["doc_id"], "prompt_hash": s.get("prompt_hash"),
                "generation": filtered[0] if isinstance(filtered[0], str) else str(filtered[0]),
                "target": str(s.get("target")), "metric": metric, "filter": s.get("filter"),
                "correct": float(value) if isinstance(value, (int, float)) else None,
                "decode_batch": batch_of.get((task, s["doc_id"])),
            })
    return rows
