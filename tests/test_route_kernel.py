"""The one-launch selection kernel (kernels/select.py) for every rule, against the PyTorch references.

The router's GEMM in the same launch (`route_select_gemv`, many programs, the last one selects),
anchored tiers (base_anchor, xshare, lynx), top1_union, oea, coverage and `similar` re-routing:
each compared with `Selector.keep` + `reassign` of base/method/ on the same routing. CPU tensors run
through Triton's interpreter; every buffer the wrappers allocate is poisoned (NaN / -7777).
Shapes: T tokens, H hidden, E experts, K top-k, M budget.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import kernels._triton as kt
from base.method.routing import RoutedBatch, pair_counts_E, reassign
from base.method.selectors import Artifacts, build_selector
from base.runtime.graphs import capture_outputs as capture_graph
from kernels import fuse_router_predictor
from kernels.select import (
    Rule,
    arrival_counter,
    route_select,
    route_select_gemv,
    select_reassign,
    union_fits,
)


@pytest.fixture(autouse=True)
def poison():
    kt.POISON = True
    yield
    kt.POISON = False


def _artifacts(E: int, H: int, seed: int = 0) -> Artifacts:
    g = torch.Generator().manual_seed(seed)
    sim = torch.rand(2, E, E, generator=g)
    return Artifacts(freq_LE=torch.rand(2, E, generator=g), energy_LE=torch.rand(2, E, generator=g),
                     pred_w_LHE=torch.randn(2, H, E, generator=g) * 0.1, pred_b_LE=torch.randn(2, E, generator=g) * 0.3,
                     sim_LEE=(sim + sim.transpose(1, 2)) / 2)  # fmt: skip


def _inputs(T: int, E: int, H: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x_TH = torch.randn(T, H, generator=g)
    w_EH = torch.randn(E, H, generator=g) / H**0.5 * 3
    active_T = torch.rand(T, generator=g) > 0.2
    active_T[0] = True
    return x_TH, w_EH, active_T


def _same_routing(idx_TK, w_TK, ref_idx_TK, ref_w_TK, rtol=1e-5):
    o_idx, o = idx_TK.sort(-1)
    r_idx, r = ref_idx_TK.sort(-1)
    assert torch.equal(o_idx, r_idx)
    torch.testing.assert_close(w_TK.gather(1, o).float(), ref_w_TK.gather(1, r).float(), rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("T,E,K,H,kind,norm", [(5, 64, 8, 48, "base", True), (16, 60, 4, 40, "router_sum", False),
                                               (33, 128, 8, 32, "count", True)])
def test_gemv_routes_and_selects_as_linear_softmax_topk_and_reference(T, E, K, H, kind, norm):
    """Router GEMM (+ predictor GEMM) + softmax + top-k + selection in one launch of many programs."""
    x_TH, w_EH, active_T = _inputs(T, E, H, seed=T + E)
    art = _artifacts(E, H)
    M = 7
    weight = fuse_router_predictor(w_EH, art.pred_w_LHE[1]) if kind == "base" else w_EH
    counter = arrival_counter(x_TH.device)
    routing, sel = route_select_gemv(x_TH, weight, E, K, active_T, M, norm_topk=norm, kind=kind,
                                     pred_b_E=art.pred_b_LE[1], counter=counter)  # fmt: skip
    assert counter.item() == 0  # the last program leaves it ready for the next launch (graph replay)
    probs_TE = F.linear(x_TH, w_EH).softmax(-1)
    w_TK, idx_TK = probs_TE.topk(K, dim=-1)
    if norm:
        w_TK = w_TK / w_TK.sum(-1, keepdim=True)
    torch.testing.assert_close(routing.probs_TE, probs_TE, rtol=1e-5, atol=1e-7)
    assert torch.equal(routing.topk_idx_TK, idx_TK)
    torch.testing.assert_close(routing.topk_w_TK, w_TK, rtol=1e-5, atol=1e-6)
    batch = RoutedBatch(x_TH, probs_TE, idx_TK, routing.topk_w_TK, active_T, layer=1)
    selector = build_selector(kind, art)
    union_E = pair_counts_E(idx_TK, active_T, E) > 0
    torch.testing.assert_close(sel.score_E[union_E], selector.score(batch)[union_E], rtol=1e-4, atol=1e-6)
    keep_E, _ = selector.keep(batch, M)
    assert torch.equal(sel.keep_E, keep_E)
    r_idx, r_w = reassign(batch, keep_E, sel.score_E)
    _same_routing(sel.topk_idx_TK, sel.topk_w_TK, r_idx, r_w)
    kept = sel.keep_M[sel.keep_M >= 0]
    assert sorted(kept.tolist()) == keep_E.nonzero().flatten().tolist() and len(kept) == min(M, int(union_E.sum()))


RULES = [  # selector, k0, budget
    ("base_anchor", 1, 6), ("base_anchor", 2, 9), ("xshare", 1, 5), ("lynx", 2, 7), ("top1_union", None, 4),
    ("top1_union", None, 12), ("oea", 1, None), ("oea", 2, None),
]


def _kernel_rule(name: str, k0: int | None, **kw) -> tuple[str, Rule]:
    """The kernel's view of a selector (what base/method/backends.py derives from it)."""
    sel = build_selector(name, _artifacts(8, 8), k0=k0)
    return sel.kernel_term or "router_sum", Rule(tier=sel.kernel_tier, k0=k0 or 1, **kw)


