"""A small outputs/ tree as run.py writes it (report.json, config.yaml, metrics.csv, selection.csv,
selection_steps.csv, samples.jsonl), for the analysis tests and the notebook test. No torch.

make_outputs(root) writes, for the embedded model `mini` at batch 16:
  sweep `qs_fixture`: base, router_sum and base+drop at M=4 and 6, dense, over batching seeds 0-2,
                      with known accuracies (ACC) and 10 prompts per run; one base@cov0.9 run
  `qs_fixture` fit:   predictor.csv (2 layers)
  `tp_fixture`:       a throughput run of `mini` on a made-up GPU (graph rows at batch 1 and 16)

fidelity_run(root, method, budget, seed, ...) writes one evaluate run with eval.fidelity's
per-request sums and per-layer step statistics (the ablation and records tests).
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

PROMPTS = 10
LAYERS = 2
SEEDS = (0, 1, 2)
# correct prompts out of PROMPTS per (variant, budget), the same in every seed except where noted
ACC = {("base", 4): 8, ("base", 6): 9, ("router_sum", 4): 6, ("router_sum", 6): 8, ("base+drop", 4): 7,
       ("base+drop", 6): 9, ("dense", None): 10}
SPEEDUP = {("base", 4): 1.8, ("base", 6): 1.5, ("router_sum", 4): 1.9, ("router_sum", 6): 1.6, ("dense", None): 1.0}


def _write_run(d: Path, exp: str, report: dict, samples: list[dict] | None = None, steps: list[dict] | None = None,
               selection: list[dict] | None = None) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.yaml").write_text(f"exp_name: {exp}\nbatch_size: {report.get('batch_size', 16)}\n")
    if samples is not None:
        (d / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
        n = len(samples)
        acc = sum(s["correct"] for s in samples) / n
        pd.DataFrame([{"task": "t", "kind": "result", "metric": "exact_match", "filter": "none", "value": acc,
                       "stderr": 0.1, "n": n}]).to_csv(d / "metrics.csv", index=False)
    if selection is not None:
        pd.DataFrame(selection).to_csv(d / "selection.csv", index=False)
    if steps is not None:
        pd.DataFrame(steps).to_csv(d / "selection_steps.csv", index=False)
    (d / "report.json").write_text(json.dumps(report))  # last, as the pipeline does


def _evaluate(root: Path, exp: str, method: str, budget: int | None, seed: int, correct: int,
              mc: dict | None = None, kept: float | None = None) -> None:
    mc = {"name": method, "reassign": "backfill", "k0": None, **(mc or {})}
    kept = kept if kept is not None else (budget - 0.2 if budget else 7.0)
    name = ",".join(f"{k}={v}" for k, v in (("budget", budget if budget else "null"), ("eval.seed", seed),
                                              ("method", method), *sorted(mc.items())) if k != "name")
    samples = [{"task": "t", "doc_id": i, "prompt_hash": f"h{i}", "generation": "x", "target": "x",
                "correct": float(i < correct), "decode_batch": i % 3} for i in range(PROMPTS)]
    steps = [{"layer": li, "step": s, "decode": True, "union": 7.0, "kept": kept + (li - s % 2) * 0.5,
              "tokens": 16 - s} for li in range(LAYERS) for s in range(1, 6)]
    selection = [{"layer": li, "union_mean": 7.0, "kept_mean": kept, "weight_retained": 0.8} for li in range(LAYERS)]
    energy = 0.9 + 0.01 * (budget or 10) - (0.05 if method == "router_sum" else 0)
    summary = {"accuracy": correct / PROMPTS, "union_mean": 7.0, "kept_mean": kept, "energy_retained": min(energy, 1.0),
               "out_error": 0.1 - 0.01 * (budget or 10) + 0.001 * seed, "kl": 0.05 + 0.01 * seed}
    report = {"stage": "evaluate", "model": "mini", "method": method, "budget": budget, "batch_size": 16,
              "seed": 0, "num_experts": 8, "moe_layers": LAYERS, "top_k": 2, "routing": "uniform", "device": "cpu",
              "method_config": mc, "eval": {"batch_seed": seed}, "summary": summary}
    _write_run(root / exp / name, exp, report, samples, steps, selection)


def make_outputs(root: Path, exp: str = "qs_fixture") -> Path:
    """Write the tree under root (the folder playing outputs/); returns root."""
    for (variant, budget), correct in ACC.items():
        method, _, reassign = variant.partition("+")
        for seed in SEEDS:
            _evaluate(root, exp, method, budget, seed, correct, {"reassign": reassign} if reassign else None)
    _evaluate(root, exp, "base", None, 0, 7, {"coverage": 0.9}, kept=3.0)
    fit = {"stage": "fit", "model": "mini", "method": "base", "budget": None, "batch_size": 16, "seed": 0}
    _write_run(root / exp / "model=mini,stage=fit", exp, fit)
    pd.DataFrame({"layer": [0, 1], "r2": [0.9, 0.8], "r2_within": [0.7, 0.6]}).to_csv(
        root / exp / "model=mini,stage=fit" / "predictor.csv", index=False)
    rows = []
    for batch in (1, 16):
        for (variant, budget), speedup in SPEEDUP.items():
            s = speedup if batch == 16 else 1.0
            rows.append({"batch_size": batch, "method": variant, "budget": budget, "k0": None, "variant": variant,
                         "mode": "graph", "ms_per_step": 10.0 / s, "tokens_per_s": 100.0 * batch * s,
                         "union_mean": 2.0 if batch == 1 else 7.0, "kept_mean": budget or (2.0 if batch == 1 else 7.0),
                         "speedup_vs_dense": s})
    tp = {"stage": "throughput", "model": "mini", "method": "base", "budget": 4, "batch_size": 16, "seed": 0,
          "num_experts": 8, "routing": "uniform", "gpu": "Fake GPU", "device": "cuda:0", "throughput": rows}
    _write_run(root / "tp_fixture" / "model=mini", "tp_fixture", tp)
    return root


def fidelity_run(root, method, budget, seed, correct, kl_per_prompt, energy_per_batch, err_per_batch, hashes=None,
                 model="mini", limit=25, batching="static", engine=None):
    """One evaluate run folder as pipeline.run writes it with eval.fidelity=true: per-request records
    with fidelity sums (2 tokens each), and per-layer step statistics of static batches of 4 prompts
    (one prefill step, then 2 decode steps: as many as the batch's longest request; 2 layers)."""
    d = root / f"method={method},budget={budget},eval.seed={seed}"
    d.mkdir(parents=True)
    n = len(correct)
    (d / "report.json").write_text(json.dumps({
        "stage": "evaluate", "method": method, "budget": budget, "seed": 0, "model": model,
        "eval": {"batch_seed": seed, "tasks": ["mini"], "limit": limit, "batching": batching},
        "summary": {"accuracy": sum(correct) / n, "kept_mean": budget or 10.0},
        **({"provenance": {"fingerprint": engine}} if engine else {})}))
    hashes = hashes or [f"h{i}" for i in range(n)]
    (d / "samples.jsonl").write_text("".join(json.dumps({
        "task": "t", "doc_id": i, "prompt_hash": hashes[i], "correct": float(c), "fidelity_tokens": 2.0,
        "kl_sum": 2.0 * kl, "dll_sum": -2.0 * kl, "agree_sum": 2.0, "decode_batch": i // 4,
        "new_tokens": 3 if i % 4 == 0 else 2}) + "\n"
        for i, (c, kl) in enumerate(zip(correct, kl_per_prompt))))
    rows, step = [], 0
    for e, err in zip(energy_per_batch, err_per_batch):
        for decode in (False, True, True):
            step += 1
            for layer in (0, 1):
                rows.append({"layer": layer, "step": step, "decode": decode, "union": 9.0, "kept": budget or 16,
                             "energy_kept": 10.0 * e, "energy_total": 10.0, "out_err": 10.0 * err, "out_dense": 10.0})
    pd.DataFrame(rows).to_csv(d / "selection_steps.csv", index=False)
    return d
