"""Train an embedded model on the eight synthetic domains, save it in Hugging Face format, then
measure dense greedy exact match on the held-out test sets. `--family qwen3_moe` (default) is
`models/mini`; `--family olmoe` with `--num-experts/--top-k/--expert-width` is `models/mini_olmoe`
(`model_config.py`).

CPU smoke (a minute):
    python -m experiments.mini.train --device cpu --steps 20 --batch-size 32 --n-train 2000 --out /tmp/mini_smoke
GPU (the shipped checkpoint; stops on the wall-clock budget, then saves and evaluates):
    python -m experiments.mini.train --device cuda --time-budget-s 400 --out models/mini
The OLMoE-shaped model (CPU, one thread; the command in models/mini_olmoe/metrics.json is exact):
    OMP_NUM_THREADS=1 python -m experiments.mini.train --device cpu --family olmoe --num-experts 32 \
        --top-k 8 --expert-width 48 --aux-coef 0.05 --time-budget-s 2100 --out models/mini_olmoe

Writes to --out: config.json, generation_config.json, model.safetensors (bf16), tokenizer files,
train_log.csv and metrics.json.

Shapes: B batch, S positions (longest training text), N corpus size, V vocab.
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import math
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import transformers
from torch import Tensor
from transformers import AutoModelForCausalLM, GenerationConfig

from experiments.mini.data import TEST_SEED, TRAIN_SEED, Sample, check_disjoint, make_split
from experiments.mini.evaluate import evaluate_all, routing_stats, stop_token_ids
from experiments.mini.losses import answer_ce, load_balancing_loss
from experiments.mini.model_config import FAMILIES, MiniModelConfig
from experiments.mini.tokenizer import build_tokenizer, char_table, encode_flat


@dataclass
class TrainConfig:
    out: str
    device: str = "cuda"
    steps: int = 1_000_000  # upper bound; --time-budget-s usually ends training first
    time_budget_s: float = 1e9
    batch_size: int = 512
    n_train: int = 200_000  # per domain
    n_test: int = 200  # per domain
    lr: float = 2e-3
    min_lr_frac: float = 0.05
    warmup_steps: int = 200
    weight_decay: float = 0.1
    # On a balance loss normalised to 1.0 (see losses.py). 0.02 balanced the experts almost perfectly
    # but left routing only weakly domain-specific; smaller keeps all experts used and lets them specialise.
    aux_coef: float = 0.005
    grad_clip: float = 1.0
    seed: int = 0  # the initialisation and batch order
    # the training corpus's stream (TRAIN_SEED + data_seed); -1: `seed` (as before). The held-out
    # prompt pools (make_pools.py) exclude the corpus of data_seed 0, so a model evaluated on them
    # must train on it: other data seeds draw other examples, which may be pool prompts.
    data_seed: int = -1
    experts_impl: str = "auto"  # auto | eager | grouped_mm | batched_mm
    log_every: int = 25
    eval_every_s: float = 60.0
    save_every_s: float = 120.0
    # Why: the GPU machine returns files of at most 16 MiB; "12MB" splits the 22.7 MB checkpoint
    # in two shards there (merge locally with `python -m experiments.mini.merge_shards`).
    max_shard_size: str = "50GB"
    save_tokenizer: int = 1  # 0: skip the tokenizer files (rebuilt in code) to save returned files
    # The model (model_config.py); 0 keeps MiniModelConfig's default.
    family: str = "qwen3_moe"  # qwen3_moe | olmoe
    num_experts: int = 0
    top_k: int = 0
    expert_width: int = 0
    hidden_size: int = 0
    layers: int = 0
    heads: int = 0  # query heads; olmoe: as many KV heads (multi-head attention, as OLMoE-1B-7B)

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device=cuda but torch sees no GPU; use --device cpu")
        if self.family not in FAMILIES:
            raise ValueError(f"family={self.family!r}; choose one of {', '.join(FAMILIES)}")
        if self.experts_impl not in ("auto", "eager", "grouped_mm", "batched_mm"):
            raise ValueError(f"unknown experts_impl {self.experts_impl}")


def model_config(cfg: TrainConfig) -> MiniModelConfig:
    """MiniModelConfig of the family, with the sizes the command line overrides."""
    sizes = {
        "num_experts": cfg.num_experts,
        "num_experts_per_tok": cfg.top_k,
        "moe_intermediate_size": cfg.expert_width,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads,
    }
    sizes = {k: v for k, v in sizes.items() if v}
    if cfg.family == "olmoe":
        heads = sizes.get("num_attention_heads", MiniModelConfig.num_attention_heads)
        sizes |= {"num_key_value_heads": heads, "head_dim": sizes.get("hidden_size", MiniModelConfig.hidden_size) // heads}
    return MiniModelConfig(family=cfg.family, **sizes)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def tokenize_corpus(samples: list[Sample], tok, device: str) -> dict[str, Tensor]:
    """Right-padded ids of `text + EOS` with masks: `loss_NS` marks answer/stop/EOS targets."""
    ids_C, text_len_N = encode_flat([s.text for s in samples], char_table(tok))
    n, len_N = len(samples), torch.from_numpy(text_len_N) + 1  # +1 for EOS
    S = int(len_N.max())
    ids_NS = torch.full((n, S), tok.pad_token_id, dtype=torch.long)
    # Scatter the flat ids into rows: character c of text i goes to (i, c - start_i).
    row_C = torch.repeat_interleave(torch.arange(n), torch.from_numpy(text_len_N))
    start_N = torch.cumsum(torch.from_numpy(text_len_N), 0) - torch.from_numpy(text_len_N)
    col_C = torch.arange(len(ids_C)) - start_N[row_C]
    ids_NS[row_C, col_C] = torch.from_numpy(ids_C)
    ids_NS[torch.arange(n), len_N - 1] = tok.eos_token_id
    prompt_len_N = torch.tensor([len(s.prompt) for s in samples])
    pos_S = torch.arange(S)
    token_NS = pos_S[None] < len_N[:, None]
    loss_NS = token_NS & (pos_S[None] >= prompt_len_N[:, None])
    return {"ids": ids_NS.to(device), "token": token_NS.to(device), "loss": loss_NS.to(device)}


def lr_at(cfg: TrainConfig, step: int, progress: float) -> float:
    """Linear warmup, then cosine over `progress` in [0, 1] (steps or wall-clock, whichever is further)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * cos)


