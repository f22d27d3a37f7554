"""Prompt plus new tokens against the model's context (its max_position_embeddings), for every stage
that generates. Beyond it the model has no positions: lm-eval's HFLM would cut the prompt from the
left without a word (accuracy falls to chance), and the engine's timings would describe positions
the model does not have.

    check_eval_requests(cfg, leaves, tokenizer, context)   # evaluate: each request, as lm-eval builds it
                                                           # (and first, each task's few-shot count against its docs)
    check_generation_lengths(cfg, context)                 # throughput: steps, stream and serve lengths

Static batching decodes a batch until its longest request ends and left-pads its prompts, so a
prompt must leave room for the largest new-token count of any request it may share a batch with;
continuous batching gives each request its own.
"""
from __future__ import annotations

from typing import Any

from base.config import ConfigError, RunConfig
from base.eval.gen_lengths import SHORTEN, new_tokens, overflow


def check_eval_requests(cfg: RunConfig, leaves: dict[str, Any], tokenizer, context: int) -> None:
    """Builds each generative task's requests as simple_evaluate will (few-shot count and seed, limit)
    and checks prompt + new tokens of every one, the batch's largest new count under static batching."""
    from lm_eval.evaluator_utils import get_sample_size

    found: list[tuple[int, int, str]] = []  # (prompt tokens, new tokens, where)
    for name, task in sorted(leaves.items()):
        shots = task.get_config("num_fewshot")
        # what simple_evaluate uses: the override, but lm-eval keeps a task's explicit 0; unset is 0
        shots = cfg.task.num_fewshot if (cfg.task.num_fewshot is not None and shots != 0) else (shots or 0)
        _check_fewshot_pool(cfg, name, task, shots)
        if task.OUTPUT_TYPE != "generate_until":
            continue
        task.set_config(key="num_fewshot", value=shots)
        task.set_fewshot_seed(seed=cfg.seed)
        task.build_all_requests(limit=get_sample_size(task, cfg.task.limit))
        for inst in task.instances:
            context_text, gen_kwargs = inst.args
            found.append((len(tokenizer.encode(context_text)), new_tokens(gen_kwargs, cfg.eval),
                          f"task {name} doc {inst.doc_id}"))
    if not found:
        return
    largest_new = max(n for _, n, _ in found)
    for prompt, new, where in found:
        budget_new = largest_new if cfg.eval.batching == "static" else new
        if prompt + budget_new > context:
            shared = (f" (eval.batching=static: its batch decodes up to {largest_new} new tokens, the most any request "
                      f"asks)" if budget_new != new else "")
            raise overflow(where + shared, prompt, budget_new, context, cfg.model.name, SHORTEN)


def _check_fewshot_pool(cfg: RunConfig, name: str, task, want: int) -> None:
    """lm-eval draws each request's `want` few-shot examples from the task's few-shot docs, less the
    request's own doc where they are the split it evaluates: more shots than that ended in
    random.sample's ValueError (task.num_fewshot=100 on a smoke task)."""
    if want == 0:
        return
    docs = task.fewshot_docs()
    same_split = task.fewshot_cfg.split == task.config.test_split
    pool = 0 if docs is None else len(docs) - (1 if same_split else 0)
    if want > pool:
        key = "task.num_fewshot" if cfg.task.num_fewshot is not None else f"task {name}'s num_fewshot"
        whose = " (its own doc left out: they come from the split it evaluates)" if same_split else ""
        raise ConfigError(f"{key}={want}: task {name} has {max(pool, 0)} few-shot examples to draw from{whose}; "
                          f"choose task.num_fewshot <= {max(pool, 0)}")


def check_generation_lengths(cfg: RunConfig, context: int) -> None:
    """stage=throughput: the timed sequences, and a stream's or serving run's longest request."""
    tp, st = cfg.throughput, cfg.stream
    if tp.mode == "steps":
        if tp.prompt_len + tp.gen_tokens > context:
            raise overflow(f"throughput.prompt_len={tp.prompt_len} + throughput.gen_tokens={tp.gen_tokens}",
                           tp.prompt_len, tp.gen_tokens, context, cfg.model.name,
                           "lower throughput.prompt_len or throughput.gen_tokens")
        return
    lengths = st.task_lengths(cfg.root)
    if lengths is not None:
        prompt, new = max(lengths, key=sum)
        if prompt + new > context:
            raise overflow(f"stream.lengths_from={st.lengths_from} (its longest request)", prompt, new, context,
                           cfg.model.name, "replay a run of a model with no more positions than this one")
    elif st.prompt_len[1] + st.output_len[1] > context:
        raise overflow(f"stream.prompt_len={st.prompt_len} + stream.output_len={st.output_len} (their highs)",
                       st.prompt_len[1], st.output_len[1], context, cfg.model.name,
                       "lower the highs of stream.prompt_len or stream.output_len")
