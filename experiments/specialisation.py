"""Do the experts specialise by domain? Per MoE layer:

- Jensen-Shannon divergence between the domains' expert histograms (top-k choices over prompt +
  answer tokens of held-out examples), averaged over domain pairs (0 = same routing, ln 2 = disjoint);
- the dense union size at decode batch 16 for mixed-domain vs single-domain batches.

    python -m experiments.specialisation --model mini --out outputs/specialisation

Writes js.csv, union.csv, union_by_domain.csv and report.json into --out, each table's last column
`engine` (analysis/engines.py): js.csv `none (dense forward)` (routing of one forward over prompt +
answer), the union tables the static engine that decoded them (transformers' generate, e.g.
`s1-generate-cpu`). Shapes: E experts, L MoE layers, D domains.
"""
from __future__ import annotations

import argparse
import itertools
import json
import random
from pathlib import Path

import pandas as pd
import torch
import yaml

from base.config import ModelConfig
from base.eval.generate import budgeted_generate
from base.files import atomic_write_text
from base.hf.budget import BudgetOptions, install_budget
from base.hf.families import find_moe_layers
from base.hf.loading import load_model, load_tokenizer
from base.run.outputs import write_table
from base.run.provenance import engine_settings, fingerprint

ROOT = Path(__file__).resolve().parents[1]


def js_divergence(p_E: torch.Tensor, q_E: torch.Tensor) -> float:
    m_E = (p_E + q_E) / 2
    kl = lambda a, b: float((a * (a.clamp_min(1e-12) / b.clamp_min(1e-12)).log()).sum())
    return (kl(p_E, m_E) + kl(q_E, m_E)) / 2


def load_domains(task_dir: Path) -> dict[str, list[dict]]:
    return {p.stem: [json.loads(x) for x in p.read_text().splitlines() if x]
            for p in sorted(task_dir.glob("*.jsonl"))}


@torch.no_grad()
def histograms(model, tok, layers, examples: list[dict], batch: int = 32) -> torch.Tensor:
    """hist_LE: fraction of the domain's top-k choices that go to each expert, per layer."""
    E = layers[0].num_experts
    counts_LE = torch.zeros(len(layers), E)
    mask_T: list[torch.Tensor] = []

    def hook(layer, module, args, out):
        idx_TK = out[2]
        counts_LE[layer.index] += torch.bincount(idx_TK[mask_T[0]].reshape(-1).cpu(), minlength=E).float()

    handles = [ly.router.register_forward_hook(lambda m, a, o, ly=ly: hook(ly, m, a, o)) for ly in layers]
    try:
        for i in range(0, len(examples), batch):
            texts = [e["prompt"] + e["answer"] for e in examples[i:i + batch]]
            enc = tok(texts, return_tensors="pt", padding=True)
            mask_T[:] = [enc["attention_mask"].reshape(-1).bool()]
            model(**enc)
    finally:
        for h in handles:
            h.remove()
    return counts_LE / counts_LE.sum(-1, keepdim=True)


@torch.no_grad()
def decode_union(model, tok, family: str, prompts: list[str], max_new: int) -> list[float]:
    """Mean dense union per MoE layer over the decode steps of one batch."""
    budget = install_budget(model, family, None, BudgetOptions(budget=None))
    try:
        enc = tok(prompts, return_tensors="pt", padding=True)
        budgeted_generate(model, budget, enc["input_ids"], enc["attention_mask"], (tok.pad_token_id,),
                          max_new_tokens=max_new, do_sample=False, pad_token_id=tok.pad_token_id)
        df = pd.DataFrame([r for r in budget.stats_rows() if r["decode"]])
    finally:
        budget.remove()
    return df.groupby("layer")["union"].mean().tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mini")
    ap.add_argument("--tasks", default="tasks/mini")
    ap.add_argument("--examples", type=int, default=64, help="per domain, for the histograms")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--batches", type=int, default=4, help="decode batches per batch kind")
    ap.add_argument("--max-new", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="outputs/specialisation")
    args = ap.parse_args()

    cfg = ModelConfig(**yaml.safe_load((ROOT / "conf/model" / f"{args.model}.yaml").read_text()))
    model, tok = load_model(cfg, ROOT, seed=args.seed), load_tokenizer(cfg, ROOT)
    layers = find_moe_layers(model)
    domains = load_domains(ROOT / args.tasks)
    names = list(domains)

    hist = {d: histograms(model, tok, layers, ex[: args.examples]) for d, ex in domains.items()}
    js_rows = []
    for li in range(len(layers)):
        pairs = [js_divergence(hist[a][li], hist[b][li]) for a, b in itertools.combinations(names, 2)]
        js_rows.append({"layer": li, "js_mean": sum(pairs) / len(pairs), "js_min": min(pairs), "js_max": max(pairs)})

    rng = random.Random(args.seed)
    bs, n = args.batch_size, args.batches
    union_rows = []
    pool = [e["prompt"] for ex in domains.values() for e in ex]
    for b in range(n):
        for li, u in enumerate(decode_union(model, tok, cfg.family, rng.sample(pool, bs), args.max_new)):
            union_rows.append({"batch": "mixed", "rep": b, "layer": li, "union": u})
    for d, ex in domains.items():
        for b in range(n):
            prompts = [e["prompt"] for e in rng.sample(ex, bs)]
            for li, u in enumerate(decode_union(model, tok, cfg.family, prompts, args.max_new)):
                union_rows.append({"batch": d, "rep": b, "layer": li, "union": u})
    union = pd.DataFrame(union_rows)
    union["kind"] = union["batch"].where(union["batch"] == "mixed", "single")
    by_layer = union.groupby(["layer", "kind"])["union"].mean().unstack().reset_index()

    out = ROOT / args.out if not Path(args.out).is_absolute() else Path(args.out)
    from analysis.engines import DENSE_FORWARD, with_engine

    decoded = fingerprint(engine_settings(None, next(model.parameters()).device.type, "generate"))  # decode_union's
    write_table(out / "js.csv", with_engine(pd.DataFrame(js_rows), DENSE_FORWARD).to_dict("records"))
    write_table(out / "union.csv", with_engine(by_layer, decoded).to_dict("records"))
    write_table(out / "union_by_domain.csv", with_engine(union.groupby(["batch", "layer"])["union"].mean().reset_index(),
                                                         decoded).to_dict("records"))
    report = {"model": args.model, "experts": layers[0].num_experts, "top_k": layers[0].top_k,
              "batch_size": bs, "domains": names, "js_mean": sum(r["js_mean"] for r in js_rows) / len(js_rows),
              "union_mixed": float(by_layer["mixed"].mean()), "union_single": float(by_layer["single"].mean())}
    atomic_write_text(out / "report.json", json.dumps(report, indent=2))
    print(pd.DataFrame(js_rows).round(3).to_string(index=False))
    print(by_layer.round(2).to_string(index=False))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
