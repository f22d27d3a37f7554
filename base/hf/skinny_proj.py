"""The attention's dense projections of a decode step on kernels/skinny.py instead of cuBLAS.

    skinny = SkinnyProjections(model)   # every o_proj (and the fused q/k/v GEMM) tries the kernel
    ...
    skinny.remove()                     # the original modules again

Why: at 16 tokens cuBLAS splits the output projection's K and adds a reduce launch (7.7 + 1.7 us
per layer of Qwen3-30B-A3B on an H200); kernels/skinny.py streams the weights once and needs no
reduce launch (see its doc). Which one runs is decided per shape by the GPU's tuned table
(`skinny_launch`): only a shape whose entry beat cuBLAS in tools/bench_skinny.py runs the kernel; a
shape without an entry or where it lost, more than 64 rows (prefill), a bias, or a CPU tensor keep
F.linear, so a GPU without entries runs as before. The engine applies this in its compiled layer
halves (base/runtime/regional.py): on an H100 (router_sq M=16, batch 16) the step took 0.98x
its time without it in each of 5 interleaved rounds.

The kernel runs through a custom op (`base_moe::skinny_linear`), so a compiled region treats it as
one opaque launch, as it treats cuBLAS's mm.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from base.hf.fused_qkv import _QKV


@torch.library.custom_op("base_moe::skinny_linear", mutates_args=())
def _skinny_linear_op(x_TK: Tensor, w_NK: Tensor, block_n: int, block_k: int, num_stages: int, num_warps: int,
                      split: int) -> Tensor:
    """The kernel with a launch's parameters."""
    from kernels.skinny import SkinnyLaunch, skinny_linear

    return skinny_linear(x_TK, w_NK, SkinnyLaunch(block_n, block_k, num_stages, num_warps, split))


@_skinny_linear_op.register_fake
def _(x_TK, w_NK, block_n, block_k, num_stages, num_warps, split):
    return x_TK.new_empty(x_TK.shape[0], w_NK.shape[0])


def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """F.linear, on kernels/skinny.py where its tuned table says that is faster (see the module doc)."""
    from kernels.skinny import skinny_launch

    N, K = weight.shape
    x_TK = x.reshape(-1, K)
    launch = None if bias is not None else skinny_launch(N, K, x_TK.shape[0], x.device)
    if launch is None:
        return F.linear(x, weight, bias)
    y_TN = _skinny_linear_op(x_TK, weight, launch.block_n, launch.block_k, launch.num_stages, launch.num_warps,
                             launch.split)
    return y_TN.reshape(*x.shape[:-1], N)


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
