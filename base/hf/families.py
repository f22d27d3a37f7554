"""MoE model families: what differs between the transformers implementations the project runs.

Every family transformers 5 implements the same way: a sparse-MoE block holds a router module
(`gate` or `router`) whose forward returns (router_logits, top_k_weights, top_k_index), and an
`experts` module with forward(hidden_TH, top_k_index_TK, top_k_weights_TK). A family says what
differs: the config keys of the expert count and top-k, whether top-k weights are renormalised,
the block's shared experts (added after the routed ones) and what its forward returns. The owned
block (base/hf/moe_block.py) runs the family's block from these.

Shapes: B sequences, S positions, T = B*S tokens, H hidden, E experts, K top-k.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PretrainedConfig

from base.method.backends import SoftmaxTopK
from base.registry import Registry


def _no_shared(block: nn.Module, hidden_BSH: Tensor, x_TH: Tensor, y_TH: Tensor) -> Tensor:
    return y_TH.reshape(hidden_BSH.shape)


def _qwen2_shared(block: nn.Module, hidden_BSH: Tensor, x_TH: Tensor, y_TH: Tensor) -> Tensor:
    """Qwen1.5/2-MoE: one shared expert behind a sigmoid gate."""
    shared_TH = F.sigmoid(block.shared_expert_gate(x_TH)) * block.shared_expert(x_TH)
    return (y_TH + shared_TH).reshape(hidden_BSH.shape)


def _deepseek_shared(block: nn.Module, hidden_BSH: Tensor, x_TH: Tensor, y_TH: Tensor) -> Tensor:
    """DeepSeek-V2: shared experts on the block input, added to the routed output."""
    return y_TH.view(*hidden_BSH.shape) + block.shared_experts(hidden_BSH)


@dataclass(frozen=True)
class Family:
    model_type: str  # transformers' config model_type
    experts_key: str  # config attribute holding the number of routed experts
    renormalizes: Callable[[PretrainedConfig], bool]  # are top-k weights rescaled to sum to 1?
    topk_key: str = "num_experts_per_tok"  # config attribute holding the experts per token
    router_attr: str = "gate"  # the block's router child
    shared: tuple[str, ...] = ()  # the block's shared-expert children
    shared_mlp: str | None = None  # of those, the SwiGLU MLP (base/hf/shared_experts.py runs it in the kernel)
    shared_gate: str | None = None  # and the Linear(H, 1) whose sigmoid weighs its output (Qwen1.5/2)
    # the block's output from (block, hidden_BSH, x_TH, routed y_TH): shared experts added, shape back
    combine: Callable[[nn.Module, Tensor, Tensor, Tensor], Tensor] = _no_shared
    returns_router_scores: bool = False  # the block returns (hidden, router scores) (GPT-OSS)
    # router classes that are softmax -> top-k (-> renormalise, scale): route_select reproduces them
    softmax_topk_routers: tuple[str, ...] = ()

    @property
    def block_children(self) -> tuple[str, ...]:
        return (self.router_attr, "experts", *self.shared)


FAMILIES: Registry[Family] = Registry("model family")
FAMILIES.register("qwen3_moe")(Family("qwen3_moe", "num_experts", lambda c: bool(c.norm_topk_prob),
                                      softmax_topk_routers=("Qwen3MoeTopKRouter",)))
FAMILIES.register("qwen2_moe")(Family("qwen2_moe", "num_experts", lambda c: bool(c.norm_topk_prob),
                                      shared=("shared_expert", "shared_expert_gate"), combine=_qwen2_shared,
                                      shared_mlp="shared_expert", shared_gate="shared_expert_gate",
                                      softmax_topk_routers=("Qwen2MoeTopKRouter",)))
FAMILIES.register("olmoe")(Family("olmoe", "num_experts", lambda c: bool(c.norm_topk_prob),
                                  softmax_topk_routers=("OlmoeTopKRouter",)))
# Mixtral's router jitter applies in training only; the project decodes in eval mode.
FAMILIES.register("mixtral")(Family("mixtral", "num_local_experts", lambda c: True,
                                    softmax_topk_routers=("MixtralTopKRouter",)))
# GPT-OSS takes a softmax over its top-k logits: the same as renormalising the full softmax. Its
# router's bias goes into the fused route's GEMM (SoftmaxTopK.gemm_bias_E).
FAMILIES.register("gpt_oss")(Family("gpt_oss", "num_local_experts", lambda c: True, router_attr="router",
                                    returns_router_scores=True, softmax_topk_routers=("GptOssTopKRouter",)))
# DeepSeek-V2 scales by routed_scaling_factor and never renormalises.
FAMILIES.register("deepseek_v2")(Family("deepseek_v2", "n_routed_experts", lambda c: False,
                                        shared=("shared_experts",), combine=_deepseek_shared, shared_mlp="shared_experts",
                                        softmax_topk_routers=("DeepseekV2TopkRouter",)))


@dataclass
class MoeLayer:
    """One sparse MoE block of a loaded model."""

    index: int  # ordinal among MoE layers
    name: str  # module path of the block
    router: nn.Module
    experts: nn.Module

    @property
    def num_experts(self) -> int:
        return int(self.experts.num_experts)

    @property
    def top_k(self) -> int:
        return int(self.router.top_k)


def find_moe_layers(model: nn.Module) -> list[MoeLayer]:
    layers = []
    for name, module in model.named_modules():
        experts = getattr(module, "experts", None)
        router = getattr(module, "gate", None) or getattr(module, "router", None)
        if experts is not None and router is not None and hasattr(router, "top_k"):
            layers.append(MoeLayer(len(layers), name, router, experts))
    if not layers:
        raise ValueError(f"no MoE blocks (router + experts) found in {type(model).__name__}")
    return layers


def softmax_topk(family: Family, router: nn.Module, norm_topk: bool) -> SoftmaxTopK | None:
    """The router as route_select sees it, or None when route_select cannot reproduce it
    (group-limited top-k, another router class). A bias of the router's own (GPT-OSS) is added in
    the route's GEMM."""
    bias_E = getattr(router, "logit_bias_E", None)  # a skewed random router (base/hf/skew.py)
    plain = type(router).__name__ in family.softmax_topk_routers
    if not (plain or bias_E is not None):
        return None
    if getattr(router, "topk_method", "greedy") != "greedy":
        return None
    return SoftmaxTopK(router.weight, int(router.top_k), norm_topk,
                       float(getattr(router, "routed_scaling_factor", 1.0)), bias_E, getattr(router, "bias", None))
