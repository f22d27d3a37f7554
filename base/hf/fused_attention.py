"""The decode step's attention in one launch after the q/k/v GEMM: q/k norm, rotary, the K/V write
and the attention (kernels/attention.py's fused form) instead of the four to five launches a
compiled attention half makes of them.

    fused = FusedAttention(model)   # every qualifying attention module becomes a FusedDecodeAttention
    ...                             # decode steps inside the engine take the fused path
    fused.remove()                  # the original modules again

Why: in the compiled attention half Inductor emits the q/k norm and the rotary with the cache
write as kernels of their own beside the decode attention (a custom op): by their place in the
profile a persistent reduction and a point-wise kernel, 1.8 and 1.2 µs a layer on an H200 plus
their boundaries, for a few kilobytes each (results/roofline/grid_2026-12-02f/final/
summary_kernels.csv); here all of it is one launch. The engine applies this under
`throughput.fused_attention=true` (off by default: not yet timed on a GPU).

Owned, not hooked: `FusedDecodeAttention` holds the model's attention module as `inner` and uses
its projections, norms and cache buffers (base/hf/attention.py's StaticKV puts them on `inner`).
It takes the fused path only for one query token inside the engine with the cache allocated (not a
packed forward nor an arrivals' prefill) and a rotary of the full head size; anything else
(prefill, generate outside the engine) runs `inner` as it is. On a CPU the op runs its PyTorch
reference (the same ops, in the same order, as the unfused path).

Which modules qualify (`qualifies`): separate q/k/v/o projections; q/k RMSNorm per head (Qwen3) or
none (Qwen2-MoE, Mixtral); no attention sinks (GPT-OSS) and not MLA (DeepSeek). OLMoE's q/k norm
spans all heads of a token: left as it is.

Shapes: B rows, Hq query heads, K KV heads, D head size, E value head size, L cache slots.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from base.hf.attention import NAME, _allowed, last_read
from base.hf.fused_qkv import _QKV
from base.hf.skinny_proj import norm_linear


@torch.library.custom_op("base_moe::fused_decode_attention", mutates_args=("k_cache_BKLD", "v_cache_BKLE"))
def _fused_op(q_BHD: Tensor, k_BKD: Tensor, v_BKE: Tensor, cos_BD: Tensor, sin_BD: Tensor, pos_B: Tensor,
              q_norm_D: Tensor | None, k_norm_D: Tensor | None, eps: float, k_cache_BKLD: Tensor,
              v_cache_BKLE: Tensor, allowed_BL: Tensor, last_1: Tensor, scaling: float) -> Tensor:
    """kernels/attention.py's fused form on a GPU, its reference elsewhere; declares the caches
    mutated, so a compiled region keeps the write in place."""
    from kernels.attention import (
        NewToken,
        fused_decode_attention,
        fused_decode_attention_reference,
    )

    new = NewToken(k_BKD, v_BKE, cos_BD, sin_BD, pos_B, q_norm_D, k_norm_D, eps)
    if q_BHD.is_cuda:
        return fused_decode_attention(q_BHD, new, k_cache_BKLD, v_cache_BKLE, allowed_BL, last_1, scaling)
    return fused_decode_attention_reference(q_BHD, new, k_cache_BKLD, v_cache_BKLE, allowed_BL,
                                            int(last_1.max()), scaling)


@_fused_op.register_fake
def _(q_BHD, k_BKD, v_BKE, cos_BD, sin_BD, pos_B, q_norm_D, k_norm_D, eps, k_cache_BKLD, v_cache_BKLE, allowed_BL,
      last_1, scaling):
    return q_BHD.new_empty(q_BHD.shape[0], q_BHD.shape[1], v_cache_BKLE.shape[-1])


def _rms_norm(norm: nn.Module | None, size: int) -> bool:
    """A transformers RMSNorm over `size` values (weight (size,), `variance_epsilon`): a head's D for the
    q/k norms, the hidden size for a layer's input norm."""
    weight = getattr(norm, "weight", None)
    return weight is not None and tuple(weight.shape) == (size,) and hasattr(norm, "variance_epsilon")


def qualifies(module: nn.Module) -> bool:
    """Whether `module` is an attention whose decode step the fused form computes (module doc)."""
    if not all(isinstance(getattr(module, f"{p}_proj", None), nn.Module) for p in "qkvo"):
        return False
    D = getattr(module, "head_dim", None)
    if not isinstance(D, int) or D % 2 or getattr(module, "sinks", None) is not None:
        return False
    q_norm, k_norm = getattr(module, "q_norm", None), getattr(module, "k_norm", None)
    if q_norm is None and k_norm is None:
        return True
    return _rms_norm(q_norm, D) and _rms_norm(k_norm, D)


