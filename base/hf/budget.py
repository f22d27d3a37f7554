"""Budgeting a model: its MoE blocks become the project's own, driven one forward at a time.

    budget = install_budget(model, "qwen3_moe", selector, BudgetOptions(budget=16))
    with budget.bound(budget.inputs(decode=True, active_T=active_T)):
        model(...)                       # every MoE block keeps at most 16 experts for the batch
    rows = budget.stats_rows()           # one row per (MoE layer, recorded forward)
    budget.remove()                      # the model's own blocks again, exactly

`install_budget` replaces each family's sparse-MoE block by a `BudgetedMoE` (base/hf/moe_block.py)
holding the original's parts and the layer's selection (base/method/backends.py). Whoever drives
a forward asks `inputs()` for what the blocks need (which rows are active, whether this forward
selects and records: a decode step does, prefill stays dense unless apply_to=all) and binds it
with `bound()`; the engine (base/runtime/engine.py), the generate loop and the fidelity pass
(base/eval/) are the drivers. Statistics accumulate on the device (base/method/recorder.py).

Shapes: T tokens, E experts.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from base.hf.families import FAMILIES, Family, MoeLayer, find_moe_layers, softmax_topk
from base.hf.moe_block import BudgetedMoE, StepInputs
from base.method.backends import BACKENDS, make_dense_route, make_selection
from base.method.policy import Policy
from base.method.recorder import StatsRecorder
from base.method.selectors import Selector


@dataclass
class BudgetOptions:
    budget: int | None  # distinct experts kept per MoE layer per selecting forward; None: the union
    reassign: str = "backfill"
    renormalize: str = "model"  # model | always | never
    apply_to: str = "decode"  # decode | all (prefill too)
    record_stats: bool = True
    energy: bool = False  # record true retained energy (runs every routed expert)
    fidelity: bool = False  # also record the MoE-output error against dense (runs the experts twice more)
    backend: str = "torch"  # torch: base/method/routing.py; triton: kernels/ where the selector has them
    layer_budgets: dict[int, int] | None = None  # per MoE layer index (budget_split=sensitivity)


@dataclass
class _Installed:
    parent: nn.Module
    attr: str
    original: nn.Module
    owned: BudgetedMoE


class MoeBudget:
    """A budgeted model: its owned blocks, its policy, its recorded statistics, and `remove()`."""

    def __init__(self, model: nn.Module, family: Family, layers: list[MoeLayer], policy: Policy,
                 options: BudgetOptions, installed: list[_Installed], recorder: StatsRecorder) -> None:
        self.model, self.family, self.layers, self.policy, self.options = model, family, layers, policy, options
        self.recorder = recorder
        self._installed = installed
        # a trace of the selecting forwards (base/method/trace.py), set by the driver that wants it
        self.observe: Callable | None = None

    @property
    def selector(self) -> Selector | None:
        return self.policy.selector

    @property
    def blocks(self) -> list[BudgetedMoE]:
        return [i.owned for i in self._installed]

    def inputs(self, decode: bool, active_T: Tensor, *, reference: bool = False, record: bool = True) -> StepInputs:
        """What the blocks need for one forward. `reference`: the model's own (dense) routing with
        nothing recorded, the dense reference of a fidelity measurement on the same model;
        `record=False`: select as usual, record nothing."""
        applies = decode or self.options.apply_to == "all"
        select = applies and self.selector is not None and not reference
        recording = applies and record and self.options.record_stats and not reference
        return StepInputs(active_T, select, self.recorder if recording else None, decode,
                          observe=self.observe if select else None)

    def bind(self, inputs: StepInputs | None) -> None:
        """Hand every block the inputs of the forward(s) that follow (None: the model's own blocks'
        behaviour). A driver that cannot wrap each forward (transformers' generate) rebinds between them."""
        for block in self.blocks:
            block.step = inputs

    @contextmanager
    def bound(self, inputs: StepInputs) -> Iterator[None]:
        """The forwards inside run with `inputs`."""
        self.bind(inputs)
        try:
            yield
        finally:
            self.bind(None)

    def reset(self) -> None:
        self.recorder.reset()

    def stats_rows(self) -> list[dict[str, float]]:
        """One row per (layer, recorded forward); syncs the device once."""
        return self.recorder.rows() if self.options.record_stats else []

    def remove(self) -> None:
        """Put the model's own blocks back (the originals, untouched)."""
        for i in reversed(self._installed):
            setattr(i.parent, i.attr, i.original)
        self._installed = []


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def install_budget(model: nn.Module, family: str, selector: Selector | None, options: BudgetOptions) -> MoeBudget:
    """Own every MoE block of `model` under `selector` and `options`; `selector=None` changes
    nothing and records union statistics."""
    fam = FAMILIES.get(family)
    layers = find_moe_layers(model)
    if any(isinstance(model.get_submodule(layer.name), BudgetedMoE) for layer in layers):
        raise ValueError("the model is already budgeted: remove() the other budget first")
    if options.budget is not None and options.budget > layers[0].num_experts:
        raise ValueError(f"budget={options.budget} exceeds the {layers[0].num_experts} experts of the model")
    if options.backend not in BACKENDS:
        raise ValueError(f"unknown backend {options.backend!r}; valid: {', '.join(BACKENDS)}")
    renormalizes = fam.renormalizes(model.config)
    renorm = options.renormalize == "always" or (options.renormalize == "model" and renormalizes)
    policy = Policy(selector, options.budget, options.reassign, renorm, options.layer_budgets)
    device = model_device(model)
    if selector is not None:
        selector.artifacts = selector.artifacts.to(device)  # moved once: no step copies them
    # energy and fidelity statistics need the model's own router call: no fused route_select then
    fuse = not (options.energy or options.fidelity)
    installed = []
    for layer in layers:
        selection = dense = None
        router = softmax_topk(fam, layer.router, renormalizes) if fuse else None
        if selector is not None:
            selection = make_selection(options.backend, policy, layer.index, layer.num_experts,
                                       layer.router.weight.device, router)
        else:  # dense on the kernels when the backend is triton (the router in one launch, the union kept)
            dense = make_dense_route(options.backend, layer.index, layer.router.weight.device, router)
        parent_name, _, attr = layer.name.rpartition(".")
        parent = model.get_submodule(parent_name)
        original = getattr(parent, attr)
        owned = BudgetedMoE(original, layer.index, fam, selection, dense)
        setattr(parent, attr, owned)
        installed.append(_Installed(parent, attr, original, owned))
    recorder = StatsRecorder(len(layers), device, energy=options.energy, fidelity=options.fidelity)
    return MoeBudget(model, fam, layers, policy, options, installed, recorder)