@pytest.mark.parametrize("name,k0,budget", RULES)
@pytest.mark.parametrize("route", [True, False])
def test_tiered_rules_keep_and_reassign_as_their_selectors(name, k0, budget, route):
    T, E, K, H = 16, 32, 4, 24
    x_TH, w_EH, active_T = _inputs(T, E, H, seed=len(name) + (k0 or 0))
    art = _artifacts(E, H, seed=3)
    kind, rule = _kernel_rule(name, k0)
    logits_TE = F.linear(x_TH, w_EH)
    g_TE = x_TH @ art.pred_w_LHE[1]
    kw = dict(kind=kind, g_TE=g_TE, pred_b_E=art.pred_b_LE[1], rule=rule)  # noqa: C408
    if route:
        routing, sel = route_select(logits_TE, K, active_T, budget, norm_topk=True, **kw)
        batch = RoutedBatch(x_TH, routing.probs_TE, routing.topk_idx_TK, routing.topk_w_TK, active_T, layer=1)
    else:  # after the model's router, its top-k unsorted (as DeepSeek's sorted=False)
        probs_TE = logits_TE.softmax(-1)
        w_TK, idx_TK = probs_TE.topk(K, dim=-1)
        perm = torch.randperm(K, generator=torch.Generator().manual_seed(1))
        batch = RoutedBatch(x_TH, probs_TE, idx_TK[:, perm], (w_TK / w_TK.sum(-1, keepdim=True))[:, perm], active_T, 1)
        sel = select_reassign(batch.probs_TE, batch.topk_idx_TK, batch.topk_w_TK, active_T, budget, **kw)
    selector = build_selector(name, art, k0=k0)
    keep_E, score_E = selector.keep(batch, budget if selector.uses_budget else None)
    assert torch.equal(sel.keep_E, keep_E)
    torch.testing.assert_close(sel.score_E, score_E, rtol=1e-5, atol=1e-6)
    if budget is not None:
        assert int(keep_E.sum()) <= budget
    r_idx, r_w = reassign(batch, keep_E, score_E)
    _same_routing(sel.topk_idx_TK, sel.topk_w_TK, r_idx, r_w)


@pytest.mark.parametrize("name,coverage,budget", [("router_sum", 0.9, None), ("base", 0.8, 6), ("router_sq", 0.5, 40)])
def test_coverage_keeps_as_coverage_count(name, coverage, budget):
    T, E, K, H = 12, 48, 6, 16
    x_TH, w_EH, active_T = _inputs(T, E, H, seed=7)
    art = _artifacts(E, H, seed=5)
    routing, sel = route_select(F.linear(x_TH, w_EH), K, active_T, budget, norm_topk=True, kind=name,
                                g_TE=x_TH @ art.pred_w_LHE[1], pred_b_E=art.pred_b_LE[1],
                                rule=Rule(coverage=coverage))  # fmt: skip
    batch = RoutedBatch(x_TH, routing.probs_TE, routing.topk_idx_TK, routing.topk_w_TK, active_T, layer=1)
    keep_E, _ = build_selector(name, art, coverage=coverage).keep(batch, budget)
    assert torch.equal(sel.keep_E, keep_E)
    assert 1 <= int(keep_E.sum()) <= (budget or E)


def test_similar_reroutes_each_dropped_pair_to_its_most_similar_kept_expert():
    T, E, K, H, M = 16, 32, 4, 16, 6
    x_TH, w_EH, active_T = _inputs(T, E, H, seed=11)
    art = _artifacts(E, H, seed=2)
    routing, sel = route_select(F.linear(x_TH, w_EH), K, active_T, M, norm_topk=True, sim_EE=art.sim_LEE[1],
                                rule=Rule(reassign_mode="similar"))  # fmt: skip
    batch = RoutedBatch(x_TH, routing.probs_TE, routing.topk_idx_TK, routing.topk_w_TK, active_T, layer=1)
    keep_E, score_E = build_selector("router_sum").keep(batch, M)
    assert torch.equal(sel.keep_E, keep_E)
    r_idx, r_w = reassign(batch, keep_E, score_E, "similar", sim_EE=art.sim_LEE[1])
    assert torch.equal(sel.topk_idx_TK, r_idx) and torch.equal(sel.topk_w_TK, r_w)