def train_step_loss(model, batch: dict[str, Tensor], cfg: TrainConfig) -> tuple[Tensor, Tensor, Tensor]:
    with torch.autocast(device_type=cfg.device, dtype=torch.bfloat16, enabled=cfg.device == "cuda"):
        # Why no attention_mask: padding is on the right, so causal attention never lets a real
        # token see a pad, and SDPA can take its fused causal path.
        out = model(input_ids=batch["ids"], output_router_logits=True, use_cache=False)
    ce = answer_ce(out.logits, batch["ids"], batch["loss"])
    aux = load_balancing_loss(out.router_logits, batch["token"], model.config.num_experts_per_tok)
    return ce + cfg.aux_coef * aux, ce, aux


def pick_experts_impl(model, batch: dict[str, Tensor], cfg: TrainConfig) -> dict:
    """Time forward+backward of each candidate on a throwaway copy; keep the fastest that runs."""
    if cfg.experts_impl != "auto":
        model.set_experts_implementation(cfg.experts_impl)
        return {"chosen": cfg.experts_impl}
    candidates = ["grouped_mm", "eager"] if cfg.device == "cuda" else ["eager", "grouped_mm"]
    timings: dict[str, float | str] = {}
    for name in candidates:
        probe = copy.deepcopy(model)
        try:
            probe.set_experts_implementation(name)
            for i in range(5):
                if i == 2:
                    sync(cfg.device)
                    t0 = time.perf_counter()
                loss, _, _ = train_step_loss(probe, batch, cfg)
                loss.backward()
            sync(cfg.device)
            timings[name] = (time.perf_counter() - t0) / 3
        except Exception as e:  # noqa: BLE001 - any failure just rules the candidate out
            timings[name] = f"failed: {type(e).__name__}: {e}"[:300]
        del probe
    ok = {k: v for k, v in timings.items() if isinstance(v, float)}
    if not ok:
        raise RuntimeError(f"no experts implementation runs: {timings}")
    chosen = min(ok, key=ok.get)
    model.set_experts_implementation(chosen)
    return {"chosen": chosen, "step_s": timings}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def quick_eval(model, tok, test_sets: dict[str, list[Sample]], n: int = 16) -> float:
    model.eval()
    acc = evaluate_all(model, tok, {d: s[:n] for d, s in test_sets.items()}, batch_size=256)["mean"]
    model.train()
    return acc


