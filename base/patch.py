"""Patch a Hugging Face MoE model so every decode step keeps at most `budget` experts per layer.

Two hooks, no module replaced (state dicts and the experts implementation stay as they are):
- a forward pre-hook on the model reads input_ids / attention_mask to tell decode from prefill and
  which rows are real tokens (not left padding, not a finished sequence);
- a forward hook on each router rewrites (top_k_weights, top_k_index) before the experts run.

Shapes: B sequences, S new positions per sequence, T = B*S tokens, H hidden, E experts, K top-k.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from base.families import FAMILIES, MoeLayer, find_moe_layers
from base.routing import RoutedBatch, StepStats, pair_counts_E, reassign, step_stats
from base.selectors import Selector

# Selectors with a Triton path (kernels/step.py); the others run the PyTorch reference.
TRITON_SELECTORS = ("router_sum", "router_sq", "count", "calib_freq", "calib_energy", "base")
# ... of which these can also replace the router's own softmax/top-k (kernels.route_select).
ROUTE_SELECT_KINDS = ("router_sum", "router_sq", "count", "calib_energy", "base")


@dataclass
class DecodeContext:
    """Per-forward state the model pre-hook sets and the router hooks read."""

    pad_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()  # a row fed one of these has just ended: its output is discarded
    finished_B: Tensor | None = None  # set by a generation loop: rows whose sequence has ended
    active_T: Tensor | None = None
    is_decode: bool = False
    step: int = 0  # decode steps seen since the patch (or the last reset)


@dataclass
class PatchOptions:
    budget: int | None
    reassign: str = "backfill"
    renormalize: str = "model"  # model | always | never
    apply_to: str = "decode"
    record_stats: bool = True
    energy: bool = False  # record true retained energy (runs every routed expert)
    backend: str = "torch"  # torch: base/routing.py; triton: kernels.select_step where supported


def expert_norms_TK(experts: nn.Module, z_TH: Tensor, idx_TK: Tensor) -> Tensor:
    """||E_u(z_t)|| for every routed pair, through the experts module's own implementation.

    Each (t, u) pair becomes one row routed to u alone with weight 1, so the output row is E_u(z_t).
    """
    T, K = idx_TK.shape
    x_PH = z_TH.repeat_interleave(K, dim=0)
    w_P1 = torch.ones(T * K, 1, dtype=z_TH.dtype, device=z_TH.device)
    out_PH = experts(x_PH, idx_TK.reshape(-1, 1), w_P1)
    return out_PH.float().norm(dim=-1).reshape(T, K)


def _cache_len(kwargs: dict[str, Any]) -> int:
    cache = kwargs.get("past_key_values", kwargs.get("cache"))
    if cache is None or not hasattr(cache, "get_seq_length"):
        return 0
    return int(cache.get_seq_length())


@dataclass
class StatRecord:
    layer: int
    step: int
    decode: bool
    stats: StepStats


@dataclass
class BudgetPatch:
    """Handle on a patched model: its options, the recorded statistics, and `remove()`."""

    model: nn.Module
    layers: list[MoeLayer]
    selector: Selector | None  # None = dense: nothing changes, statistics are still recorded
    options: PatchOptions
    renormalizes: bool  # what renormalize=model means for this model
    ctx: DecodeContext = field(default_factory=DecodeContext)
    records: list[StatRecord] = field(default_factory=list)
    _handles: list[Any] = field(default_factory=list)
    _pred_w_EH: dict[int, Tensor] = field(default_factory=dict)  # triton: predictor laid out per layer
    _wcat_CH: dict[int, Tensor] = field(default_factory=dict)  # triton: [router; predictor] weights
    _forwards: dict[int, Any] = field(default_factory=dict)  # routers whose forward was replaced
    _ended_ids: dict[torch.device, Tensor] = field(default_factory=dict)  # pad + EOS ids, per device

    # ---- hooks -------------------------------------------------------------------------------
    def _model_pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        x = ids if ids is not None else kwargs["inputs_embeds"]
        B, S = x.shape[0], x.shape[1]
        mask = kwargs.get("attention_mask")
        has_past = (mask is not None and mask.dim() == 2 and mask.shape[-1] > S) or _cache_len(kwargs) > 0
        self.ctx.is_decode = S == 1 and has_past
        active_BS = torch.ones(B, S, dtype=torch.bool, device=x.device)
        if mask is not None and mask.dim() == 2:
            active_BS &= mask[:, -S:].bool()
        if self.ctx.is_decode:
            self.ctx.step += 1
            ended = self._ended(x.device)
            if ids is not None and ended.numel():
                # generate() feeds a finished row its EOS once, then the pad token; such rows must
                # not score or add experts.
                active_BS &= ~torch.isin(ids, ended)
            if self.ctx.finished_B is not None and self.ctx.finished_B.shape[0] == B:
                active_BS &= ~self.ctx.finished_B.to(x.device)[:, None]
        self.ctx.active_T = active_BS.reshape(-1)

    def _ended(self, device: torch.device) -> Tensor:
        """Token ids that mark a finished row, built once per device (no copy per decode step)."""
        if device not in self._ended_ids:
            ids = [t for t in (self.ctx.pad_token_id, *self.ctx.eos_token_ids) if t is not None]
            self._ended_ids[device] = torch.tensor(ids, dtype=torch.long, device=device)
        return self._ended_ids[device]

    def _router_hook(self, layer: MoeLayer, module: nn.Module, args: tuple, output: tuple) -> tuple | None:
        if not (self.ctx.is_decode or self.options.apply_to == "all"):
            return None
        if self.selector is None and not self.options.record_stats:
            return None  # dense with nothing to record: leave the router alone
        logits, w_TK, idx_TK = output
        z_TH = args[0].reshape(-1, args[0].shape[-1])
        active_T = self._active_T(z_TH)
        batch = RoutedBatch(
            z_TH=z_TH,
            probs_TE=torch.softmax(logits.reshape(z_TH.shape[0], -1).float(), dim=-1),
            topk_idx_TK=idx_TK,
            topk_w_TK=w_TK,
            active_T=active_T,
            layer=layer.index,
        )
        sel = self.selector
        if (sel is not None and sel.needs_norms) or self.options.energy:
            batch.norms_TK = expert_norms_TK(layer.experts, z_TH, idx_TK)
        renorm = self._renorm()
        if sel is None:
            keep_E = pair_counts_E(idx_TK, active_T, batch.num_experts) > 0
            new = None
        elif self.options.backend == "triton" and sel.name in TRITON_SELECTORS:
            keep_E, new = self._triton_select(batch, sel, renorm)
        else:
            keep_E, score_E = sel.keep(batch, self.options.budget if sel.uses_budget else None)
            new = reassign(batch, keep_E, score_E, self.options.reassign, renorm)
        if self.options.record_stats:
            self.records.append(StatRecord(layer.index, self.ctx.step, self.ctx.is_decode, step_stats(batch, keep_E)))
        if new is None:
            return None
        return (logits, new[1], new[0])

    def _active_T(self, z_TH: Tensor) -> Tensor:
        active_T = self.ctx.active_T
        if active_T is None or active_T.shape[0] != z_TH.shape[0]:
            active_T = torch.ones(z_TH.shape[0], dtype=torch.bool, device=z_TH.device)
        return active_T

    def _renorm(self) -> bool:
        return self.options.renormalize == "always" or (self.options.renormalize == "model" and self.renormalizes)

    def _route_select_forward(self, layer: MoeLayer, original: Any, hidden_states: Tensor) -> tuple:
        """The router's forward at decode as ONE kernel: its softmax/top-k, the score, the top-M and
        the backfill (kernels.route_select); for `base` the predictor rides in the router's GEMM."""
        if not (self.ctx.is_decode or self.options.apply_to == "all"):
            return original(hidden_states)
        from kernels import fuse_router_predictor, fused_router_logits, route_select

        router, sel, L = layer.router, self.selector, layer.index
        z_TH = hidden_states.reshape(-1, hidden_states.shape[-1]).to(router.weight.dtype)
        extra: dict[str, Tensor] = {}
        if sel.name == "base":
            if L not in self._wcat_CH:
                self._wcat_CH[L] = fuse_router_predictor(router.weight, sel.artifacts.pred_w_LHE[L].to(z_TH.device))
            logits_TE, g_TE = fused_router_logits(z_TH, self._wcat_CH[L])
            extra = {"g_TE": g_TE, "pred_b_E": sel.artifacts.pred_b_LE[L].to(z_TH.device, torch.float32)}
        else:
            logits_TE = torch.nn.functional.linear(z_TH, router.weight)
            if sel.name == "calib_energy":
                extra = {"energy_E": sel.artifacts.energy_LE[L].to(z_TH.device, torch.float32)}
        active_T = self._active_T(z_TH)
        routing, out = route_select(
            logits_TE, layer.top_k, active_T, self.options.budget, norm_topk=self.renormalizes,
            scale=float(getattr(router, "routed_scaling_factor", 1.0)), kind=sel.name,
            reassign_mode=self.options.reassign, renormalize=self._renorm(), **extra,
        )  # fmt: skip
        if self.options.record_stats:
            batch = RoutedBatch(z_TH, routing.probs_TE, routing.topk_idx_TK, routing.topk_w_TK, active_T, L)
            self.records.append(StatRecord(L, self.ctx.step, self.ctx.is_decode, step_stats(batch, out.keep_E)))
        return logits_TE, out.topk_w_TK, out.topk_idx_TK

    def _triton_select(self, batch: RoutedBatch, sel: Selector, renorm: bool) -> tuple[Tensor, tuple]:
        from kernels.score import prepare_predictor
        from kernels.step import select_step

        pred_w_EH = None
        if sel.name == "base":
            if batch.layer not in self._pred_w_EH:
                w_HE = sel.artifacts.pred_w_LHE[batch.layer].to(batch.z_TH.device, torch.float32)
                self._pred_w_EH[batch.layer] = prepare_predictor(w_HE)
            pred_w_EH = self._pred_w_EH[batch.layer]
        out = select_step(batch, sel.name, self.options.budget, artifacts=sel.artifacts, pred_w_EH=pred_w_EH,
                          reassign_mode=self.options.reassign, renormalize=renorm)
        return out.keep_E, (out.topk_idx_TK, out.topk_w_TK)

    # ---- public ------------------------------------------------------------------------------
    def reset(self) -> None:
        self.ctx.step = 0
        self.records.clear()

    def stats_rows(self) -> list[dict[str, float]]:
        """One row per (layer, step): the statistics the reports aggregate. Syncs the device once."""
        if not self.records:
            return []
        fields = ["union", "kept", "weight_kept", "weight_total", "tokens_lost", "tokens"]
        energy = self.records[0].stats.energy_kept is not None
        if energy:
            fields += ["energy_kept", "energy_total"]
        values = torch.stack(
            [torch.stack([getattr(r.stats, f).float() for f in fields]) for r in self.records]
        ).cpu().tolist()
        return [
            {"layer": r.layer, "step": r.step, "decode": r.decode, **dict(zip(fields, v))}
            for r, v in zip(self.records, values)
        ]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for layer in self.layers:
            if layer.index in self._forwards:
                del layer.router.forward  # back to the class's forward
        self._forwards.clear()