def test_dense_route_keeps_the_union_and_the_model_routing_bit_identical():
    """budget None, no tier: the kept list is the union and no active token is rerouted (the fused
    dense path; inactive rows, whose experts are not in the union, move to kept ones as in reassign)."""
    T, E, K, H = 9, 64, 8, 32
    x_TH, w_EH, active_T = _inputs(T, E, H, seed=4)
    routing, sel = route_select_gemv(x_TH, w_EH, E, K, active_T, None, norm_topk=False)
    union_E = pair_counts_E(routing.topk_idx_TK, active_T, E) > 0
    assert torch.equal(sel.keep_E, union_E)
    a = active_T
    assert torch.equal(sel.topk_idx_TK[a], routing.topk_idx_TK[a]) and torch.equal(sel.topk_w_TK[a], routing.topk_w_TK[a])
    assert sel.keep_M.shape == (E,) and int((sel.keep_M >= 0).sum()) == int(union_E.sum())


@pytest.mark.parametrize("name,k0", [("router_sum", None), ("base", None), ("base_anchor", 1), ("top1_union", None),
                                     ("oea", 1)])
@pytest.mark.parametrize("all_active", [True, False])
def test_a_union_that_fits_in_the_budget_keeps_every_routed_expert(name, k0, all_active):
    """T*K <= budget: no rule but oea (anchors only) can drop an expert, so the kernel skips the
    reassignment (pass 2) unless a token is inactive; either way it decides as the reference."""
    T, E, K, H, M = 3, 32, 4, 16, 12
    x_TH, w_EH, active_T = _inputs(T, E, H, seed=21)
    active_T = torch.ones(T, dtype=torch.bool) if all_active else torch.tensor([True, False, True])
    art = _artifacts(E, H, seed=4)
    kind, rule = _kernel_rule(name, k0)
    assert union_fits(rule, M, T, K, E) == (name != "oea")
    assert not union_fits(rule, M - 1, T, K, E) and not union_fits(Rule(coverage=0.9), M, T, K, E)
    routing, sel = route_select(F.linear(x_TH, w_EH), K, active_T, M, norm_topk=True, kind=kind,
                                g_TE=x_TH @ art.pred_w_LHE[1], pred_b_E=art.pred_b_LE[1], rule=rule)  # fmt: skip
    batch = RoutedBatch(x_TH, routing.probs_TE, routing.topk_idx_TK, routing.topk_w_TK, active_T, layer=1)
    selector = build_selector(name, art, k0=k0)
    keep_E, score_E = selector.keep(batch, M if selector.uses_budget else None)
    assert torch.equal(sel.keep_E, keep_E)
    r_idx, r_w = reassign(batch, keep_E, score_E)
    _same_routing(sel.topk_idx_TK, sel.topk_w_TK, r_idx, r_w)
    if name != "oea":
        assert torch.equal(keep_E, pair_counts_E(routing.topk_idx_TK, active_T, E) > 0)  # the whole union
        a = active_T
        assert torch.equal(sel.topk_idx_TK[a], routing.topk_idx_TK[a])
        assert torch.equal(sel.topk_w_TK[a], routing.topk_w_TK[a])


@pytest.mark.parametrize("name,k0", [("base_anchor", 1), ("xshare", 2), ("lynx", 1), ("top1_union", None)])
@pytest.mark.parametrize("route", [True, False])
def test_a_tiered_rule_whose_union_fits_runs_the_tier_free_launch(name, k0, route):
    """When the union fits, a tier can change only the kept list's order: the launch skips the tier
    and is the tier-free launch of the same kind, score and kept list's order included (the batch-1
    step of `top1_union` or an anchored rule then costs what dense's does). Where the budget binds,
    the tier still ranks (the top1_union score differs from router_sum's)."""
    T, E, K, H, M = 3, 32, 4, 16, 12
    x_TH, w_EH, active_T = _inputs(T, E, H, seed=31)
    active_T = torch.tensor([True, False, True])
    art = _artifacts(E, H, seed=5)
    kind, rule = _kernel_rule(name, k0)
    plain = Rule(k0=rule.k0)
    logits_TE = F.linear(x_TH, w_EH)
    kw = dict(kind=kind, g_TE=x_TH @ art.pred_w_LHE[1], pred_b_E=art.pred_b_LE[1])  # noqa: C408

    def launch(budget: int, r: Rule):
        if route:
            return route_select(logits_TE, K, active_T, budget, norm_topk=True, rule=r, **kw)[1]
        probs_TE = logits_TE.softmax(-1)
        w_TK, idx_TK = probs_TE.topk(K, dim=-1)
        return select_reassign(probs_TE, idx_TK, w_TK, active_T, budget, rule=r, **kw)

    tiered, tier_free = launch(M, rule), launch(M, plain)
    for field in ("keep_M", "keep_E", "score_E", "topk_idx_TK", "topk_w_TK"):
        assert torch.equal(getattr(tiered, field), getattr(tier_free, field)), field
    if name == "top1_union":  # the control: a binding budget ranks by the tier
        assert not torch.equal(launch(2, rule).score_E, launch(2, plain).score_E)


