"""Routing realism: how concentrated an embedded model's routing is, per MoE layer, on the decode
tokens of its offline tasks. Large MoE models (the BASE paper's Qwen3-30B-A3B) spread a token's
weight over several experts and a batch over most of the pool; a model whose first choices carry
almost all the weight makes "keep each token's first choice" (`oea` k0=1) nearly free.

    OMP_NUM_THREADS=1 python -m experiments.routing_stats --model models/mini models/mini_olmoe --out results/routing

Decode tokens are taken by teacher forcing each held-out prompt + its reference answer (tasks/mini,
1600 prompts, domains mixed in a `--seed` shuffle, as `eval.order=mixed` batches them): decode
step j of a request feeds answer character j, for j < len(answer), whose output is the next
character or the "\\n" stop. A decode batch of B is B consecutive requests of the shuffle; at step j
only its requests still decoding count (finished requests never do, as in base/).
Reference answers equal the greedy ones where the model is right (mini: 0.997).

Per model and MoE layer (mean over decode tokens, or over (batch, step) pairs for batch columns):
- `first_share`: the first choice's weight over the sum of the top-k weights (1/K..1); for a
  renormalising model this is the weight itself;
- `first_prob`: the first choice's router softmax probability (over all E experts);
- `entropy`: entropy of the router softmax over E experts, nats; `entropy_frac` = entropy / ln E
  (1 = uniform over the pool);
- `active_16`: requests still decoding per step of a decode batch of 16 (the tokens the next two
  columns pool);
- `distinct_first_16`: distinct first choices among the active tokens of a decode batch of 16;
- `union_B`: distinct experts in the union of the active tokens' top-k, decode batch of B;
- `distinct_first_16_step0`, `union_16_step0`: the same at the first decode step only, where all
  16 requests of a batch are active.

Writes `<out>/routing_stats.csv` (one row per model and layer, plus a `mean` row per model; its last
column `engine` is `none (teacher-forced forward)`: no decode engine made these rows, analysis/engines.py)
and `<out>/routing_stats.md`, both headed by the command that made them.

Shapes: N sequences, T decode tokens, L MoE layers, E experts, K top-k, B decode batch.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor, nn

from analysis.engines import TEACHER_FORCED, with_engine
from base.hf.families import find_moe_layers

BATCH_SIZES = (1, 2, 4, 8, 16, 32)
DISTINCT_BATCH = 16
TASKS_DIR = Path(__file__).resolve().parents[1] / "tasks" / "mini"


@dataclass
class Request:
    domain: str
    prompt: str
    answer: str


@dataclass
class DecodeRouting:
    """Routing of every request's decode tokens, flattened in request order.

    `seq_T[t]` is the request and `step_T[t]` the decode step of token t.
    """

    topk_idx_LTK: Tensor  # experts chosen, best first
    topk_w_LTK: Tensor  # the weights the model applies to them
    first_prob_LT: Tensor  # router softmax probability of the first choice
    entropy_LT: Tensor  # entropy of the router softmax, nats
    seq_T: Tensor
    step_T: Tensor
    num_experts: int


def load_requests(tasks_dir: Path = TASKS_DIR, seed: int = 0) -> list[Request]:
    """Every test prompt of the offline tasks, domains mixed by a seeded shuffle."""
    files = sorted(tasks_dir.glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(f"no <task>.jsonl in {tasks_dir}")
    reqs = [Request(r["domain"], r["prompt"], r["answer"]) for f in files for r in map(json.loads, f.open())]
    random.Random(seed).shuffle(reqs)
    return reqs


class RouterTap:
    """Forward hooks on each MoE layer's router, keeping (logits, top-k weights, top-k ids)."""

    def __init__(self, model: nn.Module):
        self.layers = find_moe_layers(model)
        self.out: list[tuple[Tensor, Tensor, Tensor] | None] = [None] * len(self.layers)
        self.handles = [
            layer.router.register_forward_hook(self._hook(i)) for i, layer in enumerate(self.layers)
        ]

    def _hook(self, i: int):
        def hook(module, args, output):
            logits, weights, idx = output[:3]
            self.out[i] = (logits.detach(), weights.detach(), idx.detach())

        return hook

    def close(self) -> None:
        for h in self.handles:
            h.remove()


