"""Size and family of the embedded models, scaled down so that a bf16 checkpoint stays under 25 MB.

`family="qwen3_moe"` (the default, `models/mini`): a Qwen3-MoE, the transformers code path of
Qwen3-30B-A3B, top-k weights renormalised. `family="olmoe"` (`models/mini_olmoe`): an OLMoE
(`OlmoeForCausalLM`, the code path of OLMoE-1B-7B), whose top-k weights are the raw softmax
probabilities, not renormalised, and whose attention normalises q and k over the whole projection.

Shapes: H hidden, L layers (all sparse), E experts, K top-k, I expert intermediate size.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import OlmoeConfig, PretrainedConfig, Qwen3MoeConfig

from experiments.mini.tokenizer import VOCAB_SIZE, build_tokenizer

FAMILIES = ("qwen3_moe", "olmoe")


@dataclass
class MiniModelConfig:
    family: str = "qwen3_moe"  # qwen3_moe | olmoe
    hidden_size: int = 192  # H
    num_hidden_layers: int = 6  # L, every one a MoE layer
    num_experts: int = 32  # E
    num_experts_per_tok: int = 4  # K
    moe_intermediate_size: int = 96  # I
    num_attention_heads: int = 6
    num_key_value_heads: int = 2  # GQA, as in Qwen3-30B-A3B
    head_dim: int = 32
    vocab_size: int = 128  # VOCAB_SIZE rounded up to a multiple of 64
    max_position_embeddings: int = 256
    router_aux_loss_coef: float = 0.01

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family={self.family!r}; choose one of {', '.join(FAMILIES)}")
        if self.num_experts < 32 or self.num_experts_per_tok < 4 or self.num_hidden_layers < 4:
            raise ValueError(
                f"mini needs >= 32 experts, top-k >= 4 and >= 4 layers, got E={self.num_experts} "
                f"K={self.num_experts_per_tok} L={self.num_hidden_layers}"
            )
        if self.vocab_size < VOCAB_SIZE:
            raise ValueError(f"vocab_size={self.vocab_size} is below the tokenizer's {VOCAB_SIZE}")

    def to_hf(self) -> PretrainedConfig:
        if self.family == "olmoe":
            return self._olmoe()
        return Qwen3MoeConfig(
            **self._shared(),
            # Why: Qwen3MoeConfig requires it; unused since mlp_only_layers is empty.
            intermediate_size=4 * self.hidden_size,
            head_dim=self.head_dim,
            moe_intermediate_size=self.moe_intermediate_size,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
            rope_theta=10000.0,
        )

    def _olmoe(self) -> OlmoeConfig:
        if self.head_dim * self.num_attention_heads != self.hidden_size:
            raise ValueError(
                f"olmoe derives head_dim from hidden_size / heads: {self.hidden_size} / "
                f"{self.num_attention_heads} != head_dim {self.head_dim}"
            )
        return OlmoeConfig(
            **self._shared(),
            intermediate_size=self.moe_intermediate_size,  # OLMoE's expert width
            norm_topk_prob=False,  # as OLMoE-1B-7B: weights are the softmax probabilities of the top k
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        )

    def _shared(self) -> dict:
        """The keywords both families' configs take alike: the sizes, the router loss, the tokenizer's ids."""
        tok = build_tokenizer()
        return {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "max_position_embeddings": self.max_position_embeddings,
            "num_experts": self.num_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "router_aux_loss_coef": self.router_aux_loss_coef,
            "output_router_logits": False,
            "tie_word_embeddings": False,
            "bos_token_id": tok.bos_token_id,
            "eos_token_id": tok.eos_token_id,
            "pad_token_id": tok.pad_token_id,
        }
