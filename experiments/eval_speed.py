"""Evaluation-style decoding, eager `generate` against the decode engine: tokens/s and equal answers.

    python -m experiments.eval_speed --model mini --method router_sum --budget 8 --out results/eval_speed.json

What an evaluation does, without lm-eval (which GPU hosts lack): the mini tasks' prompts, mixed
across domains with a seed, cut into decode batches; every row stops at its own stop string
("\\n") or token limit (24), and finished rows leave the union, exactly as in base/eval/evaluate.py
(both paths use base/eval/stops.RowStops). On a GPU the engine replays a CUDA graph and checks the stop
strings on the host after every step; on a CPU it runs eagerly. Reports, per path: seconds,
decode steps (batch forwards) and steps per second, and the share of answers equal between paths.
Selectors that need calibration artifacts (calib_*, base) are not offered: this measures decoding.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
import yaml

from base.config import ModelConfig
from base.eval.generate import budgeted_generate, ended_token_ids
from base.eval.stops import RowStops
from base.hf.budget import BudgetOptions, install_budget
from base.hf.loading import load_model, load_tokenizer
from base.method.selectors import build_selector
from base.runtime.engine import DecodeEngine

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("dense", "router_sum", "router_sq", "count", "fixed")


def mini_prompts(n: int, seed: int) -> list[str]:
    rows = [json.loads(line) for f in sorted((ROOT / "tasks" / "mini").glob("*.jsonl"))
            for line in f.read_text().splitlines() if line]
    random.Random(seed).shuffle(rows)
    return [r["prompt"] for r in rows[:n]]


def decode_all(model, tok, budget, prompts: list[str], batch_size: int, max_new: int, engine: bool) -> tuple[list[str], int]:
    """Answers and decode steps over all batches, through generate or the engine."""
    eos = {tok.eos_token_id} | ({tok.pad_token_id} - {None})
    answers, steps = [], 0
    eng = DecodeEngine(model, batch_size, 256, budget=budget, eos_ids=tuple(sorted(eos)), pad_id=tok.pad_token_id) \
        if engine else None
    device = next(model.parameters()).device
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        enc = tok(batch, return_tensors="pt", padding=True).to(device)
        stops = RowStops(tok, enc["input_ids"].shape[1], [["\n"]] * len(batch), [max_new] * len(batch), eos)
        if engine:
            new = eng.generate(enc["input_ids"], enc["attention_mask"], max_new, stop=stops.done_rows).tokens_BN
        else:
            out = budgeted_generate(model, budget, enc["input_ids"], enc["attention_mask"], ended_token_ids(model, tok),
                                    stops, max_new_tokens=max_new, do_sample=False, pad_token_id=tok.pad_token_id)
            new = out[:, enc["input_ids"].shape[1]:].cpu()
        steps += max(0, new.shape[1] - 1)
        answers += [tok.decode(row, skip_special_tokens=True).split("\n")[0] for row in new.tolist()]
    if eng is not None:
        eng.release()
    return answers, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mini")
    ap.add_argument("--method", default="router_sum", choices=METHODS)
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=320)
    ap.add_argument("--max-new", type=int, default=24)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    cfg = ModelConfig(**{**yaml.safe_load((ROOT / "conf/model" / f"{args.model}.yaml").read_text()),
                         "device": args.device})
    model, tok = load_model(cfg, ROOT, seed=args.seed), load_tokenizer(cfg, ROOT)
    prompts = mini_prompts(args.prompts, args.seed)
    selector = None if args.method == "dense" else build_selector(args.method)
    result = {"model": args.model, "method": args.method, "budget": args.budget, "batch_size": args.batch_size,
              "prompts": len(prompts), "device": str(next(model.parameters()).device)}
    answers = {}
    for path in ("generate", "engine"):
        budget = install_budget(model, cfg.family, selector, BudgetOptions(budget=args.budget, record_stats=False))
        try:
            decode_all(model, tok, budget, prompts[: args.batch_size], args.batch_size, args.max_new, path == "engine")
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            answers[path], steps = decode_all(model, tok, budget, prompts, args.batch_size, args.max_new,
                                              path == "engine")
            seconds = time.perf_counter() - t0
        finally:
            budget.remove()
        result[path] = {"seconds": seconds, "decode_steps": steps, "steps_per_s": steps / seconds}
        print(f"[eval_speed] {path}: {seconds:.2f} s, {steps} decode steps, {steps / seconds:.1f} steps/s", flush=True)
    result["same_answers"] = sum(a == b for a, b in zip(answers["generate"], answers["engine"])) / len(prompts)
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