class FusedDecodeAttention(nn.Module):
    """The model's attention module (`inner`), its decode step through the fused op. With
    `fold_input_norm`, the compiled attention half (base/runtime/regional.py) hands it the layer's
    input RMSNorm (`input_norm`) with the un-normed hidden states, and the decode step computes the
    norm inside the q/k/v GEMM (base/hf/skinny_proj.py's `norm_linear`); any other forward applies
    the norm first."""

    def __init__(self, inner: nn.Module, fold_input_norm: bool = False) -> None:
        super().__init__()
        self.inner = inner
        self.norm = getattr(inner, "q_norm", None) is not None
        self.folds_input_norm = fold_input_norm

    def _fusable(self, hidden_BQH: Tensor, position_embeddings, attention_mask) -> bool:
        inner = self.inner
        return (hidden_BQH.shape[1] == 1 and position_embeddings is not None
                and position_embeddings[0].shape[-1] == inner.head_dim
                and isinstance(attention_mask, Tensor) and attention_mask.dtype == torch.bool
                and inner.config._attn_implementation == NAME and hasattr(inner, "base_k_cache")
                and getattr(inner, "base_packed", None) is None and getattr(inner, "base_write_rows", None) is None)

    def forward(self, hidden_states: Tensor, position_embeddings: tuple[Tensor, Tensor] | None = None,
                attention_mask: Tensor | None = None, input_norm: nn.Module | None = None,
                **kwargs) -> tuple[Tensor, None]:
        inner = self.inner
        # the fold computes transformers' RMSNorm from its weight and epsilon (any other norm: applied first)
        fold = (input_norm is not None and isinstance(inner.q_proj, _QKV)
                and _rms_norm(input_norm, hidden_states.shape[-1]))
        if not self._fusable(hidden_states, position_embeddings, attention_mask) or (input_norm is not None and not fold):
            x = hidden_states if input_norm is None else input_norm(hidden_states)
            return inner(x, position_embeddings=position_embeddings, attention_mask=attention_mask, **kwargs)
        B, D = hidden_states.shape[0], inner.head_dim
        if fold:  # the input norm inside the q/k/v GEMM
            qkv = inner.q_proj
            q, k, v = norm_linear(hidden_states, input_norm, qkv.weight, qkv.bias).split(qkv.sizes, dim=-1)
        else:  # q before k and v: base/hf/fused_qkv.py's q_proj computes all three
            q, k, v = inner.q_proj(hidden_states), inner.k_proj(hidden_states), inner.v_proj(hidden_states)
        k_BKD = k.view(B, -1, D)
        pos = inner.base_write_pos  # (1,) one slot for every row, or (B, 1) one per row
        allowed_BL = _allowed(attention_mask, pos, getattr(inner, "sliding_window", None))[:, 0, 0]
        cos_BD, sin_BD = (x.reshape(-1, D) for x in position_embeddings)  # (B, 1, D), or (1, 1, D) shared
        q_w, k_w, eps = ((inner.q_norm.weight, inner.k_norm.weight, inner.q_norm.variance_epsilon) if self.norm
                         else (None, None, 1e-6))
        out_BHE = _fused_op(q.view(B, -1, D), k_BKD, v.view(B, k_BKD.shape[1], -1), cos_BD, sin_BD,
                            pos[:, 0] if pos.dim() == 2 else pos, q_w, k_w, eps, inner.base_k_cache,
                            inner.base_v_cache, allowed_BL, last_read(inner), inner.scaling)
        return inner.o_proj(out_BHE.reshape(B, 1, -1)), None


class FusedAttention:
    """Every qualifying attention module of `model` wrapped in a FusedDecodeAttention until `remove()`;
    `fold_input_norm`: each also takes its layer's input norm into the q/k/v GEMM (see the class)."""

    def __init__(self, model: nn.Module, fold_input_norm: bool = False) -> None:
        self.swapped: list[tuple[nn.Module, str, nn.Module]] = []
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if name == "self_attn" and qualifies(child):
                    setattr(parent, name, FusedDecodeAttention(child, fold_input_norm))
                    self.swapped.append((parent, name, child))

    @property
    def layers(self) -> int:
        return len(self.swapped)

    def remove(self) -> None:
        for parent, name, child in self.swapped:
            setattr(parent, name, child)
        self.swapped = []