@pytest.mark.parametrize("T,E,K,M,mode,tier,ties", [(20, 64, 6, 7, "backfill", "none", False),
                                                     (16, 32, 8, 3, "backfill", "anchor", True),
                                                     (9, 48, 4, 12, "drop", "none", True),
                                                     (33, 128, 8, 32, "backfill", "top1_union", False),
                                                     (16, 64, 6, None, "backfill", "oea", True)])
def test_backfill_over_the_kept_list_equals_backfill_over_all_experts(monkeypatch, T, E, K, M, mode, tier, ties):
    """The two reassignment paths of the kernel (pairwise places over the M kept experts, for
    budgets up to KEPT_LIST_MAX; K rounds of argmax over all E above) give identical routings,
    ties in probability included. `oea` (no budget) keeps at most T * k0 experts, its kept list's length."""
    import kernels.select as ks

    x_TH, w_EH, active_T = _inputs(T, E, 16, seed=T + (M or 0))
    logits_TE = F.linear(x_TH, w_EH)
    if ties:  # equal logits: equal probabilities, broken by the lower expert id
        logits_TE[:, 1::2] = logits_TE[:, 0::2]
    rule = Rule(tier=tier, reassign_mode=mode)
    out = []
    for limit in (ks.KEPT_LIST_MAX, 0):
        monkeypatch.setattr(ks, "KEPT_LIST_MAX", limit)
        out.append(route_select(logits_TE, K, active_T, M, norm_topk=True, rule=rule)[1])
    assert torch.equal(out[0].keep_E, out[1].keep_E) and torch.equal(out[0].keep_M, out[1].keep_M)
    assert out[0].keep_M.shape == (min(E, T) if tier == "oea" else M,)
    assert torch.equal(out[0].topk_idx_TK, out[1].topk_idx_TK) and torch.equal(out[0].topk_w_TK, out[1].topk_w_TK)


@pytest.mark.parametrize("tier,M", [pytest.param("none", 6, marks=pytest.mark.slow), ("anchor", 12)])
def test_the_tile_size_changes_no_routing_bit(tier, M):
    """The launch's tokens per tile (tuned per GPU) only splits the kernel's loops over tokens:
    1, 4 and 32 tokens per step route, keep and reassign exactly as 16 do (T = 21: a partial last
    tile); the score, a sum over tokens, only up to float rounding (another summation order)."""
    from kernels.select import SelectLaunch

    T, E, K, H = 21, 64, 6, 16
    x_TH, w_EH, active_T = _inputs(T, E, H, seed=5)
    art = _artifacts(E, H, seed=2)
    logits_TE = F.linear(x_TH, w_EH)
    kw = dict(norm_topk=True, kind="base", g_TE=x_TH @ art.pred_w_LHE[0], pred_b_E=art.pred_b_LE[0],  # noqa: C408
              rule=Rule(tier=tier))
    ref_routing, ref = route_select(logits_TE, K, active_T, M, launch=SelectLaunch(tokens_per_tile=16), **kw)
    for tb in (1, 4, 32):
        routing, sel = route_select(logits_TE, K, active_T, M, launch=SelectLaunch(num_warps=1, tokens_per_tile=tb), **kw)
        assert torch.equal(routing.topk_idx_TK, ref_routing.topk_idx_TK)
        assert torch.equal(sel.keep_M, ref.keep_M)
        torch.testing.assert_close(sel.score_E, ref.score_E, rtol=1e-6, atol=0)
        assert torch.equal(sel.topk_idx_TK, ref.topk_idx_TK) and torch.equal(sel.topk_w_TK, ref.topk_w_TK)


def _rule_case(kind: str, tier: str, coverage, mode: str, idle: bool, seeds: tuple[int, int, int]):
    """(logits_TE, active_T, route_select keywords) of one rule at T = 37, E = 64, H = 16: the
    inputs of the tests that compare two launch forms of the same rule."""
    T, E, H = 37, 64, 16
    x_TH, w_EH, active_T = _inputs(T, E, H, seed=seeds[0])
    if not idle:
        active_T = torch.ones_like(active_T)
    art = _artifacts(E, H, seed=seeds[1])
    sim = torch.rand(E, E, generator=torch.Generator().manual_seed(seeds[2])) if mode == "similar" else None
    kw = dict(kind=kind, rule=Rule(tier=tier, k0=1, coverage=coverage, reassign_mode=mode), sim_EE=sim)  # noqa: C408
    if kind == "base":
        kw.update(g_TE=x_TH @ art.pred_w_LHE[0], pred_b_E=art.pred_b_LE[0])
    return F.linear(x_TH, w_EH), active_T, kw


