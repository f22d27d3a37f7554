"""A run's tasks through lm-eval over the budgeted model: metrics, per-request records, statistics.

    result = evaluate(model, tokenizer, task_cfg, eval_cfg, batch_size=16, seed=0, budget=budget)

lm-eval drives the tasks; its generation requests are decoded in serving-like batches
(base/eval/batches.py) through the engine or transformers' generate. Nothing here changes the
process: task files name their data relative to themselves (tasks/*/utils.py), so no working
directory is needed, and code-executing tasks run only with eval.confirm_unsafe_code.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from base.config import EvalConfig, SchedulerConfig, TaskConfig
from base.eval.lm import BudgetedLM
from base.eval.lmeval_logging import quiet_expected_warnings
from base.hf.budget import MoeBudget

# lm-eval's standard errors: closed form for mean metrics; a bootstrap only for other aggregations.
BOOTSTRAP_ITERS = 1000
CODE_EVAL_ENV = "HF_ALLOW_CODE_EVAL"  # what lm-eval's code-execution metric (code_eval) asks for


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
    serving: dict[str, Any] | None = None  # continuous batching: rounds, steps, occupancy, steady decode rate


def evaluate(model, tokenizer, task: TaskConfig, eval_cfg: EvalConfig, batch_size: int, seed: int,
             budget: MoeBudget | None, root: Path, scheduler: SchedulerConfig | None = None) -> EvalResult:
    from lm_eval import simple_evaluate

    from base.eval.tasks import task_manager

    quiet_expected_warnings()
    include = str(root / task.include_path) if task.include_path else None
    batch_seed = seed if eval_cfg.seed is None else eval_cfg.seed  # the mixing order only
    lm = BudgetedLM(model, tokenizer, batch_size, eval_cfg, batch_seed, budget,
                    max_length=getattr(model.config, "max_position_embeddings", 2048), scheduler=scheduler)
    code_eval = os.environ.get(CODE_EVAL_ENV)
    if eval_cfg.confirm_unsafe_code:
        os.environ[CODE_EVAL_ENV] = "1"
    try:
        out = simple_evaluate(
            model=lm, tasks=list(task.tasks), num_fewshot=task.num_fewshot, limit=task.limit,
            task_manager=task_manager(include, tuple(task.tasks)), random_seed=seed, numpy_random_seed=seed,
            torch_random_seed=seed, fewshot_random_seed=seed, log_samples=True, bootstrap_iters=BOOTSTRAP_ITERS,
            confirm_run_unsafe_code=eval_cfg.confirm_unsafe_code,
        )
    finally:
        lm.batches.release()
        if code_eval is None:
            os.environ.pop(CODE_EVAL_ENV, None)
        else:
            os.environ[CODE_EVAL_ENV] = code_eval
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
    b = lm.batches
    samples = sample_rows(out.get("samples") or {}, b.batch_of, b.lengths, b.fidelity_of)
    return EvalResult(rows, raw, b.decode_batches, b.decode_steps, b.decode_steps_by_task,
                      b.use_engine or eval_cfg.batching == "continuous", samples, b.fidelity_rows,
                      {**b.serve_stats.summary(), "stop_mode": b.stop_mode,
                       "compiled_prefill": b.compiled_prefill} if b.serve_stats is not None else None)


def sample_rows(samples: dict[str, list[dict]], batch_of: dict[tuple[str, int], int],
                lengths: dict[tuple[str, int], tuple[int, int]] | None = None,
                fidelity_of: dict[tuple[str, int], dict[str, float]] | None = None) -> list[dict[str, Any]]:
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
                # token counts of the request (throughput.mode=stream can replay them: stream.lengths_from)
                **dict(zip(("prompt_tokens", "new_tokens"), (lengths or {}).get((task, s["doc_id"]), (None, None)))),
                # eval.fidelity: the request's token count and kl, dll, agree sums (base/eval/fidelity.py)
                **(fidelity_of or {}).get((task, s["doc_id"]), {}),
            })
    return rows
