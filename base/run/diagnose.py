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

    def report(self, run_rule: str) -> dict:
        """report.json's `diagnostic`: the run's own rule (`run_rule`), every rule's mean agreement,
        and each other rule against the run's (`against_run_rule`: diff = other - run's)."""
        return {"budget": self.budget, "prompts": len(next(iter(self.per_prompt.values()))), "run_rule": run_rule,
                "mean_agreement": self.mean, "against_run_rule": self.compare(run_rule)}


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


# ---- the run's diagnostic: prompts, rules, caching ------------------------------------------------

SHRINK_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)  # method.shrink=auto picks among these


def rule_label(name: str, k0: int | None = None, shrink: float | None = None) -> str:
    return name + (f"(k0={k0})" if k0 is not None else "") + (f"(shrink={shrink:g})" if shrink is not None else "")


def _run_prompts(cfg, tokenizer, layers) -> list[list[int]]:
    """Held-out calibration prompts: windows after the tokens the calibration uses."""
    from base.config import calibration_tokens
    from base.hf.calibrate import read_texts

    text = read_texts([cfg.resolve(f) for f in cfg.calibration.files])
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    skip = calibration_tokens(cfg.calibration, layers[0].num_experts, layers[0].top_k)
    return held_out_prompts(ids, skip, cfg.diagnose.prompt_len, cfg.diagnose.prompts)


def _cached(cfg, layers, key: dict, compute: Callable[[], dict]) -> dict:
    """A diagnostic's result from the model's artifact folder, or computed and stored there."""
    import hashlib
    import json

    from base.files import atomic_write_text, file_lock
    from base.run.artifacts import artifact_dir, model_identity

    directory = artifact_dir(cfg, model_identity(cfg, layers))
    name = hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]
    path = directory / f"diagnostic-{name}.json"
    directory.mkdir(parents=True, exist_ok=True)
    with file_lock(directory, ".diagnostic.lock"):  # not the artifacts' own lock: computing takes that one
        if path.exists() and not cfg.force:
            try:
                return json.loads(path.read_text())
            except ValueError:
                pass  # a damaged file: computed again
        result = {**compute(), "key": key}
        atomic_write_text(path, json.dumps(result, indent=2))
    return result


def _key(cfg, budget: int, labels: list[str]) -> dict:
    from dataclasses import asdict

    d = cfg.diagnose
    return {"budget": budget, "slots": cfg.batch_size, "rules": labels, "prompts": d.prompts,
            "prompt_len": d.prompt_len, "gen_tokens": d.gen_tokens, "predictor": asdict(cfg.predictor),
            "seed": cfg.seed, "backend": cfg.method.backend, "reassign": cfg.method.reassign}


Budgeter = Callable  # base/run/pipeline.py make_budgeter, handed in (diagnose sits below pipeline)


def _measure(cfg, model, tokenizer, layers, budget: int, specs: list[tuple[str, int | None, float | None]],
             make_budgeter: Budgeter) -> dict:
    prompts = _run_prompts(cfg, tokenizer, layers)
    if len(prompts) < 2:
        return {"skipped": f"the calibration files hold too little text beyond the calibration's tokens for "
                           f"{cfg.diagnose.prompts} prompts of {cfg.diagnose.prompt_len} tokens"}
    makers = {rule_label(*s): make_budgeter(cfg, model, tokenizer, layers, *s)[0] for s in specs}
    result = agreement(model, lambda label: makers[label](budget, False), list(makers), prompts,
                       cfg.diagnose.gen_tokens, cfg.batch_size, budget)
    return {"per_prompt": {k: v.tolist() for k, v in result.per_prompt.items()}, "budget": budget}


def _agreement_of(stored: dict) -> Agreement:
    return Agreement(stored["budget"], {k: np.array(v) for k, v in stored["per_prompt"].items()})


def resolve_shrink(cfg, model, tokenizer, layers, name: str, k0: int | None, budget: int,
                   make_budgeter: Budgeter) -> tuple[float, dict]:
    """method.shrink=auto: the alpha of SHRINK_GRID whose rule stays closest to dense at `budget`
    (mean agreement; ties to the larger alpha), with the agreement of each."""
    specs = [(name, k0, a) for a in SHRINK_GRID]
    labels = [rule_label(*s) for s in specs]
    stored = _cached(cfg, layers, {**_key(cfg, budget, labels), "kind": "shrink"},
                     lambda: _measure(cfg, model, tokenizer, layers, budget, specs, make_budgeter))
    if "skipped" in stored:
        print(f"[base] method.shrink=auto: {stored['skipped']}; using 1 (base as fitted)", flush=True)
        return 1.0, stored
    means = _agreement_of(stored).mean
    alpha = max(SHRINK_GRID, key=lambda a: (round(means[rule_label(name, k0, a)], 12), a))
    print(f"[base] method.shrink=auto at M={budget}: alpha {alpha:g} (mean agreement with dense "
          + ", ".join(f"{a:g}: {means[rule_label(name, k0, a)]:.3f}" for a in SHRINK_GRID) + ")", flush=True)
    return alpha, {"alpha": alpha, "mean_agreement": means}


def run_diagnostic(cfg, model, tokenizer, layers, make_budgeter: Budgeter) -> dict | None:
    """The diagnostic of an evaluation of a budgeted rule (None when off or not applicable): the
    run's rule against cfg.diagnose.rules at its budget; prints a warning naming every rule that
    stays significantly closer to dense. The run's own rule with shrink=auto is diagnosed at the
    alpha resolve_shrink picks."""
    m = cfg.method
    rules = cfg.diagnostic_rules()
    if not rules:
        return None
    shrink = m.shrink_value()
    if shrink == "auto":
        shrink, _ = resolve_shrink(cfg, model, tokenizer, layers, m.name, m.k0, cfg.budget, make_budgeter)
    chosen = (m.name, m.k0, shrink)
    others = [(p["method"], p["k0"], None) for p in rules]
    specs = list(dict.fromkeys([chosen, *[s for s in others if s[0] != "dense"]]))
    labels = [rule_label(*s) for s in specs]
    stored = _cached(cfg, layers, {**_key(cfg, cfg.budget, labels), "kind": "rules"},
                     lambda: _measure(cfg, model, tokenizer, layers, cfg.budget, specs, make_budgeter))
    if "skipped" in stored:
        print(f"[base] diagnostic skipped: {stored['skipped']}", flush=True)
        return {"skipped": stored["skipped"]}
    result = _agreement_of(stored)
    report = result.report(labels[0])
    better = [r for r in report["against_run_rule"] if r["call"] == "higher"]
    report["warning"] = None
    if better:
        report["warning"] = (f"at M={cfg.budget}, " + "; ".join(
            f"{r['rule']} stays closer to dense than {labels[0]} (mean agreement {result.mean[r['rule']]:.3f} against "
            f"{result.mean[labels[0]]:.3f}, Wilcoxon p_holm {r['p_holm']:.2g})" for r in better)
            + f": {labels[0]} may answer worse here; a hint, not a call: the diagnostic did not pass its "
            "pre-registered validation (results/heldout/grid.md; base/run/diagnose.py; diagnose.enabled=false turns "
            "this off)")
        print(f"[base] WARNING diagnostic: {report['warning']}", flush=True)
    return report