SPLIT_RULES = [  # kind, tier, coverage, reassign, budget, inactive rows, after the router (no ROUTE)
    ("base", "none", None, "backfill", 6, True, False), ("router_sum", "anchor", None, "backfill", 12, True, False),
    ("router_sum", "top1_union", None, "backfill", 9, False, False), ("router_sq", "oea", None, "backfill", None, True, False),
    ("router_sum", "none", 0.8, "drop", 10, True, False), ("count", "none", None, "similar", 7, False, False),
    ("router_sum", "none", None, "backfill", 64, True, False), ("base", "none", None, "backfill", 6, True, True),
]


def _launch_forms_agree(kind, tier, coverage, mode, M, idle, after, launches, seeds) -> None:
    """One rule's case (`_rule_case`) through each launch in turn: every launch's routing (where the
    kernel routes), score, kept set and reassignment equal the first's bit for bit."""
    from kernels.select import select_reassign

    E, K = 64, 6
    logits_TE, active_T, kw = _rule_case(kind, tier, coverage, mode, idle, seeds=seeds)
    outs = []
    for launch in launches:
        if after:
            probs_TE = logits_TE.softmax(-1)
            w_TK, idx_TK = probs_TE.topk(K, dim=-1)
            outs.append((None, select_reassign(probs_TE, idx_TK, w_TK / w_TK.sum(-1, keepdim=True), active_T, M,
                                               launch=launch, **kw)))
        else:
            outs.append(route_select(logits_TE, K, active_T, M, norm_topk=True, launch=launch, **kw))
    (r1, s1), *others = outs
    for r2, s2 in others:
        if r1 is not None:
            for a, b in zip((r1.probs_TE, r1.topk_idx_TK, r1.topk_w_TK), (r2.probs_TE, r2.topk_idx_TK, r2.topk_w_TK)):
                assert torch.equal(a, b)
        for a, b in zip((s1.score_E, s1.keep_E, s1.keep_M, s1.topk_idx_TK, s1.topk_w_TK),
                        (s2.score_E, s2.keep_E, s2.keep_M, s2.topk_idx_TK, s2.topk_w_TK)):
            assert torch.equal(a, b)
        assert int(s2.keep_E.sum()) <= (M or E)


@pytest.mark.parametrize("kind,tier,coverage,mode,M,idle,after", SPLIT_RULES)
def test_the_split_launch_gives_the_one_program_launch_bit_for_bit(kind, tier, coverage, mode, M, idle, after):
    """SelectLaunch(split=True): one program per tile of tokens in two launches (each tile's routing
    and partial sums, then every program ranks from the partials and reassigns its tile) against
    the one-program launch at T = 37 (three tiles of 16, the last partial): routing, score, kept set
    and reassignment equal bit for bit, for every tier, coverage, `drop`/`similar`, a budget the union
    fits (64: pass 2 only for inactive rows), and after the model's own router (select_reassign)."""
    from kernels.select import SelectLaunch

    _launch_forms_agree(kind, tier, coverage, mode, M, idle, after, seeds=(7, 3, 4),
                        launches=[SelectLaunch(tokens_per_tile=16, split=split) for split in (False, True)])


def test_a_launch_with_nothing_to_drop_asks_for_the_route_entry(monkeypatch):
    """route_select looks its launch up as selecting exactly where experts may be dropped: dense (no
    budget) and a budget the union fits ask for the route-only entry; base under a budget it can
    exceed, for the selecting one."""
    from kernels import select

    asked = []
    real = select.select_launch
    monkeypatch.setattr(select, "select_launch", lambda E, T, dev, selects=True: asked.append(selects) or real(E, T, dev, selects))
    T, E, K, H = 6, 16, 2, 8
    x_TH, w_EH, active_T = _inputs(T, E, H, seed=2)
    logits_TE = x_TH @ w_EH.T
    for budget, want in ((None, False), (E, False), (3, True)):
        asked.clear()
        route_select(logits_TE, K, active_T, budget, norm_topk=True)
        assert asked == [want], budget


