"""A calibration-time check of which rule to trust at a budget (issue 41): each candidate rule
decodes held-out prompts free-running at full occupancy, and is scored by how long it stays on
the dense model's greedy path.

    result = agreement(model, make_budget, ["base", "router_sq"], prompts, gen_tokens=16, slots=16, budget=12)
    result.mean["base"], result.worse_than("base")     # mean agreement; rules significantly above base

Why: per-layer retained cost, measured offline on teacher-forced text, said `base` keeps more of
the true removal cost than `router_sq` on a held-out OLMoE-style model, yet `base` answered worse
online at full occupancy. This measures what the online run does (the budgeted model decoding
its own tokens, many requests sharing each step, through the continuous engine) on text the fit
never saw, and compares rules on the same prompts.

Score: per prompt, the share of the `gen_tokens` new tokens before the first token that differs
from dense's (1: the whole continuation is dense's). Rules are compared prompt by prompt with the
Wilcoxon signed-rank test (scipy), Holm over the rules compared with the chosen one; `worse_than`
names the rules whose agreement is higher at Holm-adjusted p < 0.05.

Prompts: windows of the calibration files after the tokens the calibration uses
(`held_out_prompts`), so the fit never saw them.

Shapes: P prompts, G new tokens per prompt.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from base.config import SchedulerConfig, cache_length
from base.hf.budget import MoeBudget
from base.runtime.continuous import ContinuousEngine
from base.runtime.scheduler import Request, serve

ALPHA = 0.05


def held_out_prompts(ids: list[int], skip: int, prompt_len: int, count: int) -> list[list[int]]:
    """`count` windows of `prompt_len` tokens of the token stream after its first `skip` tokens
    (the calibration's), spread evenly over what is left; fewer when the stream is short."""
    rest = ids[skip:]
    n = min(count, len(rest) // prompt_len)
    if n == 0:
        return []
    step = len(rest) // n
    return [rest[i * step: i * step + prompt_len] for i in range(n)]


def decode(model: nn.Module, budget: MoeBudget | None, prompts: list[list[int]], gen_tokens: int,
           slots: int) -> list[list[int]]:
    """Greedy continuations through the continuous engine, EOS ignored, every prompt admitted as a
    slot frees (full occupancy while prompts wait)."""
    longest = max(len(p) for p in prompts) + gen_tokens
    engine = ContinuousEngine(model, slots, cache_length(longest), budget=budget, pad_id=0)
    try:
        done, _ = serve(engine, [Request(p, gen_tokens) for p in prompts], pad_id=0, stop_at_eos=False,
                        policy=SchedulerConfig())
    finally:
        engine.release()
    return [d.tokens for d in done]


def prefix_agreement(tokens: list[int], reference: list[int]) -> float:
    """The share of `reference` a continuation follows before its first different token."""
    n = 0
    for a, b in zip(tokens, reference):
        if a != b:
            break
        n += 1
    return n / len(reference)


@dataclass
class Agreement:
    budget: int
    per_prompt: dict[str, np.ndarray]  # rule -> (P,) prefix agreement with dense
    mean: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.mean = {r: float(a.mean()) for r, a in self.per_prompt.items()}

    def compare(self, chosen: str) -> list[dict]:
        """Every other rule against `chosen`: mean difference, Wilcoxon p, Holm-adjusted p, call."""
        from scipy.stats import wilcoxon

        rows = []
        for rule, a in self.per_prompt.items():
            if rule == chosen:
                continue
            d = a - self.per_prompt[chosen]
            p = 1.0 if not d.any() else float(wilcoxon(d, zero_method="zsplit").pvalue)
            rows.append({"rule": rule, "diff": float(d.mean()), "p": p})
        ps = sorted(range(len(rows)), key=lambda i: rows[i]["p"])
        running = 0.0
        for rank, i in enumerate(ps):  # Holm's step-down, monotone
            running = max(running, min(1.0, (len(rows) - rank) * rows[i]["p"]))
            rows[i]["p_holm"] = running
        for r in rows:
            r["call"] = ("higher" if r["diff"] > 0 else "lower") if r["p_holm"] < ALPHA else "inconclusive"
        return rows

    def worse_than(self, chosen: str) -> list[str]:
        """The rules whose agreement is higher than `chosen`'s (Holm-adjusted p < 0.05)."""
        return [r["rule"] for r in self.compare(chosen) if r["call"] == "higher"]

    def report(self, chosen: str) -> dict:
        return {"budget": self.budget, "prompts": len(next(iter(self.per_prompt.values()))), "chosen": chosen,
                "mean_agreement": self.mean, "against_chosen": self.compare(chosen)}


def agreement(model: nn.Module, make_budget: Callable[[str], MoeBudget], rules: list[str],
              prompts: list[list[int]], gen_tokens: int, slots: int, budget: int) -> Agreement:
    """Each rule's prefix agreement with dense on the same prompts (see the module doc).
    `make_budget(rule)` installs that rule at `budget` on the model (removed here after use)."""
    with torch.no_grad():
        dense = decode(model, None, prompts, gen_tokens, slots)
        per_prompt = {}
        for rule in rules:
            b = make_budget(rule)
            try:
                tokens = decode(model, b, prompts, gen_tokens, slots)
            finally:
                b.remove()
            per_prompt[rule] = np.array([prefix_agreement(t, d) for t, d in zip(tokens, dense)])
    return Agreement(budget, per_prompt)
