"""How many tokens a generation request may add, and the error when a prompt and its generation
overflow the model's positions. Kept apart from base/eval/lm.py (lm-eval's model interface) so
that the pre-flight checks of every stage run where lm-eval is not installed (a throughput run on
a GPU host)."""
from __future__ import annotations

from typing import Any

from base.config import ConfigError, EvalConfig

HFLM_MAX_GEN_TOKS = 256  # lm-eval's HFLM: new tokens of a task that names no max_gen_toks


def new_tokens(gen_kwargs: dict[str, Any], cfg: EvalConfig, default: int = HFLM_MAX_GEN_TOKS) -> int:
    """A request's new-token limit: its task's max_gen_toks, replaced by eval.gen_tokens or capped by
    eval.max_gen_tokens."""
    if cfg.gen_tokens is not None:
        return cfg.gen_tokens  # set: the paper's 384 whatever the task says
    asked = int(gen_kwargs.get("max_gen_toks", default))
    return asked if cfg.max_gen_tokens is None else min(asked, cfg.max_gen_tokens)


def overflow(where: str, prompt: int, new: int, context: int, model: str, fix: str) -> ConfigError:
    """The error for a request that needs more positions than the model has (HFLM would cut its prompt)."""
    return ConfigError(f"{where}: a prompt of {prompt} tokens plus {new} new tokens needs {prompt + new} positions, "
                       f"but {model} has {context}; {fix}")


SHORTEN = ("shorten the prompts (task.num_fewshot) or the generation (eval.gen_tokens / eval.max_gen_tokens), or use a "
           "model with more positions")