def test_the_tuned_launch_is_read_by_token_bucket_and_bad_launches_are_refused(monkeypatch):
    from kernels import tuned
    from kernels.select import SelectLaunch, select_launch

    table = {"select:E=128,T=16": {"num_warps": 2, "TB": 8}, "select:E=128,T=64": {"num_warps": 4, "TB": 32}}
    monkeypatch.setattr(tuned, "load_configs", lambda name: table)
    dev = torch.device("cpu")
    assert select_launch(128, 16, dev) == SelectLaunch(num_warps=2, tokens_per_tile=8)
    assert select_launch(100, 12, dev) == SelectLaunch(num_warps=2, tokens_per_tile=8)  # E 100 -> block 128, T 12 -> 16
    assert select_launch(128, 1, dev) == SelectLaunch(num_warps=2, tokens_per_tile=8)  # nearest bucket: 16
    assert select_launch(128, 50, dev) == SelectLaunch(num_warps=4, tokens_per_tile=32)
    assert select_launch(64, 16, dev) == SelectLaunch(num_warps=4, tokens_per_tile=16)  # untuned: the default
    assert select_launch(128, 16, dev, selects=False) == SelectLaunch(num_warps=2, tokens_per_tile=8)  # no route: entry
    table["route:E=128,T=16"] = {"num_warps": 4, "TB": 16, "split": False}
    assert select_launch(128, 16, dev, selects=False) == SelectLaunch(num_warps=4, tokens_per_tile=16)
    assert select_launch(128, 16, dev) == SelectLaunch(num_warps=2, tokens_per_tile=8)  # a selecting launch: select:
    # the entry tuned nearest T serves a launch with nothing to drop: select: at 64 tokens, not route: at 16;
    # where both are as near (1 token: 16 is the nearest of each), the route: one
    assert select_launch(128, 64, dev, selects=False) == SelectLaunch(num_warps=4, tokens_per_tile=32)
    assert select_launch(128, 1, dev, selects=False) == SelectLaunch(num_warps=4, tokens_per_tile=16)
    table["route:E=128,T=64"] = {"num_warps": 8, "TB": 4, "split": True}
    assert select_launch(128, 64, dev, selects=False) == SelectLaunch(num_warps=8, tokens_per_tile=4, split=True)
    assert select_launch(128, 64, dev) == SelectLaunch(num_warps=4, tokens_per_tile=32)
    monkeypatch.setenv("BASE_KERNELS_NO_TUNED", "1")
    assert select_launch(128, 16, dev) == SelectLaunch()
    with pytest.raises(ValueError, match="num_warps must be one of"):
        SelectLaunch(num_warps=3)
    with pytest.raises(ValueError, match="tokens_per_tile must be a power of two"):
        SelectLaunch(tokens_per_tile=12)


def test_the_nearest_bucket_does_not_depend_on_the_tables_key_order():
    from kernels.tuned import nearest_key

    # 4 tokens are two doublings from both 1 and 16, 32 one from both 16 and 64, 8 one from 4 and 16;
    # a sorted file lists "16" before "4", so key order alone would give 4-or-16 differently by file
    for keys in (["1", "16", "64"], ["64", "16", "1"], ["16", "1", "64"]):
        table = {f"select:E=128,T={k}": {} for k in keys}
        assert nearest_key(table, "select:E=128", 3) == "select:E=128,T=1"
        assert nearest_key(table, "select:E=128", 4) == "select:E=128,T=1"
        assert nearest_key(table, "select:E=128", 17) == "select:E=128,T=16"
        assert nearest_key(table, "select:E=128", 5) == "select:E=128,T=16"  # bucket 8: one doubling from 16
        assert nearest_key(table, "select:E=128", 500) == "select:E=128,T=64"  # past the largest bucket
    for keys in (["4", "16"], ["16", "4"]):
        table = {f"H=8,I=4,T={k}": {} for k in keys}
        assert nearest_key(table, "H=8,I=4", 8) == "H=8,I=4,T=4"
        assert nearest_key(table, "H=8,I=4", 16) == "H=8,I=4,T=16"  # its own bucket
    assert nearest_key({"select:E=64,T=16": {}}, "select:E=128", 16) is None  # another prefix is not read


def test_bad_rules_are_refused():
    x_TH, w_EH, active_T = _inputs(4, 16, 8, seed=0)
    with pytest.raises(ValueError, match="top1_union"):
        route_select_gemv(x_TH, w_EH, 16, 2, active_T, 4, norm_topk=True, kind="base", rule=Rule(tier="top1_union"))
    with pytest.raises(ValueError, match="similarity"):
        route_select_gemv(x_TH, w_EH, 16, 2, active_T, 4, norm_topk=True, rule=Rule(reassign_mode="similar"))
    with pytest.raises(ValueError, match="does not fit"):
        route_select_gemv(x_TH, w_EH[:, :4], 16, 2, active_T, 4, norm_topk=True)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("T,kind", [(1, "base"), (16, "base"), (16, "router_sum"), (64, "base")])