def patch_model(
    model: nn.Module,
    family: str,
    selector: Selector | None,
    options: PatchOptions,
    pad_token_id: int | None = None,
    eos_token_ids: tuple[int, ...] = (),
) -> BudgetPatch:
    """Install the hooks; `selector=None` records union statistics and changes nothing."""
    layers = find_moe_layers(model)
    if options.budget is not None and options.budget > layers[0].num_experts:
        raise ValueError(f"budget={options.budget} exceeds the {layers[0].num_experts} experts of the model")
    patch = BudgetPatch(
        model=model,
        layers=layers,
        selector=selector,
        options=options,
        renormalizes=FAMILIES.get(family).renormalizes(model.config),
        ctx=DecodeContext(pad_token_id=pad_token_id, eos_token_ids=tuple(eos_token_ids)),
    )
    patch._handles.append(model.register_forward_pre_hook(patch._model_pre_hook, with_kwargs=True))
    for layer in layers:
        if _can_route_select(patch, layer):
            original = layer.router.forward
            layer.router.forward = lambda h, layer=layer, original=original: patch._route_select_forward(
                layer, original, h)
            patch._forwards[layer.index] = original
            continue
        hook = lambda mod, args, out, layer=layer: patch._router_hook(layer, mod, args, out)
        patch._handles.append(layer.router.register_forward_hook(hook))
    return patch


def _can_route_select(patch: BudgetPatch, layer: MoeLayer) -> bool:
    """route_select reproduces softmax -> top-k (-> renormalise, scale) routers without a bias."""
    sel, router = patch.selector, layer.router
    return (
        patch.options.backend == "triton" and sel is not None and sel.name in ROUTE_SELECT_KINDS
        and not patch.options.energy and getattr(router, "bias", None) is None
        and getattr(router, "topk_method", "greedy") == "greedy"
        and type(router).__name__ in ("Qwen3MoeTopKRouter", "Qwen2MoeTopKRouter", "OlmoeTopKRouter",
                                      "MixtralTopKRouter", "DeepseekV2TopkRouter")
    )
