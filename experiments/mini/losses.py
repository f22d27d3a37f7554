"""Training losses of the "mini" model: answer-only cross-entropy and the Switch-style
load-balancing loss (the same formula as transformers' `load_balancing_loss_func`, restated here
so it is masked by our own answer/padding mask and does not depend on the transformers version).

Shapes: B sequences, S positions, V vocab, N = B*S tokens, E experts, K top-k, L layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def answer_ce(logits_BSV: Tensor, input_ids_BS: Tensor, loss_mask_BS: Tensor) -> Tensor:
    """Mean next-token CE over positions whose *target* is answer text, the stop or EOS.

    loss_mask_BS[b, s] is True when input_ids_BS[b, s] is such a target; position s-1 predicts it.
    """
    logits_NV = logits_BSV[:, :-1].reshape(-1, logits_BSV.size(-1)).float()
    targets_N = input_ids_BS[:, 1:].reshape(-1)
    mask_N = loss_mask_BS[:, 1:].reshape(-1)
    return F.cross_entropy(logits_NV[mask_N], targets_N[mask_N])


def load_balancing_loss(router_logits_L: tuple[Tensor, ...], token_mask_BS: Tensor, top_k: int) -> Tensor:
    """E * sum_e f_e * p_e over real (non-pad) tokens, pooled over layers; 1.0 when balanced.

    f_e is the fraction of top-k assignments that go to expert e, p_e the mean router probability.
    Pooled over the whole mixed-domain batch, so it asks for global balance only and leaves each
    domain free to prefer its own experts.
    """
    mask_N = token_mask_BS.reshape(-1)
    loss = torch.zeros((), device=mask_N.device)
    for logits_NE in router_logits_L:
        probs_NE = torch.softmax(logits_NE[mask_N].float(), dim=-1)
        topk_NK = probs_NE.topk(top_k, dim=-1).indices
        num_experts = probs_NE.size(-1)
        counts_E = torch.zeros(num_experts, device=probs_NE.device).scatter_add_(
            0, topk_NK.reshape(-1), torch.ones(topk_NK.numel(), device=probs_NE.device)
        )
        frac_E = counts_E / topk_NK.numel()
        loss = loss + num_experts * (frac_E * probs_NE.mean(0)).sum()
    return loss / len(router_logits_L)