def test_gpu_gemv_route_in_a_graph_equals_eager_and_the_reference(T, kind):
    """Compiled: the many-program GEMV with its last-program selection, two layers in one CUDA graph
    (the counter is reused and returns to 0), replays equal eager; logits as bf16 F.linear."""
    from kernels.experts import fused_experts

    E, K, H, I, M = 128, 8, 2048, 768, 16
    dev = "cuda"
    x_TH, w_EH, active_T = (t.to(dev) for t in _inputs(T, E, H, seed=T))
    x_TH, w_EH = x_TH.bfloat16(), w_EH.bfloat16()
    art = _artifacts(E, H)
    weight = fuse_router_predictor(w_EH, art.pred_w_LHE[1].to(dev)) if kind == "base" else w_EH
    pb = art.pred_b_LE[1].to(dev)
    counters = [arrival_counter(torch.device(dev)) for _ in range(2)]
    g = torch.Generator().manual_seed(0)
    gu = (torch.randn(E, 2 * I, H, generator=g) / H**0.5).to(dev, torch.bfloat16)
    dn = (torch.randn(E, H, I, generator=g) / I**0.5).to(dev, torch.bfloat16)

    def step():
        outs = []
        for c in counters:  # two "layers"
            routing, sel = route_select_gemv(x_TH, weight, E, K, active_T, M, norm_topk=True, kind=kind, pred_b_E=pb,
                                             counter=c)  # fmt: skip
            outs += [routing.topk_idx_TK, sel.keep_M, sel.topk_w_TK,
                     fused_experts(x_TH, gu, dn, sel.topk_idx_TK, sel.topk_w_TK, keep_M=sel.keep_M)]
        return outs

    kt.POISON = False
    eager = [t.clone() for t in step()]
    assert all(int(c.item()) == 0 for c in counters)
    replay, static = capture_graph(step)
    for _ in range(3):
        replay()
    torch.cuda.synchronize()
    for a, b in zip(static, eager):
        assert torch.equal(a, b)  # deterministic: bit-identical
    assert all(int(c.item()) == 0 for c in counters)
    # against torch: bf16 logits, fp32 softmax, top-k (ties aside: compare the chosen probabilities)
    probs = F.linear(x_TH, w_EH).float().softmax(-1)
    routing, sel = route_select_gemv(x_TH, weight, E, K, active_T, M, norm_topk=True, kind=kind, pred_b_E=pb)
    torch.testing.assert_close(routing.probs_TE, probs, rtol=2e-2, atol=1e-4)
    chosen = probs.gather(1, routing.topk_idx_TK).sort(-1, descending=True).values
    torch.testing.assert_close(chosen, probs.topk(K, -1).values, rtol=2e-2, atol=1e-4)
    assert int((sel.keep_M >= 0).sum()) <= M
    ref = experts_ref_rows(x_TH, gu, dn, sel)
    out = fused_experts(x_TH, gu, dn, sel.topk_idx_TK, sel.topk_w_TK, keep_M=sel.keep_M)
    rows = min(T, 4)
    assert ((out[:rows].double().cpu() - ref).norm() / ref.norm()).item() < 1e-2


def experts_ref_rows(x_TH, gu, dn, sel, rows: int = 4):
    from kernels.experts import experts_reference

    r = min(rows, x_TH.shape[0])
    return experts_reference(x_TH[:r].cpu(), gu.cpu(), dn.cpu(), sel.topk_idx_TK[:r].cpu(), sel.topk_w_TK[:r].cpu())


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("T,tb,tier", [(64, 16, "none"), (64, 32, "anchor"), (16, 4, "none")])
def test_gpu_split_launch_equals_the_one_program_launch_eagerly_and_replayed(T, tb, tier):
    """On the GPU, in bf16 at the Qwen3-30B-A3B router's shape (E = 128, K = 8, M = 16): the split
    selection (two launches, one program per tile) gives the one-program launch's routing, score,
    kept set and reassignment bit for bit, eagerly and replayed in one CUDA graph."""
    from kernels.select import SelectLaunch

    E, K, H, M = 128, 8, 2048, 16
    dev = "cuda"
    x_TH, w_EH, active_T = (t.to(dev) for t in _inputs(T, E, H, seed=T + tb))
    art = _artifacts(E, H, seed=1)
    wcat = fuse_router_predictor(w_EH.bfloat16(), art.pred_w_LHE[0].to(dev))
    from kernels.score import fused_router_logits

    logits_TE, g_TE = fused_router_logits(x_TH.bfloat16(), wcat)
    kw = dict(norm_topk=True, kind="base", g_TE=g_TE, pred_b_E=art.pred_b_LE[0].to(dev), rule=Rule(tier=tier))  # noqa: C408

    def run(split: bool):
        launch = SelectLaunch(tokens_per_tile=tb, split=split)
        routing, sel = route_select(logits_TE, K, active_T, M, launch=launch, **kw)
        return [routing.topk_idx_TK, routing.topk_w_TK, sel.score_E, sel.keep_E, sel.keep_M, sel.topk_idx_TK,
                sel.topk_w_TK]

    one = [t.clone() for t in run(False)]
    split = [t.clone() for t in run(True)]
    for a, b in zip(one, split):
        assert torch.equal(a, b)
    kt.POISON = False
    replay, static = capture_graph(lambda: run(True))
    for _ in range(3):
        replay()
    torch.cuda.synchronize()
    for a, b in zip(static, one):
        assert torch.equal(a, b)
    assert int((one[4] >= 0).sum()) == M


def _committed_select_entries() -> list[tuple[str, str]]:
    """(table, key) of every `select:` entry in the committed tables."""
    from kernels.tuned import CONFIG_DIR

    return [(path.stem, key) for path in sorted(CONFIG_DIR.glob("*.json"))
            for key in sorted(json.loads(path.read_text())) if key.startswith("select:")]


