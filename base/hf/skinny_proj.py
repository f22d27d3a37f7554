"""The attention's dense projections of a decode step on kernels/skinny.py instead of cuBLAS.

    skinny = SkinnyProjections(model)   # every o_proj (and the fused q/k/v GEMM) tries the kernel
    ...
    skinny.remove()                     # the original modules again

Why: at 16 tokens cuBLAS splits the output projection's K and adds a reduce launch (7.7 + 1.7 us
per layer of Qwen3-30B-A3B on an H200); kernels/skinny.py streams the weights once and needs no
reduce launch (see its doc). Which one runs is decided per shape by the tuned table (`skinny_launch`): a
shape where the kernel lost to cuBLAS in tools/bench_skinny.py, more than 64 rows (prefill), a
bias, or a CPU tensor keep F.linear. The engine applies this under `throughput.regions=layer_skinny`.

The kernel runs through a custom op (`base_moe::skinny_linear`), so a compiled region treats it as
one opaque launch, as it treats cuBLAS's mm.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from base.hf.fused_qkv import _QKV


@torch.library.custom_op("base_moe::skinny_linear", mutates_args=())
def _skinny_linear_op(x_TK: Tensor, w_NK: Tensor, norm_K: Tensor | None, eps: float, block_n: int, block_k: int,
                      num_stages: int, num_warps: int, split: int) -> Tensor:
    """The kernel with a launch's parameters; with norm_K, its norm form (RMSNorm(x) @ w^T)."""
    from kernels.skinny import SkinnyLaunch, skinny_linear

    return skinny_linear(x_TK, w_NK, SkinnyLaunch(block_n, block_k, num_stages, num_warps, split), norm_K, eps)


@_skinny_linear_op.register_fake
def _(x_TK, w_NK, norm_K, eps, block_n, block_k, num_stages, num_warps, split):
    return x_TK.new_empty(x_TK.shape[0], w_NK.shape[0])


def _project(x: Tensor, weight: Tensor, bias: Tensor | None, norm: nn.Module | None) -> Tensor:
    """F.linear(x or norm(x), weight, bias), on the kernel where `skinny_launch` gives a launch."""
    from kernels.skinny import skinny_launch

    N, K = weight.shape
    x_TK = x.reshape(-1, K)
    either = {"tuned_either_way": True} if norm is not None else {}  # the norm form: its launch even where it lost
    launch = None if bias is not None else skinny_launch(N, K, x_TK.shape[0], x.device, **either)
    if launch is None:
        return F.linear(x if norm is None else norm(x), weight, bias)
    norm_K, eps = (None, 0.0) if norm is None else (norm.weight, float(norm.variance_epsilon))
    y_TN = _skinny_linear_op(x_TK, weight, norm_K, eps, launch.block_n, launch.block_k, launch.num_stages,
                             launch.num_warps, launch.split)
    return y_TN.reshape(*x.shape[:-1], N)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """F.linear, on kernels/skinny.py where its tuned table says that is faster (see the module doc)."""
    return _project(x, weight, bias, None)


def norm_linear(x: Tensor, norm: nn.Module, weight: Tensor, bias: Tensor | None) -> Tensor:
    """F.linear(norm(x), weight, bias) for a transformers RMSNorm `norm` (weight, variance_epsilon):
    on a GPU, up to 64 rows and no bias, the norm inside the projection's launch (kernels/skinny.py's
    norm form, with the tuned launch for the shape whether or not it beat cuBLAS unfolded); else
    the norm module, then F.linear."""
    return _project(x, weight, bias, norm)


class SkinnyLinear(nn.Module):
    """An nn.Linear (held as `linear`) computed by `linear` above."""

    def __init__(self, original: nn.Linear) -> None:
        super().__init__()
        self.linear = original

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.linear.weight, self.linear.bias)


class SkinnyProjections:
    """Every attention module's o_proj becomes a SkinnyLinear and a fused q/k/v GEMM (_QKV) projects
    through `linear`, until `remove()`."""

    def __init__(self, model: nn.Module) -> None:
        self.swapped: list[tuple[nn.Module, nn.Linear]] = []
        self.qkv: list[_QKV] = []
        for module in model.modules():
            o = getattr(module, "o_proj", None)
            if type(o) is nn.Linear:
                module.o_proj = SkinnyLinear(o)
                self.swapped.append((module, o))
            q = getattr(module, "q_proj", None)
            if isinstance(q, _QKV):
                q.project = linear
                self.qkv.append(q)

    @property
    def layers(self) -> int:
        return len(self.swapped)

    def remove(self) -> None:
        for module, o in self.swapped:
            module.o_proj = o
        for q in self.qkv:
            q.project = F.linear
        self.swapped, self.qkv = [], []
