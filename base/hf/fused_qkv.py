"""One GEMM for an attention layer's q, k and v projections in the decode step.

transformers' attention modules call `q_proj(x)`, `k_proj(x)` and `v_proj(x)` on the same input:
three GEMMs of a few rows (the batch) that each read their weights at a fraction of the memory
bandwidth, plus a launch each. Inductor does not merge them (it emits three `mm` calls for three
linears of one input), so this module does, without touching the attention's own forward:

    fused = FusedQKV(model)       # q_proj computes [q; k; v]; k_proj and v_proj hand back their part
    ...                           # the model's forwards run unchanged
    fused.remove()                # the original projections again

q_proj becomes `_QKV`: one linear over the concatenated weights, which keeps k and v in a stash
that `_Part` modules in place of k_proj and v_proj take them from. The stash is one dict shared by
every layer (layers run one after another), so a compiled attention forward (base/runtime/regional.py)
sees the same object in every layer and is not recompiled per layer; under `torch.compile` the
store and the take cancel out and the three projections are one `mm`. The originals' weights
become views of the concatenated weight: no second copy in memory.

Requires the attention to call q_proj before k_proj and v_proj, which every supported family does;
a `_Part` called first raises. Layers without separate q/k/v linears (DeepSeek's MLA) are left as
they are.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

_STASH: dict[str, Tensor] = {}


class _QKV(nn.Module):
    def __init__(self, weight_CH: Tensor, bias_C: Tensor | None, sizes: tuple[int, int, int]) -> None:
        super().__init__()
        # parameters, not plain attributes: a compiled forward takes them as inputs instead of
        # specialising on (and recompiling for) each layer's tensor
        self.weight = nn.Parameter(weight_CH, requires_grad=False)
        self.bias = None if bias_C is None else nn.Parameter(bias_C, requires_grad=False)
        self.sizes = sizes
        self.project = nn.functional.linear  # base/hf/skinny_proj.py may route it to kernels/skinny.py

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.project(x, self.weight, self.bias).split(self.sizes, dim=-1)
        _STASH["k"], _STASH["v"] = k, v
        return q


class _Part(nn.Module):
    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key

    def forward(self, x: Tensor) -> Tensor:
        if self.key not in _STASH:
            raise RuntimeError(f"fused q/k/v: {self.key}_proj was called before q_proj")
        return _STASH.pop(self.key)


def _fusable(module: nn.Module) -> bool:
    projs = [getattr(module, f"{p}_proj", None) for p in "qkv"]
    if not all(type(p) is nn.Linear for p in projs):
        return False
    ws = [p.weight for p in projs]
    return len({(w.dtype, w.device, w.shape[1]) for w in ws}) == 1


class FusedQKV:
    """Fuses the q/k/v projections of every attention module of `model` until `remove()`."""

    def __init__(self, model: nn.Module) -> None:
        self.originals: list[tuple[nn.Module, tuple[nn.Module, nn.Module, nn.Module]]] = []
        with torch.no_grad():
            for module in model.modules():
                if _fusable(module):
                    self._fuse(module)

    def _fuse(self, module: nn.Module) -> None:
        q, k, v = (getattr(module, f"{p}_proj") for p in "qkv")
        w_CH = torch.cat([q.weight, k.weight, v.weight])
        b_C = None
        if any(p.bias is not None for p in (q, k, v)):  # a missing bias is a zero one
            b_C = torch.cat([p.bias if p.bias is not None else w_CH.new_zeros(p.out_features) for p in (q, k, v)])
        sizes = (q.out_features, k.out_features, v.out_features)
        # the originals share the new storage (views), so restoring costs nothing and nothing doubles
        offs = (0, sizes[0], sizes[0] + sizes[1], sum(sizes))
        for i, p in enumerate((q, k, v)):
            p.weight.data = w_CH[offs[i]:offs[i + 1]]
            if p.bias is not None:
                p.bias.data = b_C[offs[i]:offs[i + 1]]
        self.originals.append((module, (q, k, v)))
        module.q_proj, module.k_proj, module.v_proj = _QKV(w_CH, b_C, sizes), _Part("k"), _Part("v")

    @property
    def layers(self) -> int:
        return len(self.originals)

    def remove(self) -> None:
        for module, (q, k, v) in self.originals:
            module.q_proj, module.k_proj, module.v_proj = q, k, v
        self.originals = []
        _STASH.clear()