@pytest.mark.slow
@pytest.mark.parametrize("table,key", _committed_select_entries())
def test_every_committed_selection_launch_routes_as_the_default_launch(monkeypatch, table, key):
    """Each committed table's `select:` entry, read by `select_launch` as a GPU would read it, gives
    at its own E and T (the interpreter: its tile and split form; warps do not exist here) the
    built-in launch's routing, kept list and reassignment bit for bit; the score up to rounding."""
    from kernels import tuned
    from kernels.select import SelectLaunch, select_launch

    entries = json.loads((tuned.CONFIG_DIR / f"{table}.json").read_text())
    monkeypatch.setattr(tuned, "load_configs", lambda name: entries)
    E, T = (int(part.split("=")[1]) for part in key.split(":")[1].split(","))
    launch = select_launch(E, T, torch.device("cpu"))
    assert launch == SelectLaunch(num_warps=entries[key]["num_warps"], tokens_per_tile=entries[key]["TB"],
                                  split=bool(entries[key].get("split", False)))
    K, H, M = 8, 32, 16
    x_TH, w_EH, active_T = _inputs(T, E, H, seed=T)
    art = _artifacts(E, H, seed=3)
    kw = dict(norm_topk=True, kind="base", g_TE=x_TH @ art.pred_w_LHE[0], pred_b_E=art.pred_b_LE[0],  # noqa: C408
              rule=Rule(tier="anchor"))
    logits_TE = F.linear(x_TH, w_EH)
    ref_routing, ref = route_select(logits_TE, K, active_T, M, launch=SelectLaunch(), **kw)
    routing, sel = route_select(logits_TE, K, active_T, M, launch=launch, **kw)
    assert torch.equal(routing.topk_idx_TK, ref_routing.topk_idx_TK)
    assert torch.equal(sel.keep_M, ref.keep_M)
    assert torch.equal(sel.topk_idx_TK, ref.topk_idx_TK) and torch.equal(sel.topk_w_TK, ref.topk_w_TK)
    torch.testing.assert_close(sel.score_E, ref.score_E, rtol=1e-6, atol=0)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("tier", ["none", "anchor"])
def test_gpu_every_tuned_selection_launch_of_this_gpu_routes_as_the_default_launch(tier):
    """Each `select:` and `route:` entry of this GPU's committed table (kernels/configs/<gpu>.json)
    is read as written and, at its own E and T in bf16, routes, keeps and reassigns bit for bit as
    the built-in launch (one program, 16-token tiles), eagerly and replayed in a CUDA graph; the
    score, a sum over tokens, up to float rounding. `route:` entries run as dense's launch does
    (no budget). So a tuned entry gets a GPU run of its own."""
    from kernels.score import fused_router_logits
    from kernels.select import SelectLaunch, select_launch
    from kernels.tuned import device_name, load_configs

    dev = torch.device("cuda")
    table = load_configs(device_name(dev))
    keys = sorted(k for k in table if k.startswith(("select:", "route:")))
    if not keys:
        pytest.skip(f"{device_name(dev)}'s table has no selection launches")
    K, H, M = 8, 2048, 16
    for key in keys:
        E, T = (int(part.split("=")[1]) for part in key.split(":")[1].split(","))
        entry = table[key]
        selects = key.startswith("select:")
        launch = select_launch(E, T, dev, selects)
        assert launch == SelectLaunch(num_warps=entry["num_warps"], tokens_per_tile=entry["TB"],
                                      split=bool(entry.get("split", False))), key
        x_TH, w_EH, active_T = (t.to(dev) for t in _inputs(T, E, H, seed=T))
        art = _artifacts(E, H, seed=3)
        logits_TE, g_TE = fused_router_logits(x_TH.bfloat16(), fuse_router_predictor(w_EH.bfloat16(),
                                                                                     art.pred_w_LHE[0].to(dev)))
        kw = dict(norm_topk=True, kind="base", g_TE=g_TE, pred_b_E=art.pred_b_LE[0].to(dev), rule=Rule(tier=tier))  # noqa: C408

        def run(launch=launch, logits_TE=logits_TE, active_T=active_T, kw=kw, budget=M if selects else None):
            routing, sel = route_select(logits_TE, K, active_T, budget, launch=launch, **kw)
            return [routing.topk_idx_TK, routing.topk_w_TK, sel.keep_M, sel.topk_idx_TK, sel.topk_w_TK, sel.score_E]

        ref = [t.clone() for t in run(SelectLaunch())]
        eager = [t.clone() for t in run()]
        kt.POISON = False
        replay, static = capture_graph(run)
        for _ in range(3):
            replay()
        torch.cuda.synchronize()
        for got in (eager, static):
            for a, b in zip(got[:-1], ref[:-1]):
                assert torch.equal(a, b), key
            torch.testing.assert_close(got[-1], ref[-1], rtol=1e-6, atol=0)
        kt.POISON = True
