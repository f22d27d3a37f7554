"""Selectors: rules that rank the experts of a decode batch; the top `budget` are kept.

Shapes: T tokens, E routed experts, K top-k, L MoE layers, H hidden.
Notation: w_tu is the weight the model gives expert u for token t, S_t its top-k set, and sums run
over active tokens only (padding and finished sequences never score).

Most selectors are a per-pair term summed per expert (`aggregate_E`); they differ only in the term:
    router_sum    w
    router_sq     w^2
    count         1 (ties broken by router_sum)
    calib_energy  w^2 * mean calibration ||E_u||^2
    base          w^2 * exp(2 * g_u(z_t)), g the layer's linear predictor of log||E_u(z_t)||
    oracle        w^2 * ||E_u(z_t)||^2 (true norms; runs every routed expert)
`calib_freq` ranks by a static calibration frequency, `fixed` by expert id (no scoring: a timing
baseline), `oea` keeps each token's top-k0, and `top1_union` keeps the union of each token's first
choice, capped at the budget (the paper's selection-rule ablation).

A selector is declared once, by its class: how it scores, what it needs (norms, calibration, a
predictor, k0) and how the fused kernels can run it (`kernel_term` or `static_score`). The backends
(base/method/backends.py) dispatch on those declarations; conf/method/<name>.yaml only names it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from base.method.routing import RoutedBatch, aggregate_E, pair_counts_E, select_top_m
from base.registry import Registry
from kernels.terms import TERMS

SELECTORS: Registry[type[Selector]] = Registry("selector")


@dataclass
class Artifacts:
    """Per-layer statistics a selector may need; built by calibration and fitting."""

    freq_LE: Tensor | None = None  # fraction of calibration tokens routing to each expert
    energy_LE: Tensor | None = None  # mean ||E_u(z)||^2 over calibration tokens routed to u
    pred_w_LHE: Tensor | None = None  # linear predictor of log||E_u(z)||: z @ W + b
    pred_b_LE: Tensor | None = None
    sim_LEE: Tensor | None = None  # cosine similarity of experts' outputs on calibration inputs

    def to(self, device: torch.device) -> Artifacts:
        """The same statistics on `device` (moved once when a model is budgeted, so no step copies them)."""
        moved = {k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in vars(self).items()}
        return Artifacts(**moved)


class Selector:
    """Scores experts from a RoutedBatch; `keep` returns the kept set as a bool mask over E."""

    needs_norms = False  # the MoE block must compute true ||E_u(z_t)|| for routed pairs
    needs_calibration = False
    needs_predictor = False
    needs_k0 = False
    uses_budget = True
    supports_coverage = False  # scores are additive, non-negative costs (coverage is meaningful)
    # How the fused kernels can run it (method.backend=triton); neither: PyTorch under every backend.
    kernel_term: ClassVar[str | None] = None  # the per-pair term the kernels score (kernels/terms.py)
    static_score: ClassVar[bool] = False  # the score is a fixed per-layer vector (static_score_E)
    kernel_tier: ClassVar[str] = "none"  # how the kernels rank beyond the term (kernels/select.py TIERS)

    def __init__(self, artifacts: Artifacts | None = None, k0: int | None = None,
                 coverage: float | None = None, shrink: float | None = None) -> None:
        self.artifacts = artifacts or Artifacts()
        self.k0 = k0
        if shrink is not None:
            if not (self.needs_predictor and 0.0 <= shrink <= 1.0):
                raise ValueError(f"shrink={shrink}: needs 0 <= shrink <= 1 and a selector with a predictor "
                                 f"({', '.join(n for n in SELECTORS.names() if SELECTORS.get(n).needs_predictor)}); "
                                 f"got {self.name!r}")
            self.artifacts = shrunk(self.artifacts, shrink)
        self.shrink = shrink
        if self.needs_k0 and (k0 is None or k0 < 1):
            raise ValueError(f"{self.name} needs k0 >= 1 (method.k0), got {k0}")
        if coverage is not None and not (self.supports_coverage and 0 < coverage <= 1):
            raise ValueError(f"coverage={coverage}: needs 0 < coverage <= 1 and a selector of "
                             f"{', '.join(coverage_selectors())}; got {self.name!r}")
        self.coverage = coverage
        if self.needs_calibration and self.artifacts.freq_LE is None:
            raise ValueError(f"selector {self.name!r} needs calibration statistics")
        if self.needs_predictor and self.artifacts.pred_w_LHE is None:
            raise ValueError(f"selector {self.name!r} needs a fitted predictor")

    name = "?"

    def pair_term(self, batch: RoutedBatch) -> Tensor:  # -> term_TK
        raise NotImplementedError

    def kernel_inputs(self, layer: int) -> dict[str, Tensor]:
        """The per-layer tensors the kernel term needs (kernels.select_step's keyword names)."""
        return {}

    def static_score_E(self, layer: int, num_experts: int, device: torch.device) -> Tensor:
        """A static selector's score of every expert (fp32; the kernels take it as score_E)."""
        raise NotImplementedError(f"{self.name} has no static score")

    def score(self, batch: RoutedBatch) -> Tensor:  # -> score_E
        return aggregate_E(self.pair_term(batch), batch.topk_idx_TK, batch.active_T, batch.num_experts)

    def keep(self, batch: RoutedBatch, budget: int | None) -> tuple[Tensor, Tensor]:
        """(keep_E, score_E)."""
        score_E = self.score(batch)
        union_E = pair_counts_E(batch.topk_idx_TK, batch.active_T, batch.num_experts) > 0
        if self.coverage is not None:
            return select_top_m(score_E, union_E, coverage_count(score_E, union_E, self.coverage, budget)), score_E
        if budget is None:
            return union_E, score_E
        return select_top_m(score_E, union_E, budget), score_E


def shrunk(artifacts: Artifacts, alpha: float) -> Artifacts:
    """The predictor of log||E_u(z)|| pulled toward a layer-wide constant by 1 - alpha:
    g' = c + alpha (g - c). For any constant c the ranking of sum_t w^2 exp(2 g') equals that of
    sum_t w^2 exp(2 alpha g), since exp(2 (1 - alpha) c) factors out of the sum: so the predictor's
    weights and bias are scaled by alpha. alpha = 1 is `base`; alpha = 0 sets every predicted norm
    to 1, and `base`'s score becomes `router_sq`'s exactly (issue 41: how far to trust the norms)."""
    if artifacts.pred_w_LHE is None:
        return artifacts
    return dataclasses.replace(artifacts, pred_w_LHE=artifacts.pred_w_LHE * alpha, pred_b_LE=artifacts.pred_b_LE * alpha)


def coverage_count(score_E: Tensor, union_E: Tensor, coverage: float, budget: int | None) -> Tensor:
    """How many top-scored union experts cover `coverage` of the union's total score (at least
    one, at most `budget`): a 0-d tensor, computed without a host sync."""
    s_E = torch.where(union_E, score_E.to(torch.float32).clamp_min(0), 0.0).sort(descending=True).values
    cum_E = s_E.cumsum(0)
    # experts before the cumulative sum reaches the target, plus the one that reaches it
    m = (cum_E < coverage * cum_E[-1] * (1 - 1e-6)).sum() + 1
    m = torch.minimum(m, union_E.sum().clamp_min(1))
    return m if budget is None else m.clamp(max=budget)


def coverage_selectors() -> list[str]:
    return [n for n in SELECTORS.names() if SELECTORS.get(n).supports_coverage]


def register_selector(name: str):
    def deco(cls: type[Selector]) -> type[Selector]:
        if cls.kernel_term is not None and cls.kernel_term not in TERMS:
            raise ValueError(f"selector {name}: kernel_term {cls.kernel_term!r} is not one of {', '.join(TERMS)}")
        cls.name = name
        return SELECTORS.register(name)(cls)

    return deco


def _w(batch: RoutedBatch) -> Tensor:
    return batch.topk_w_TK.to(torch.float32)


@register_selector("router_sum")
class RouterSum(Selector):
    """The "router top-k" baseline: routing weight an expert receives, summed over the batch."""

    supports_coverage = True
    kernel_term = "router_sum"

    def pair_term(self, batch: RoutedBatch) -> Tensor:
        return _w(batch)


@register_selector("router_sq")
class RouterSq(Selector):
    """Squared routing weight: the cost model with every expert's output norm assumed equal."""

    supports_coverage = True
    kernel_term = "router_sq"

    def pair_term(self, batch: RoutedBatch) -> Tensor:
        return _w(batch) ** 2


@register_selector("count")
class Count(Selector):
    """How many tokens of the batch route to the expert; router_sum breaks ties."""

    kernel_term = "count"

    def score(self, batch: RoutedBatch) -> Tensor:
        args = (batch.topk_idx_TK, batch.active_T, batch.num_experts)
        router_sum_E = aggregate_E(_w(batch), *args)
        # router_sum < (its total + 1), so one more token always outranks any weight difference.
        # In fp32 the tie-break resolves router_sum differences down to ~1e-7 of T*K*(T+1): exact
        # enough for decode batches (T <= 128); the Triton kernel uses the same formula.
        return pair_counts_E(*args) * (router_sum_E.sum() + 1.0) + router_sum_E


@register_selector("calib_freq")
class CalibFreq(Selector):
    """Static: how often the expert was in a token's top-k on calibration data."""

    needs_calibration = True
    static_score = True

    def static_score_E(self, layer: int, num_experts: int, device: torch.device) -> Tensor:
        return self.artifacts.freq_LE[layer].to(device, torch.float32)

    def score(self, batch: RoutedBatch) -> Tensor:
        return self.static_score_E(batch.layer, batch.num_experts, batch.probs_TE.device)


@register_selector("calib_energy")
class CalibEnergy(Selector):
    """w^2 times the expert's mean squared output norm on calibration data (static energy)."""

    supports_coverage = True
    needs_calibration = True
    kernel_term = "calib_energy"

    def kernel_inputs(self, layer: int) -> dict[str, Tensor]:
        return {"energy_E": self.artifacts.energy_LE[layer].float()}

    def pair_term(self, batch: RoutedBatch) -> Tensor:
        energy_E = self.artifacts.energy_LE[batch.layer].to(batch.probs_TE.device, torch.float32)
        return _w(batch) ** 2 * energy_E[batch.topk_idx_TK]


@register_selector("fixed")
class Fixed(Selector):
    """No scoring: a fixed preference order (lower expert id first) over the batch's union.

    Not a quality rule: the baseline against which a selector's scoring overhead is timed, since it
    keeps M experts through the same select/backfill path without computing any score."""

    static_score = True

    def static_score_E(self, layer: int, num_experts: int, device: torch.device) -> Tensor:
        return -torch.arange(num_experts, device=device, dtype=torch.float32)

    def score(self, batch: RoutedBatch) -> Tensor:
        return self.static_score_E(batch.layer, batch.num_experts, batch.probs_TE.device)


def predicted_log_norm_TK(artifacts: Artifacts, batch: RoutedBatch) -> Tensor:
    """g_u(z_t) for the routed pairs only: gathers the K predictor columns each token needs."""
    w_HE = artifacts.pred_w_LHE[batch.layer].to(batch.z_TH.device, torch.float32)
    b_E = artifacts.pred_b_LE[batch.layer].to(batch.z_TH.device, torch.float32)
    w_THK = w_HE[:, batch.topk_idx_TK].permute(1, 0, 2)  # (T, H, K)
    z_T1H = batch.z_TH.to(torch.float32)[:, None, :]
    return torch.bmm(z_T1H, w_THK)[:, 0, :] + b_E[batch.topk_idx_TK]


@register_selector("base")
class Base(Selector):
    """BASE: w^2 * predicted ||E_u(z_t)||^2, the estimated change of the layer output if u is dropped."""

    supports_coverage = True
    needs_predictor = True
    kernel_term = "base"

    def kernel_inputs(self, layer: int) -> dict[str, Tensor]:
        return {"pred_w_HE": self.artifacts.pred_w_LHE[layer], "pred_b_E": self.artifacts.pred_b_LE[layer].float()}

    def pair_term(self, batch: RoutedBatch) -> Tensor:
        return _w(batch) ** 2 * torch.exp(2.0 * predicted_log_norm_TK(self.artifacts, batch))


@register_selector("oracle")
class Oracle(Selector):
    """BASE with the true ||E_u(z_t)||: an upper bound for analysis (runs every routed expert)."""

    supports_coverage = True

    needs_norms = True

    def pair_term(self, batch: RoutedBatch) -> Tensor:
        if batch.norms_TK is None:
            raise RuntimeError("oracle needs batch.norms_TK; the MoE block computes them when needs_norms")
        return (_w(batch) * batch.norms_TK.to(torch.float32)) ** 2


def first_choices_E(batch: RoutedBatch, k0: int) -> Tensor:
    """bool over E: experts among some active token's k0 most probable routed experts."""
    k0 = min(k0, batch.topk_idx_TK.shape[-1])
    # The model's top-k may not be sorted (DeepSeek uses sorted=False): rank it by probability.
    p_TK = batch.probs_TE.gather(1, batch.topk_idx_TK)
    first_TK0 = batch.topk_idx_TK.gather(1, p_TK.topk(k0, dim=-1).indices)
    return pair_counts_E(first_TK0, batch.active_T, batch.num_experts) > 0


@register_selector("oea")
class OEA(Selector):
    """Opportunistic Expert Activation: keep the union of every token's top-k0, ignore the budget."""

    uses_budget = False
    needs_k0 = True
    kernel_term = "router_sum"
    kernel_tier = "oea"

    def score(self, batch: RoutedBatch) -> Tensor:
        return aggregate_E(_w(batch), batch.topk_idx_TK, batch.active_T, batch.num_experts)

    def keep(self, batch: RoutedBatch, budget: int | None) -> tuple[Tensor, Tensor]:
        return first_choices_E(batch, self.k0), self.score(batch)


class Anchored(Selector):
    """Each active token's top-k0 experts first (anchors), then the rest of the budget by the
    selector's own score; backfill as usual. When the anchors alone exceed the budget, the budget
    keeps the anchors of highest score (a token may then lose an anchor). Scores: anchors get
    score + (total score + 1), so every anchor outranks every other expert; the returned score_E
    is the plain score (reassignment's fallback uses it)."""

    needs_k0 = True
    kernel_tier = "anchor"  # the kernels tier their own term (the base class's kernel_term)

    def keep(self, batch: RoutedBatch, budget: int | None) -> tuple[Tensor, Tensor]:
        score_E = self.score(batch)
        union_E = pair_counts_E(batch.topk_idx_TK, batch.active_T, batch.num_experts) > 0
        if budget is None:
            return union_E, score_E
        tiered_E = torch.where(first_choices_E(batch, self.k0), score_E + score_E.sum() + 1.0, score_E)
        return select_top_m(tiered_E, union_E, budget), score_E


@register_selector("base_anchor")
class BaseAnchor(Anchored, Base):
    """Anchored BASE: every token's top-k0 experts first, the rest by BASE's predicted removal cost
    (see Anchored). The issue's choice left open: over-budget anchors are ranked by BASE's cost."""

    supports_coverage = False  # the tiered score is not a cost


@register_selector("xshare")
class XShare(Anchored, RouterSum):
    """XShare-style budget (arXiv 2602.07265, vLLM PR #35551): rank experts by batch demand (summed
    router weight), with a per-token guarantee of its top experts. Its `top_per_token` is k0 and
    its `expert_budget` the budget. Choices: the guarantee yields to the budget when the
    guaranteed experts alone exceed it (ranked by demand), as in Anchored."""

    supports_coverage = False


@register_selector("lynx")
class Lynx(Anchored, Count):
    """Lynx-style batch-level expert reduction (arXiv 2411.08982): load-balancing skews make some
    experts serve many tokens of a batch; a token's low-affinity assignments (below its first
    choice) are remapped onto experts the batch already uses. Our reading, since the paper's
    AffinityBinning details are not public in a form we could follow: every token keeps its
    highest-affinity expert (k0, default 1 via method.k0), the rest of the budget goes to the
    experts most tokens route to (count, router weight breaking ties), and the dropped low-affinity
    assignments are backfilled within the kept set."""

    supports_coverage = False


@register_selector("top1_union")
class Top1Union(Selector):
    """The union of every token's first choice, capped at the budget (the paper's "top-1 union").

    Two tiers, so it keeps as many experts as the other selectors at the same budget:
    1. experts that are some active token's first choice (highest probability), ranked by the summed
       router weight of those first choices (the weight the batch would lose with them);
    2. then, if the budget has room left, the other union experts by router_sum.
    Scores: tier 1 is (R + 1) + first-choice weight, tier 2 router_sum <= R, R the batch's total
    router weight, so every first choice outranks every other expert."""

    kernel_term = "router_sum"
    kernel_tier = "top1_union"

    def score(self, batch: RoutedBatch) -> Tensor:
        args = (batch.topk_idx_TK, batch.active_T, batch.num_experts)
        w_TK = _w(batch)
        router_sum_E = aggregate_E(w_TK, *args)
        # The model's top-k may not be sorted (DeepSeek uses sorted=False): the first choice is the
        # routed expert of highest probability.
        first_T1 = batch.probs_TE.gather(1, batch.topk_idx_TK).argmax(dim=-1, keepdim=True)
        first_idx_T1 = batch.topk_idx_TK.gather(1, first_T1)
        first_w_E = aggregate_E(w_TK.gather(1, first_T1), first_idx_T1, batch.active_T, batch.num_experts)
        is_first_E = pair_counts_E(first_idx_T1, batch.active_T, batch.num_experts) > 0
        return torch.where(is_first_E, router_sum_E.sum() + 1.0 + first_w_E, router_sum_E)


def build_selector(name: str, artifacts: Artifacts | None = None, k0: int | None = None,
                   coverage: float | None = None, shrink: float | None = None) -> Selector:
    return SELECTORS.get(name)(artifacts=artifacts, k0=k0, coverage=coverage, shrink=shrink)
