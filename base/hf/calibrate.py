"""Calibration: run the dense model over text and record, per MoE layer, what the router and the
experts do (base/method/calibration.py holds the statistics).

Shapes: N calibration tokens, H hidden, E experts, K top-k, L MoE layers.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn
from base.config import CalibConfig
from base.hf.families import MoeLayer
from base.hf.moe_block import expert_norms_TK
from base.method.calibration import Calibration, LayerCalib
from base.progress import progress


def read_texts(files: list[Path]) -> str:
    """Concatenate local .txt files and the "text" field of .jsonl files (every row an object with a
    "text" string; ValueError naming the line otherwise)."""
    parts = []
    for path in files:
        if not path.exists():
            raise FileNotFoundError(f"calibration file {path} does not exist")
        if path.suffix == ".jsonl":
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if line.strip():
                    row = json.loads(line)
                    if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                        what = "an object without a \"text\" string" if isinstance(row, dict) else \
                            f"a JSON {type(row).__name__}, not an object with a \"text\" string"
                        raise ValueError(f"line {number} is {what}")
                    parts.append(row["text"])
        else:
            parts.append(path.read_text())
    return "".join(p if p.endswith("\n") else p + "\n" for p in parts)


def token_batches(tokenizer, text: str, cfg: CalibConfig) -> list[Tensor]:
    """Fixed-length windows of the token stream (no padding), `batch_size` windows per batch."""
    # verbose=False: the whole stream is longer than the model's context on purpose (it is cut into
    # seq_len windows below); transformers would warn "Token indices sequence length is longer".
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    n_seq = max(1, min(cfg.num_tokens, len(ids)) // cfg.seq_len)
    if len(ids) < cfg.seq_len:
        raise ValueError(f"calibration text has {len(ids)} tokens, fewer than seq_len={cfg.seq_len}")
    windows = torch.tensor(ids[: n_seq * cfg.seq_len]).reshape(n_seq, cfg.seq_len)
    return list(windows.split(cfg.batch_size))


@torch.no_grad()
def calibrate(model: nn.Module, layers: list[MoeLayer], batches: list[Tensor], cfg: CalibConfig, meta: dict) -> Calibration:
    store: dict[int, dict[str, list[Tensor]]] = {lyr.index: {k: [] for k in vars(LayerCalib(*[None] * 5))} for lyr in layers}

    def hook(layer: MoeLayer, module: nn.Module, args: tuple, output: tuple) -> None:
        _, w_TK, idx_TK = output
        z_TH = args[0].reshape(-1, args[0].shape[-1])
        rec = store[layer.index]
        rec["z_NH"].append(z_TH.to(torch.float16).cpu())
        rec["idx_NK"].append(idx_TK.cpu())
        rec["w_NK"].append(w_TK.float().cpu())
        rec["norms_NK"].append(expert_norms_TK(layer.experts, z_TH, idx_TK).cpu())
        if cfg.all_experts:
            T, E = z_TH.shape[0], layer.num_experts
            all_TE = torch.arange(E, device=z_TH.device).expand(T, E)
            rec["norms_NE"].append(expert_norms_TK(layer.experts, z_TH, all_TE).cpu())

    handles = [
        lyr.router.register_forward_hook(lambda m, a, o, lyr=lyr: hook(lyr, m, a, o)) for lyr in layers
    ]
    device = next(model.parameters()).device
    try:
        for ids in progress(batches, desc="calibrate", unit="batch"):
            model(input_ids=ids.to(device), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    out = []
    for lyr in layers:
        rec = store[lyr.index]
        out.append(LayerCalib(**{k: (torch.cat(v) if v else None) for k, v in rec.items()}))
    meta = {**meta, "num_layers": len(layers), "num_experts": layers[0].num_experts,
            "top_k": layers[0].top_k, "num_tokens": int(out[0].z_NH.shape[0]), "hidden": int(out[0].z_NH.shape[1])}
    return Calibration(out, meta)
