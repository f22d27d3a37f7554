"""Expert similarity for SERE-style re-routing (`method.reassign=similar`): how alike two experts'
outputs are on the same calibration inputs.

    sim_EE = expert_similarity_EE(layer.experts, z_NH)     # z_NH: the layer's calibration inputs

S[u, v] is the cosine similarity of Y_u and Y_v, Y_u the outputs E_u(z_n) of expert u over the
first `max_tokens` calibration tokens, concatenated. Output similarity rather than weight
similarity because re-routing substitutes one expert's output for another's on tokens like
these. Computed from the stored calibration inputs when a run needs it (E x N expert rows per
layer: cheap next to calibration itself), not cached.

Shapes: N calibration tokens, H hidden, E experts.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn


@torch.no_grad()
def expert_similarity_EE(experts: nn.Module, z_NH: Tensor, num_experts: int, max_tokens: int = 256) -> Tensor:
    """(E, E) float32 cosine similarity of the experts' outputs on z_NH[:max_tokens]."""
    param = next(experts.parameters())
    z_NH = z_NH[:max_tokens].to(param.device, param.dtype)
    N, E = z_NH.shape[0], num_experts
    x_PH = z_NH.repeat_interleave(E, dim=0)  # row n*E + u: token n through expert u
    idx_P1 = torch.arange(E, device=param.device).repeat(N)[:, None]
    out_PH = experts(x_PH, idx_P1, torch.ones(N * E, 1, dtype=param.dtype, device=param.device))
    y_EX = out_PH.float().reshape(N, E, -1).transpose(0, 1).reshape(E, -1)  # X = N*H
    y_EX = torch.nn.functional.normalize(y_EX, dim=-1)
    return (y_EX @ y_EX.t()).cpu()
