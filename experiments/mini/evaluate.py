"""Dense greedy exact-match and routing statistics of the "mini" model on held-out test sets.

Shapes: B batch, S positions, E experts, D domains, L layers.

    python -m experiments.mini.evaluate --model models/mini --n 50   # prints per-domain accuracy
"""

from __future__ import annotations

import argparse
import math

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from experiments.mini.data import STOP, Sample, make_test_sets


def stop_token_ids(tok: PreTrainedTokenizerBase) -> list[int]:
    """EOS and the "\\n" stop: generation ends at whichever comes first."""
    return [tok.eos_token_id, tok.convert_tokens_to_ids(STOP)]


@torch.no_grad()
def greedy_answers(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    prompts: list[str],
    batch_size: int = 64,
    max_new_tokens: int = 24,
) -> list[str]:
    """Batched greedy decoding with left padding; each answer is cut at the first "\\n"."""
    tok.padding_side = "left"
    device = next(model.parameters()).device
    out: list[str] = []
    for i in range(0, len(prompts), batch_size):
        enc = tok(prompts[i : i + batch_size], return_tensors="pt", padding=True).to(device)
        gen_BS = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=stop_token_ids(tok),
        )
        texts = tok.batch_decode(gen_BS[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        out.extend(t.split(STOP)[0] for t in texts)
    return out


def exact_match(
    model: PreTrainedModel, tok: PreTrainedTokenizerBase, samples: list[Sample], batch_size: int = 64
) -> float:
    preds = greedy_answers(model, tok, [s.prompt for s in samples], batch_size)
    return sum(p == s.answer for p, s in zip(preds, samples)) / len(samples)


@torch.no_grad()
def routing_stats(model: PreTrainedModel, tok: PreTrainedTokenizerBase, test_sets: dict[str, list[Sample]]) -> dict:
    """Per layer: expert load balance over all domains and how much routing depends on the domain.

    `domain_mi` is I(domain; expert) / H(domain) over the top-k assignments of every token of
    prompt + answer: 0 when routing ignores the domain, 1 when the expert identifies the domain.
    `top4_share` is the mean fraction of a domain's assignments that go to its 4 favourite experts
    (uniform routing would give 4/E).
    """
    device = next(model.parameters()).device
    top_k, num_experts = model.config.num_experts_per_tok, model.config.num_experts
    counts_LDE: torch.Tensor | None = None
    tok.padding_side = "right"
    for d, samples in enumerate(test_sets.values()):
        enc = tok([s.text for s in samples], return_tensors="pt", padding=True).to(device)
        out = model(**enc, output_router_logits=True)
        mask_N = enc["attention_mask"].reshape(-1).bool()
        if counts_LDE is None:
            counts_LDE = torch.zeros(len(out.router_logits), len(test_sets), num_experts, device=device)
        for layer, logits_NE in enumerate(out.router_logits):
            topk_NK = logits_NE[mask_N].topk(top_k, dim=-1).indices
            counts_LDE[layer, d] += torch.bincount(topk_NK.reshape(-1), minlength=num_experts).float()
    tok.padding_side = "left"
    layers = []
    for counts_DE in counts_LDE.cpu():
        joint_DE = counts_DE / counts_DE.sum()
        p_D, p_E = joint_DE.sum(1, keepdim=True), joint_DE.sum(0, keepdim=True)
        nz = joint_DE > 0
        mi = (joint_DE[nz] * (joint_DE[nz] / (p_D @ p_E)[nz]).log()).sum().item()
        h_d = -(p_D[p_D > 0] * p_D[p_D > 0].log()).sum().item()
        load_E = p_E.squeeze(0) * num_experts  # 1.0 = an even share
        share_D = (counts_DE.topk(4, dim=1).values.sum(1) / counts_DE.sum(1)).mean().item()
        layers.append(
            {
                "domain_mi": round(mi / h_d, 4) if h_d > 0 else 0.0,
                "top4_share": round(share_D, 4),
                "load_min": round(load_E.min().item(), 4),
                "load_max": round(load_E.max().item(), 4),
                "experts_below_10pct_share": int((load_E < 0.1).sum().item()),
            }
        )
    mean = {k: round(sum(l[k] for l in layers) / len(layers), 4) for k in ("domain_mi", "top4_share")}
    return {"per_layer": layers, "mean": mean, "uniform_top4_share": round(4 / num_experts, 4)}


def evaluate_all(
    model: PreTrainedModel, tok: PreTrainedTokenizerBase, test_sets: dict[str, list[Sample]], batch_size: int = 200
) -> dict[str, float]:
    acc = {d: exact_match(model, tok, samples, batch_size) for d, samples in test_sets.items()}
    acc["mean"] = sum(acc.values()) / len(acc) if acc else math.nan
    return acc


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="models/mini")
    ap.add_argument("--n", type=int, default=200, help="test examples per domain")
    args = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    tok = AutoTokenizer.from_pretrained(args.model)
    test_sets = {d: s[: args.n] for d, s in make_test_sets().items()}
    print(evaluate_all(model, tok, test_sets))
    print(routing_stats(model, tok, test_sets)["mean"])


if __name__ == "__main__":
    main()
