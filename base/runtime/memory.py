"""What a model needs in GPU memory, and how many GPUs of a size that makes (stage=describe).

    need = memory_estimate(model, hf_config, dtype, batch_sizes=[1, 16, 64], cache_len=640, gpu_gb=141)

Weights: the parameters as built (the meta device is enough), at the run's dtype. KV cache: the
decode engine's (base/hf/attention.py), which keeps every layer's keys and values for the whole
cache length (sliding-window layers too), per KV head:
    bytes = layers x batch x cache_len x kv_heads x (key size + value size) x dtype bytes
with DeepSeek's MLA stored expanded, one key and value per attention head (what its attention
module hands the cache). GPUs needed: the total over USABLE of each GPU, the rest left to the
CUDA context, the allocator and the step's transient activations; decoder layers are not split,
so a model near a multiple of a GPU can need one more.

Shapes: B batch, L cache length.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

USABLE = 0.9  # share of a GPU's memory given to weights and cache


def kv_heads_and_sizes(hf) -> tuple[int, int, int]:
    """(KV heads per layer, key size, value size) of the engine's cache for one token."""
    if getattr(hf, "kv_lora_rank", None) is not None:  # MLA: expanded per attention head
        return int(hf.num_attention_heads), int(hf.qk_nope_head_dim + hf.qk_rope_head_dim), int(hf.v_head_dim)
    heads = int(getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads)
    head_dim = int(getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)
    return heads, head_dim, head_dim


def kv_cache_bytes(hf, dtype: torch.dtype, batch: int, cache_len: int) -> int:
    heads, k, v = kv_heads_and_sizes(hf)
    return int(hf.num_hidden_layers) * batch * cache_len * heads * (k + v) * torch.finfo(dtype).bits // 8


def weight_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def memory_estimate(model: nn.Module, hf, dtype: torch.dtype, batch_sizes: list[int], cache_len: int,
                    gpu_gb: float) -> dict[str, Any]:
    """Weights, and per batch size the cache, the total and the GPUs of `gpu_gb` GB it takes."""
    weights = weight_bytes(model)
    rows = []
    for b in sorted(set(batch_sizes)):
        kv = kv_cache_bytes(hf, dtype, b, cache_len)
        total = weights + kv
        rows.append({"batch_size": b, "kv_cache_gb": kv / 1e9, "total_gb": total / 1e9,
                     "gpus_needed": max(1, math.ceil(total / (gpu_gb * 1e9 * USABLE)))})
    return {"weights_gb": weights / 1e9, "cache_len": cache_len, "gpu_gb": gpu_gb, "usable_share": USABLE,
            "fits_one_gpu": rows[0]["gpus_needed"] == 1, "by_batch": rows}
