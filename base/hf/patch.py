"""Patch a Hugging Face MoE model so every decode step keeps at most `budget` experts per layer.

No module is replaced (state dicts and the experts implementation stay as they are):
- a forward pre-hook on the model reads input_ids / attention_mask to tell decode from prefill and
  which rows are real tokens (not left padding, not a finished sequence); a decode engine
  (base/runtime/engine.py) sets that context itself instead (`DecodeContext.managed`);
- each router either gets a forward hook that rewrites (top_k_weights, top_k_index) before the
  experts run, or, with the Triton backend and a softmax/top-k router, a forward that routes and
  selects in one launch.
What is kept is the policy (base/method/backends.py: Policy), how it runs the backend (torch | triton),
and what happened is written to a StatsRecorder on the device (base/method/recorder.py).

Shapes: B sequences, S new positions per sequence, T = B*S tokens, H hidden, E experts, K top-k.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from base.method.backends import BACKENDS, Decision, Policy, TorchBackend, dense_decision
from base.hf.families import FAMILIES, MoeLayer, find_moe_layers
from base.method.recorder import StatsRecorder
from base.method.routing import RoutedBatch, step_stats
from base.method.selectors import Selector


@dataclass
class DecodeContext:
    """Per-forward state the model pre-hook (or a decode engine) sets and the router hooks read."""

    pad_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()  # a row fed one of these has just ended: its output is discarded
    finished_B: Tensor | None = None  # set by a generation loop: rows whose sequence has ended
    active_T: Tensor | None = None
    is_decode: bool = False
    managed: bool = False  # a decode engine sets is_decode / active_T; the pre-hook leaves them


@dataclass
class PatchOptions:
    budget: int | None
    reassign: str = "backfill"
    renormalize: str = "model"  # model | always | never
    apply_to: str = "decode"
    record_stats: bool = True
    energy: bool = False  # record true retained energy (runs every routed expert)
    fidelity: bool = False  # also record the MoE-output error against dense (runs the experts twice more)
    backend: str = "torch"  # torch: base/method/routing.py; triton: kernels/ where supported
    layer_budgets: dict[int, int] | None = None  # per MoE layer index (budget_split=sensitivity)


def expert_norms_TK(experts: nn.Module, z_TH: Tensor, idx_TK: Tensor) -> Tensor:
    """||E_u(z_t)|| for every routed pair, through the experts module's own implementation.

    Each (t, u) pair becomes one row routed to u alone with weight 1, so the output row is E_u(z_t).
    """
    T, K = idx_TK.shape
    x_PH = z_TH.repeat_interleave(K, dim=0)
    w_P1 = torch.ones(T * K, 1, dtype=z_TH.dtype, device=z_TH.device)
    out_PH = experts(x_PH, idx_TK.reshape(-1, 1), w_P1)
    return out_PH.float().norm(dim=-1).reshape(T, K)


def output_error(experts: nn.Module, batch: RoutedBatch, decision: Decision) -> tuple[Tensor, Tensor]:
    """(sum ||y_budget - y_dense||^2, sum ||y_dense||^2) over the active tokens of one layer and step,
    y the routed experts' output (shared experts, equal in both, left out). Runs the experts twice."""
    y_dense_TH = experts(batch.z_TH, batch.topk_idx_TK, batch.topk_w_TK).float()
    active_T1 = batch.active_T[:, None]
    dense = torch.where(active_T1, y_dense_TH, 0.0).pow(2).sum()
    if decision.topk_idx_TK is None:  # the router's own routing: no error
        return dense.new_zeros(()), dense
    y_budget_TH = experts(batch.z_TH, decision.topk_idx_TK, decision.topk_w_TK.to(batch.topk_w_TK.dtype)).float()
    err = torch.where(active_T1, y_budget_TH - y_dense_TH, 0.0).pow(2).sum()
    return err, dense


def _cache_len(kwargs: dict[str, Any]) -> int:
    cache = kwargs.get("past_key_values", kwargs.get("cache"))
    if cache is None or not hasattr(cache, "get_seq_length"):
        return 0
    return int(cache.get_seq_length())