@torch.no_grad()
def decode_routing(model: nn.Module, tok, requests: list[Request], chunk: int = 128) -> DecodeRouting:
    """Teacher-force prompt + answer and keep the router outputs at the decode positions."""
    device = next(model.parameters()).device
    tap = RouterTap(model)
    parts: list[tuple] = []
    try:
        for start in range(0, len(requests), chunk):
            reqs = requests[start : start + chunk]
            prompt_ids = [tok(r.prompt, add_special_tokens=False).input_ids for r in reqs]
            ans_ids = [tok(r.answer, add_special_tokens=False).input_ids for r in reqs]
            rows = [p + a for p, a in zip(prompt_ids, ans_ids)]
            S = max(map(len, rows))
            ids_NS = torch.full((len(rows), S), tok.pad_token_id, dtype=torch.long)
            mask_NS = torch.zeros((len(rows), S), dtype=torch.long)
            dec_NS = torch.zeros((len(rows), S), dtype=torch.bool)  # decode positions
            step_NS = torch.zeros((len(rows), S), dtype=torch.long)
            for n, (p, a) in enumerate(zip(prompt_ids, ans_ids)):
                ids_NS[n, : len(p) + len(a)] = torch.tensor(p + a)
                mask_NS[n, : len(p) + len(a)] = 1
                # Why: the last prompt token is prefill; step j feeds answer token j.
                dec_NS[n, len(p) : len(p) + len(a)] = True
                step_NS[n, len(p) : len(p) + len(a)] = torch.arange(len(a))
            model(input_ids=ids_NS.to(device), attention_mask=mask_NS.to(device), use_cache=False)
            dec_flat = dec_NS.reshape(-1).to(device)
            per_layer = []
            for logits, weights, idx in tap.out:
                logits_TE = logits.reshape(-1, logits.shape[-1])[dec_flat].float()
                probs_TE = torch.softmax(logits_TE, dim=-1)
                idx_TK = idx.reshape(-1, idx.shape[-1])[dec_flat]
                w_TK = weights.reshape(-1, weights.shape[-1])[dec_flat].float()
                # Why sort: a router may return its top-k in any order; first = largest weight.
                w_TK, order_TK = w_TK.sort(dim=-1, descending=True)
                idx_TK = idx_TK.gather(-1, order_TK)
                first_prob_T = probs_TE.gather(-1, idx_TK[:, :1]).squeeze(-1)
                entropy_T = -(probs_TE * probs_TE.clamp_min(1e-30).log()).sum(-1)
                per_layer.append((idx_TK.cpu(), w_TK.cpu(), first_prob_T.cpu(), entropy_T.cpu()))
            seq_NS = (torch.arange(len(rows)) + start)[:, None].expand(-1, S)
            parts.append((per_layer, seq_NS[dec_NS], step_NS[dec_NS]))
    finally:
        tap.close()
    num_layers = len(tap.layers)
    cat = lambda j: torch.stack([torch.cat([p[0][layer][j] for p in parts]) for layer in range(num_layers)])
    return DecodeRouting(
        topk_idx_LTK=cat(0),
        topk_w_LTK=cat(1),
        first_prob_LT=cat(2),
        entropy_LT=cat(3),
        seq_T=torch.cat([p[1] for p in parts]),
        step_T=torch.cat([p[2] for p in parts]),
        num_experts=tap.layers[0].num_experts,
    )