def save_checkpoint(model, tok, out: Path, cfg: TrainConfig) -> int:
    """Save bf16 weights + tokenizer + generation config; returns the directory's model bytes."""
    model_bf16 = copy.deepcopy(model).to(torch.bfloat16)
    model_bf16.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=stop_token_ids(tok),
        pad_token_id=tok.pad_token_id,
        do_sample=False,
    )
    model_bf16.save_pretrained(out, safe_serialization=True, max_shard_size=cfg.max_shard_size)
    if cfg.save_tokenizer:
        tok.save_pretrained(out)
    return sum(f.stat().st_size for f in out.glob("model*.safetensors"))


def fit_loop(model, opt, batch_at, cfg: TrainConfig, tok, test_sets: dict[str, list[Sample]], out: Path) -> dict:
    """Train until cfg.steps or cfg.time_budget_s; log to out/train_log.csv; returns the last averages."""
    model.train()
    t0, last_eval, last_save, step, tokens = time.time(), time.time(), time.time(), 0, 0
    # Why on device: reading losses every step would sync the GPU and stall the launch queue.
    sums_3 = torch.zeros(3, device=cfg.device)  # loss, ce, aux summed since the last log
    tokens_seen = torch.zeros((), dtype=torch.long, device=cfg.device)
    final_loss = final_ce = final_aux = math.nan
    with open(out / "train_log.csv", "w", newline="") as log_f:
        log = csv.writer(log_f)
        log.writerow(["step", "elapsed_s", "lr", "loss", "ce", "aux", "tokens_per_s", "eval_acc16"])
        while step < cfg.steps:
            elapsed = time.time() - t0
            progress = max(step / cfg.steps, elapsed / cfg.time_budget_s)
            if progress >= 1.0:
                break
            lr = lr_at(cfg, step, progress)
            for group in opt.param_groups:
                group["lr"] = lr
            batch = batch_at()
            loss, ce, aux = train_step_loss(model, batch, cfg)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            step += 1
            sums_3 += torch.stack([loss.detach(), ce.detach(), aux.detach()])
            tokens_seen += batch["token"].sum()
            if step % cfg.log_every == 0 or step == cfg.steps:
                n = cfg.log_every if step % cfg.log_every == 0 else step % cfg.log_every
                final_loss, final_ce, final_aux = (sums_3 / n).tolist()
                sums_3.zero_()
                tokens = int(tokens_seen)
                acc = ""
                if time.time() - last_eval > cfg.eval_every_s:
                    acc, last_eval = round(quick_eval(model, tok, test_sets), 4), time.time()
                if time.time() - last_save > cfg.save_every_s:
                    # Why: a run killed at its wall-clock limit still leaves a usable checkpoint.
                    save_checkpoint(model, tok, out, cfg)
                    last_save = time.time()
                now = time.time() - t0
                row = [step, round(now, 1), f"{lr:.3e}", round(final_loss, 5), round(final_ce, 5)]
                row += [round(final_aux, 5), int(tokens / now), acc]
                log.writerow(row)
                log_f.flush()
                print(dict(zip(["step", "t", "lr", "loss", "ce", "aux", "tok/s", "acc16"], row)), flush=True)
    return {
        "steps": step,
        "tokens": int(tokens_seen),
        "train_s": time.time() - t0,
        "loss": final_loss,
        "ce": final_ce,
        "aux": final_aux,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f, default in asdict(TrainConfig(out="", device="cpu")).items():
        ap.add_argument(f"--{f.replace('_', '-')}", type=type(default), default=default, required=f == "out")
    cfg = TrainConfig(**vars(ap.parse_args()))
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    seed_everything(cfg.seed)
    if cfg.device == "cuda":
        torch.set_float32_matmul_precision("high")

    tok = build_tokenizer()
    data_seed = cfg.seed if cfg.data_seed < 0 else cfg.data_seed
    test_sets, train = make_split(cfg.n_train, cfg.n_test, TRAIN_SEED + data_seed)
    disjoint = check_disjoint(train, test_sets)
    corpus = tokenize_corpus(train, tok, cfg.device)
    n_corpus, seq_len = corpus["ids"].shape
    print(f"corpus: {n_corpus} texts x {seq_len} positions; {disjoint}", flush=True)

    model_cfg = model_config(cfg)
    model = AutoModelForCausalLM.from_config(model_cfg.to_hf()).to(cfg.device)
    n_params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator(device="cpu").manual_seed(cfg.seed)

    def batch_at() -> dict[str, Tensor]:
        idx_B = torch.randint(n_corpus, (cfg.batch_size,), generator=gen).to(cfg.device)
        return {k: v[idx_B] for k, v in corpus.items()}

    impl = pick_experts_impl(model, batch_at(), cfg)
    print(f"params {n_params}; experts implementation {impl}", flush=True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.98),
        fused=cfg.device == "cuda",
    )

    fit = fit_loop(model, opt, batch_at, cfg, tok, test_sets, out)
    step, tokens, train_s = fit["steps"], fit["tokens"], fit["train_s"]
    final_loss, final_ce, final_aux = fit["loss"], fit["ce"], fit["aux"]

    model_bytes = save_checkpoint(model, tok, out, cfg)
    print(f"saved {out} ({model_bytes / 1e6:.2f} MB) after {step} steps, {train_s:.0f} s", flush=True)

    # Evaluate what was shipped: the bf16 checkpoint, reloaded.
    shipped = AutoModelForCausalLM.from_pretrained(out).to(cfg.device).eval()
    acc = evaluate_all(shipped, tok, test_sets)
    routing = routing_stats(shipped, tok, test_sets)
    metrics = {
        "dense_greedy_exact_match": {k: round(v, 4) for k, v in acc.items()},
        "test_examples_per_domain": cfg.n_test,
        "routing": routing,
        "final_train_loss": round(final_loss, 5),
        "final_answer_ce": round(final_ce, 5),
        "final_balance_loss": round(final_aux, 5),
        "params": n_params,
        "checkpoint_bytes": model_bytes,
        "steps": step,
        "tokens_seen": tokens,
        "train_wall_s": round(train_s, 1),
        "total_wall_s": round(time.time() - t_start, 1),
        "device": torch.cuda.get_device_name() if cfg.device == "cuda" else platform.processor() or "cpu",
        "seed": cfg.seed,
        "test_seed": TEST_SEED,
        "train_seed": TRAIN_SEED + data_seed,
        "held_out_check": disjoint,
        "experts_implementation": impl,
        "train_config": asdict(cfg),
        "command": "python -m experiments.mini.train " + " ".join(sys.argv[1:]),
        "model_config": asdict(model_cfg),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(metrics["dense_greedy_exact_match"]), json.dumps(routing["mean"]), flush=True)


if __name__ == "__main__":
    main()