@dataclass
class BudgetPatch:
    """Handle on a patched model: policy, backend, recorded statistics, and `remove()`."""

    model: nn.Module
    layers: list[MoeLayer]
    options: PatchOptions
    renormalizes: bool  # does the model renormalise its top-k weights (route_select's norm_topk)
    backend: TorchBackend
    recorder: StatsRecorder
    ctx: DecodeContext = field(default_factory=DecodeContext)
    _handles: list[Any] = field(default_factory=list)
    _forwards: dict[int, Any] = field(default_factory=dict)  # routers whose forward was replaced
    _ended_ids: dict[torch.device, Tensor] = field(default_factory=dict)  # pad + EOS ids, per device
    _bypass: int = 0  # > 0 inside bypassed(): forwards run the model's own (dense) routing, unrecorded

    @property
    def selector(self) -> Selector | None:
        return self.backend.policy.selector

    @property
    def applies(self) -> bool:
        """Does the current forward select (decode, or every forward with apply_to=all)?"""
        return self.ctx.is_decode or self.options.apply_to == "all"

    # ---- per forward -------------------------------------------------------------------------
    def begin_forward(self, is_decode: bool, active_T: Tensor) -> None:
        """Set the context of one model forward; a decode engine calls this for every step."""
        self.ctx.is_decode, self.ctx.active_T = is_decode, active_T
        if self.options.record_stats and self.applies:
            self.recorder.begin_step(is_decode)

    def _model_pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self.ctx.managed or self._bypass:
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        x = ids if ids is not None else kwargs["inputs_embeds"]
        B, S = x.shape[0], x.shape[1]
        mask = kwargs.get("attention_mask")
        has_past = (mask is not None and mask.dim() == 2 and mask.shape[-1] > S) or _cache_len(kwargs) > 0
        is_decode = S == 1 and has_past
        active_BS = torch.ones(B, S, dtype=torch.bool, device=x.device)
        if mask is not None and mask.dim() == 2:
            active_BS &= mask[:, -S:].bool()
        if is_decode:
            ended = self._ended(x.device)
            if ids is not None and ended.numel():
                # generate() feeds a finished row its EOS once, then the pad token; such rows must
                # not score or add experts.
                active_BS &= ~torch.isin(ids, ended)
            if self.ctx.finished_B is not None and self.ctx.finished_B.shape[0] == B:
                active_BS &= ~self.ctx.finished_B.to(x.device)[:, None]
        self.begin_forward(is_decode, active_BS.reshape(-1))

    def _ended(self, device: torch.device) -> Tensor:
        """Token ids that mark a finished row, built once per device (no copy per decode step)."""
        if device not in self._ended_ids:
            ids = [t for t in (self.ctx.pad_token_id, *self.ctx.eos_token_ids) if t is not None]
            self._ended_ids[device] = torch.tensor(ids, dtype=torch.long, device=device)
        return self._ended_ids[device]

    def _active_T(self, z_TH: Tensor) -> Tensor:
        active_T = self.ctx.active_T
        if active_T is None or active_T.shape[0] != z_TH.shape[0]:
            active_T = torch.ones(z_TH.shape[0], dtype=torch.bool, device=z_TH.device)
        return active_T.to(z_TH.device)  # a layer on another GPU of a spread model; no-op on one

    # ---- per router --------------------------------------------------------------------------
    def _router_hook(self, layer: MoeLayer, module: nn.Module, args: tuple, output: tuple) -> tuple | None:
        if self._bypass or not self.applies:
            return None
        if self.selector is None and not self.options.record_stats:
            return None  # dense with nothing to record: leave the router alone
        logits, w_TK, idx_TK = output
        z_TH = args[0].reshape(-1, args[0].shape[-1])
        batch = RoutedBatch(
            z_TH=z_TH,
            probs_TE=torch.softmax(logits.reshape(z_TH.shape[0], -1).float(), dim=-1),
            topk_idx_TK=idx_TK,
            topk_w_TK=w_TK,
            active_T=self._active_T(z_TH),
            layer=layer.index,
        )
        sel = self.selector
        record = self.options.record_stats
        if (sel is not None and sel.needs_norms) or (self.options.energy and record):
            batch.norms_TK = expert_norms_TK(layer.experts, z_TH, idx_TK)
        decision = dense_decision(batch) if sel is None else self.backend.select(batch)
        self._record(batch, decision, layer if self.options.fidelity and record else None)
        if decision.topk_idx_TK is None:
            return None
        return (logits, decision.topk_w_TK, decision.topk_idx_TK)

    def _route_select_forward(self, layer: MoeLayer, original: Any, hidden_states: Tensor) -> tuple:
        """The router's forward at decode as one kernel (TritonBackend.route)."""
        if self._bypass or not self.applies:
            return original(hidden_states)
        z_TH = hidden_states.reshape(-1, hidden_states.shape[-1]).to(layer.router.weight.dtype)
        batch, decision, logits_TE = self.backend.route(layer, z_TH, self._active_T(z_TH), self.renormalizes)
        self._record(batch, decision)
        return logits_TE, decision.topk_w_TK, decision.topk_idx_TK

    def _record(self, batch: RoutedBatch, decision: Decision, layer: MoeLayer | None = None) -> None:
        """Record the step; with `layer` (fidelity), also the MoE-output error against dense."""
        if not self.options.record_stats:
            return
        stats = step_stats(batch, decision.keep_E, decision.topk_idx_TK)
        if layer is not None:
            stats.out_err, stats.out_dense = output_error(layer.experts, batch, decision)
        self.recorder.record(batch.layer, stats)

    # ---- public ------------------------------------------------------------------------------
    @contextmanager
    def bypassed(self) -> Iterator[None]:
        """Forwards inside run the model's own routing and record nothing: the dense reference of a
        fidelity measurement, on the same patched model."""
        self._bypass += 1
        try:
            yield
        finally:
            self._bypass -= 1

    @contextmanager
    def unrecorded(self) -> Iterator[None]:
        """Forwards inside select as usual but record no statistics."""
        before = self.options.record_stats
        self.options.record_stats = False
        try:
            yield
        finally:
            self.options.record_stats = before

    def reset(self) -> None:
        self.recorder.reset()

    def stats_rows(self) -> list[dict[str, float]]:
        """One row per (layer, step): the statistics the reports aggregate. Syncs the device once."""
        return self.recorder.rows() if self.options.record_stats else []

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for layer in self.layers:
            if layer.index in self._forwards:
                original = self._forwards[layer.index]
                if getattr(original, "__self__", None) is layer.router and original.__func__ is type(layer.router).forward:
                    del layer.router.forward  # back to the class's forward
                else:
                    layer.router.forward = original  # an instance forward set before (base/hf/skew.py)
        self._forwards.clear()


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


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
    if options.backend not in BACKENDS:
        raise ValueError(f"unknown backend {options.backend!r}; valid: {', '.join(BACKENDS)}")
    renormalizes = FAMILIES.get(family).renormalizes(model.config)
    renorm = options.renormalize == "always" or (options.renormalize == "model" and renormalizes)
    policy = Policy(selector, options.budget, options.reassign, renorm, options.layer_budgets)
    device = model_device(model)
    # an energy or fidelity run must see every router (no fused route_select)
    backend = BACKENDS[options.backend](policy, layers, device, energy=options.energy or options.fidelity)
    patch = BudgetPatch(
        model=model,
        layers=layers,
        options=options,
        renormalizes=renormalizes,
        backend=backend,
        recorder=StatsRecorder(len(layers), device, energy=options.energy, fidelity=options.fidelity),
        ctx=DecodeContext(pad_token_id=pad_token_id, eos_token_ids=tuple(eos_token_ids)),
    )
    patch._handles.append(model.register_forward_pre_hook(patch._model_pre_hook, with_kwargs=True))
    for layer in layers:
        if selector is not None and backend.routes(layer):
            original = layer.router.forward
            layer.router.forward = lambda h, layer=layer, original=original: patch._route_select_forward(
                layer, original, h)
            patch._forwards[layer.index] = original
            continue
        hook = lambda mod, args, out, layer=layer: patch._router_hook(layer, mod, args, out)
        patch._handles.append(layer.router.register_forward_hook(hook))
    return patch