def _groups(r: DecodeRouting, batch_size: int) -> tuple[Tensor, Tensor, int]:
    """(kept tokens mask_T, group index of each kept token, group count) for (batch, step) pairs."""
    num_seqs = int(r.seq_T.max()) + 1
    full = num_seqs // batch_size * batch_size
    if full == 0:
        raise ValueError(f"decode batch {batch_size} needs at least {batch_size} requests, got {num_seqs}")
    keep_T = r.seq_T < full
    group_T = (r.seq_T[keep_T] // batch_size) * (int(r.step_T.max()) + 1) + r.step_T[keep_T]
    groups_G, inverse_T = torch.unique(group_T, return_inverse=True)
    return keep_T, inverse_T, len(groups_G)


def active_tokens(r: DecodeRouting, batch_size: int) -> Tensor:
    """Active (still decoding) requests per (decode batch, step): count_G."""
    _, inverse_T, num_groups = _groups(r, batch_size)
    return torch.bincount(inverse_T, minlength=num_groups)


def batch_counts(r: DecodeRouting, batch_size: int, first_only: bool = False) -> Tensor:
    """Distinct experts per (decode batch, step) for consecutive batches of `batch_size` requests.

    Returns counts_LG over the G (batch, step) pairs with at least one active token; requests
    beyond the last full batch are left out. first_only: only each token's first choice counts.
    """
    keep_T, inverse_T, num_groups = _groups(r, batch_size)
    idx_LTK = r.topk_idx_LTK[:, keep_T, :1] if first_only else r.topk_idx_LTK[:, keep_T]
    L, _, K = idx_LTK.shape
    hit_LGE = torch.zeros(L, num_groups, r.num_experts, dtype=torch.bool)
    g_LTK = inverse_T[None, :, None].expand(L, -1, K)
    hit_LGE.view(L, -1).scatter_(1, (g_LTK * r.num_experts + idx_LTK).reshape(L, -1), True)
    return hit_LGE.sum(-1)


def at_step(r: DecodeRouting, step: int) -> DecodeRouting:
    """Only the tokens of decode step `step` (at step 0 every request of a batch is active)."""
    keep_T = r.step_T == step
    return DecodeRouting(r.topk_idx_LTK[:, keep_T], r.topk_w_LTK[:, keep_T], r.first_prob_LT[:, keep_T],
                         r.entropy_LT[:, keep_T], r.seq_T[keep_T], r.step_T[keep_T], r.num_experts)


def layer_table(r: DecodeRouting, batch_sizes: tuple[int, ...] = BATCH_SIZES) -> pd.DataFrame:
    """One row per MoE layer: the statistics of the module docstring."""
    w_LTK = r.topk_w_LTK
    top_k = w_LTK.shape[-1]
    table = {
        "layer": list(range(w_LTK.shape[0])),
        "experts": r.num_experts,
        "top_k": top_k,
        "decode_tokens": w_LTK.shape[1],
        "first_share": (w_LTK[..., 0] / w_LTK.sum(-1)).mean(1).tolist(),
        "first_prob": r.first_prob_LT.mean(1).tolist(),
        "entropy": r.entropy_LT.mean(1).tolist(),
        "entropy_frac": (r.entropy_LT.mean(1) / math.log(r.num_experts)).tolist(),
        f"active_{DISTINCT_BATCH}": active_tokens(r, DISTINCT_BATCH).float().mean().item(),
        f"distinct_first_{DISTINCT_BATCH}": batch_counts(r, DISTINCT_BATCH, first_only=True).float().mean(1).tolist(),
    }
    for b in batch_sizes:
        table[f"union_{b}"] = batch_counts(r, b).float().mean(1).tolist()
    # Why step 0: answers are short, so later steps pool fewer tokens; at step 0 all B decode.
    first = at_step(r, 0)
    table[f"distinct_first_{DISTINCT_BATCH}_step0"] = batch_counts(first, DISTINCT_BATCH, True).float().mean(1).tolist()
    table[f"union_{DISTINCT_BATCH}_step0"] = batch_counts(first, DISTINCT_BATCH).float().mean(1).tolist()
    return pd.DataFrame(table)


def model_table(name: str, model: nn.Module, tok, requests: list[Request]) -> pd.DataFrame:
    """Per-layer rows and a `mean` row (mean over layers) for one model."""
    layers = layer_table(decode_routing(model, tok, requests))
    mean = layers.drop(columns="layer").mean().to_frame().T
    mean.insert(0, "layer", "mean")
    df = pd.concat([layers.astype({"layer": object}), mean], ignore_index=True)
    df = df.astype({"experts": int, "top_k": int, "decode_tokens": int})
    df.insert(0, "model", name)
    return df


def load(path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not Path(path).is_dir():
        raise FileNotFoundError(f"--model {path}: not a directory with a checkpoint (e.g. models/mini)")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


def write(df: pd.DataFrame, out: Path, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rounded = df.round(4)
    with open(out / "routing_stats.csv", "w") as f:
        f.write(f"# {command}\n")
        with_engine(rounded, TEACHER_FORCED).to_csv(f, index=False)
    means = rounded[rounded["layer"] == "mean"].drop(columns=["layer", "decode_tokens"])
    md = [
        ("Routing on decode tokens of tasks/mini (mean over layers; per layer in routing_stats.csv). "
         f"Engine: {TEACHER_FORCED} (no decode engine: reference answers fed token by token).\n"),
        f"`{command}`\n",
        means.to_markdown(index=False, floatfmt=".3f"),
        "",
        rounded.drop(columns=["decode_tokens"]).to_markdown(index=False, floatfmt=".3f"),
        "",
    ]
    (out / "routing_stats.md").write_text("\n".join(md))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", nargs="+", default=["models/mini"], help="checkpoint directories")
    ap.add_argument("--out", default="results/routing")
    ap.add_argument("--seed", type=int, default=0, help="mixing order of the requests")
    ap.add_argument("--tasks", default=str(TASKS_DIR), help="directory of <task>.jsonl test sets")
    args = ap.parse_args(argv)
    for path in args.model:
        if not Path(path).is_dir():
            ap.error(f"--model {path}: not a directory; give checkpoint folders such as models/mini")
    requests = load_requests(Path(args.tasks), args.seed)
    frames = []
    for path in args.model:
        model, tok = load(path)
        frames.append(model_table(Path(path).name, model, tok, requests))
        print(frames[-1].round(3).to_string(index=False), flush=True)
    command = "python -m experiments.routing_stats " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    write(pd.concat(frames, ignore_index=True), Path(args.out), command)
    print(f"wrote {args.out}/routing_stats.csv and .md")


if __name__ == "__main__":
    main()
