"""Triton kernels against their PyTorch references (base/method/routing.py, base/method/selectors.py, and
kernels.experts.experts_reference / transformers' experts implementations).

CPU: the kernels run through Triton's interpreter whatever TRITON_INTERPRET says (kernels/_triton.py
dispatches CPU tensors there), so this module sets no environment and other modules are unaffected.
Every wrapper buffer is poisoned (NaN / -7777) so unwritten or stale elements fail the checks.
    pytest tests/test_kernels.py                 # CPU, interpreter, ~1-2 min on 2 cores
    pytest tests/test_kernels.py -m slow         # bigger random sweep
    pytest tests/test_kernels.py -m gpu          # CUDA: bf16 accuracy, CUDA graphs, tiny Qwen3-MoE
Shapes: T tokens, H hidden, I expert intermediate, E experts, K top-k, M budget.
"""
from __future__ import annotations

import random

import pytest
import torch

import kernels._triton as kt
from base.hf.experts_impl import register_base_triton
from base.method.routing import RoutedBatch, pair_counts_E, reassign, select_top_m
from base.method.selectors import Artifacts, build_selector
from base.runtime.graphs import capture_outputs as capture_graph
from kernels import (
    ExpertsLayout,
    experts_reference,
    fused_experts,
    prepare_predictor,
    route_select,
    score_experts,
    select_reassign,
    select_step,
)
from kernels.terms import TERMS

KINDS = list(TERMS)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(autouse=True)
def poison():
    kt.POISON = True
    yield
    kt.POISON = False


def make_batch(T: int, E: int, K: int, H: int, dtype=torch.float32, device="cpu", seed=0) -> RoutedBatch:
    g = torch.Generator().manual_seed(seed)
    z_TH = torch.randn(T, H, generator=g)
    probs_TE = (torch.randn(T, E, generator=g) * 2).softmax(-1)
    w_TK, idx_TK = probs_TE.topk(K, dim=-1)
    w_TK = w_TK / w_TK.sum(-1, keepdim=True)
    active_T = torch.rand(T, generator=g) > 0.25
    active_T[0] = True
    return RoutedBatch(
        z_TH=z_TH.to(device, dtype), probs_TE=probs_TE.to(device), topk_idx_TK=idx_TK.to(device),
        topk_w_TK=w_TK.to(device, dtype), active_T=active_T.to(device), layer=1,
    )  # fmt: skip


def make_artifacts(E: int, H: int, device="cpu", seed=0) -> Artifacts:
    g = torch.Generator().manual_seed(seed + 1)
    L = 2
    return Artifacts(
        freq_LE=torch.rand(L, E, generator=g).to(device),
        energy_LE=torch.rand(L, E, generator=g).to(device),
        pred_w_LHE=(torch.randn(L, H, E, generator=g) * 0.1).to(device),
        pred_b_LE=(torch.randn(L, E, generator=g) * 0.3).to(device),
    )


def step_for(b: RoutedBatch, kind: str, budget, art: Artifacts, pred_w_EH=None, **kw):
    """kernels.select_step on a RoutedBatch, with the layer's rows of `art` as plain tensors."""
    L = b.layer
    pred_w_EH = prepare_predictor(art.pred_w_LHE[L]) if pred_w_EH is None else pred_w_EH
    return select_step(b.probs_TE, b.topk_idx_TK, b.topk_w_TK, b.active_T, kind, budget, z_TH=b.z_TH,
                       freq_E=art.freq_LE[L].float(), energy_E=art.energy_LE[L].float(), pred_w_EH=pred_w_EH,
                       pred_b_E=art.pred_b_LE[L].float(), **kw)  # fmt: skip


def reference_select(batch: RoutedBatch, score_E, M, mode, renorm):
    union_E = pair_counts_E(batch.topk_idx_TK, batch.active_T, batch.num_experts) > 0
    keep_E = select_top_m(score_E, union_E, M)
    idx_TK, w_TK = reassign(batch, keep_E, score_E, mode, renorm)
    return keep_E, idx_TK, w_TK


def expected_keep_M(score_E, keep_E, M):
    ids = [e for e in range(score_E.numel()) if keep_E[e]]
    ids.sort(key=lambda e: (-float(score_E[e]), e))
    return ids + [-1] * (M - len(ids))


def assert_same_routing(idx_TK, w_TK, ref_idx_TK, ref_w_TK, rtol):
    """Per token the same (expert, weight) pairs; slot order may differ only where torch.topk's
    tie order is unspecified, so pairs are compared sorted by expert id."""
    o_idx, o = idx_TK.sort(-1)
    r_idx, r = ref_idx_TK.sort(-1)
    assert torch.equal(o_idx.cpu(), r_idx.cpu())
    o_w = w_TK.gather(1, o).float().cpu()
    r_w = ref_w_TK.gather(1, r).float().cpu()
    torch.testing.assert_close(o_w, r_w, rtol=rtol, atol=rtol * 1e-2)


# ----------------------------------------------------------------------------- select


SELECT_CASES = [  # T, E, K, M, mode, renormalize, dtype, tied scores
    (1, 8, 2, 1, "backfill", True, torch.float32, False),
    (3, 60, 4, 5, "drop", True, torch.float16, True),
    (16, 64, 6, 9, "backfill", False, torch.float32, True),
    (16, 8, 8, 3, "drop", False, torch.float16, False),
    (64, 128, 8, 17, "backfill", True, torch.float32, True),
    (3, 128, 8, 128, "backfill", True, torch.float32, False),
    (16, 60, 4, 60, "drop", True, torch.float32, True),
]


@pytest.mark.parametrize("T,E,K,M,mode,renorm,dtype,ties", SELECT_CASES)
def test_select_reassign_matches_reference(T, E, K, M, mode, renorm, dtype, ties):
    b = make_batch(T, E, K, 8, dtype, seed=T * E + M)
    g = torch.Generator().manual_seed(M)
    score_E = torch.randint(0, 4, (E,), generator=g).float() if ties else torch.rand(E, generator=g)
    out = select_reassign(b.probs_TE, b.topk_idx_TK, b.topk_w_TK, b.active_T, M, score_E,
                          reassign_mode=mode, renormalize=renorm)  # fmt: skip
    keep_E, idx_TK, w_TK = reference_select(b, score_E, M, mode, renorm)
    assert torch.equal(out.keep_E, keep_E)
    assert out.keep_M.tolist() == expected_keep_M(score_E, keep_E, min(M, E))
    assert out.topk_idx_TK.dtype == idx_TK.dtype and out.topk_w_TK.dtype == w_TK.dtype
    assert_same_routing(out.topk_idx_TK, out.topk_w_TK, idx_TK, w_TK, 1e-3 if dtype == torch.float16 else 1e-5)
    lost_T = ~keep_E[b.topk_idx_TK].all(-1)
    # tokens that lost nothing come back bit-identical (budget >= union equals dense)
    assert torch.equal(out.topk_idx_TK[~lost_T], b.topk_idx_TK[~lost_T])
    assert torch.equal(out.topk_w_TK[~lost_T], b.topk_w_TK[~lost_T])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("T,E,K", [(3, 60, 4), (16, 64, 8)])
def test_select_scores_in_kernel(kind, T, E, K):
    H = 24
    b = make_batch(T, E, K, H, seed=E + K)
    art = make_artifacts(E, H)
    ref_score = build_selector(kind, art).score(b)
    g_TE = b.z_TH @ art.pred_w_LHE[1] if kind == "base" else None
    out = select_reassign(b.probs_TE, b.topk_idx_TK, b.topk_w_TK, b.active_T, 7, kind=kind, g_TE=g_TE,
                          pred_b_E=art.pred_b_LE[1], energy_E=art.energy_LE[1])  # fmt: skip
    union_E = pair_counts_E(b.topk_idx_TK, b.active_T, E) > 0
    torch.testing.assert_close(out.score_E[union_E], ref_score[union_E], rtol=1e-5, atol=1e-6)
    keep_E, idx_TK, w_TK = reference_select(b, out.score_E, 7, "backfill", True)  # exact given score
    assert torch.equal(out.keep_E, keep_E)
    assert_same_routing(out.topk_idx_TK, out.topk_w_TK, idx_TK, w_TK, 1e-5)


ROUTE_CASES = [  # T, E, K, norm_topk, scale, dtype, kind
    (1, 8, 2, True, 1.0, torch.float32, "router_sum"),
    (16, 60, 4, False, 1.0, torch.float16, "base"),
    (20, 64, 6, False, 2.5, torch.float32, "count"),
    (64, 128, 8, True, 1.0, torch.float32, "base"),
]


@pytest.mark.parametrize("T,E,K,norm,scale,dtype,kind", ROUTE_CASES)
def test_route_select_matches_router_and_reference(T, E, K, norm, scale, dtype, kind):
    """Softmax + top-k (+ renorm, scale) + selection in one launch == torch router + references."""
    H, M = 16, 7
    b = make_batch(T, E, K, H, seed=T + E)
    g = torch.Generator().manual_seed(T)
    logits_TE = (torch.randn(T, E, generator=g) * 2).to(dtype)
    art = make_artifacts(E, H)
    g_TE = b.z_TH @ art.pred_w_LHE[1]
    routing, sel = route_select(logits_TE, K, b.active_T, M, norm_topk=norm, scale=scale, kind=kind, g_TE=g_TE,
                                pred_b_E=art.pred_b_LE[1])  # fmt: skip
    probs_TE = logits_TE.float().softmax(-1)
    w_TK, idx_TK = probs_TE.topk(K, dim=-1)
    if norm:
        w_TK = w_TK / w_TK.sum(-1, keepdim=True)
    w_TK = (w_TK * scale).to(dtype)
    torch.testing.assert_close(routing.probs_TE, probs_TE, rtol=1e-5, atol=1e-7)
    assert torch.equal(routing.topk_idx_TK, idx_TK)
    torch.testing.assert_close(routing.topk_w_TK, w_TK, rtol=1e-3 if dtype == torch.float16 else 1e-5, atol=1e-6)
    ref = RoutedBatch(z_TH=b.z_TH, probs_TE=routing.probs_TE, topk_idx_TK=routing.topk_idx_TK,
                      topk_w_TK=routing.topk_w_TK, active_T=b.active_T, layer=1)  # fmt: skip
    ref_score = build_selector(kind, Artifacts(pred_w_LHE=art.pred_w_LHE, pred_b_LE=art.pred_b_LE)).score(ref)
    union_E = pair_counts_E(idx_TK, b.active_T, E) > 0
    torch.testing.assert_close(sel.score_E[union_E], ref_score[union_E], rtol=1e-5, atol=1e-6)
    keep_E, r_idx, r_w = reference_select(ref, sel.score_E, M, "backfill", True)
    assert torch.equal(sel.keep_E, keep_E)
    assert_same_routing(sel.topk_idx_TK, sel.topk_w_TK, r_idx, r_w, 1e-3 if dtype == torch.float16 else 1e-5)


# ----------------------------------------------------------------------------- score


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("T,E,K,H", [(1, 8, 2, 40), (16, 60, 6, 72)])
@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_score_matches_selectors(kind, T, E, K, H):
    b = make_batch(T, E, K, H, seed=T + K)
    art = make_artifacts(E, H)
    ref = build_selector(kind, art).score(b)
    out = score_experts(kind, b.topk_idx_TK, b.topk_w_TK, b.active_T, E, z_TH=b.z_TH,
                        pred_w_EH=prepare_predictor(art.pred_w_LHE[1]), pred_b_E=art.pred_b_LE[1],
                        energy_E=art.energy_LE[1])  # fmt: skip
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    if kind == "base":  # fused path: g from the router GEMM, gathered at routed pairs
        fused = score_experts(kind, b.topk_idx_TK, b.topk_w_TK, b.active_T, E,
                              g_TE=b.z_TH @ art.pred_w_LHE[1], pred_b_E=art.pred_b_LE[1])  # fmt: skip
        torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_select_step_matches_selector_and_reassign():
    T, E, K, H = 16, 64, 6, 48
    b = make_batch(T, E, K, H, seed=5)
    art = make_artifacts(E, H)
    for kind in ["base", "count", "calib_freq"]:
        sel = step_for(b, kind, 10, art, reassign_mode="backfill", renormalize=True)
        keep_E, score_E = build_selector(kind, art).keep(b, 10)
        torch.testing.assert_close(sel.score_E, score_E, rtol=1e-5, atol=1e-6)
        assert torch.equal(sel.keep_E, keep_E)
        idx_TK, w_TK = reassign(b, keep_E, score_E)
        assert_same_routing(sel.topk_idx_TK, sel.topk_w_TK, idx_TK, w_TK, 1e-5)


# ----------------------------------------------------------------------------- experts


def make_experts(E, H, I, dtype, layout=None, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    if layout is not None and layout.transposed:
        gu = torch.randn(E, H, 2 * I, generator=g) / H**0.5
        dn = torch.randn(E, I, H, generator=g) / I**0.5
    else:
        gu = torch.randn(E, 2 * I, H, generator=g) / H**0.5
        dn = torch.randn(E, H, I, generator=g) / I**0.5
    return gu.to(device, dtype), dn.to(device, dtype)


GPTOSS = ExpertsLayout(transposed=True, interleaved=True, act="gptoss", alpha=1.702, limit=1.5)


def gptoss_experts(E, H, I):
    """float32 experts in gpt-oss's layout with biases: (gu, dn, the keywords fused_experts and
    experts_reference take for the layout and biases, the generator that drew the biases)."""
    gu, dn = make_experts(E, H, I, torch.float32, GPTOSS)
    g = torch.Generator().manual_seed(9)
    gub, db = torch.randn(E, 2 * I, generator=g), torch.randn(E, H, generator=g)
    return gu, dn, {"layout": GPTOSS, "gate_up_bias": gub, "down_bias": db}, g


def assert_near_reference(out, ref, dtype=torch.float32):
    """A kernel's output against the float64 reference: its dtype, no NaN, the dtype's tolerance."""
    assert out.dtype == dtype and not out.isnan().any()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < (2e-3 if dtype == torch.float16 else 1e-5), err


EXPERT_CASES = [  # T, E, K, H, I, dtype, budget (None: dense routing)
    (1, 8, 2, 40, 24, torch.float32, None),
    (3, 60, 4, 72, 40, torch.float16, 5),
    (16, 64, 6, 48, 56, torch.float32, 9),
    (64, 8, 8, 24, 20, torch.float16, None),
    (16, 128, 8, 40, 24, torch.float32, 3),
]


@pytest.mark.parametrize("T,E,K,H,I,dtype,budget", EXPERT_CASES)
@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_fused_experts_matches_reference(T, E, K, H, I, dtype, budget):
    b = make_batch(T, E, K, H, dtype, seed=T + E)
    gu, dn = make_experts(E, H, I, dtype, seed=E)
    idx_TK, w_TK = b.topk_idx_TK, b.topk_w_TK
    if budget is not None:  # reassign's output: empty slots point at a kept expert with weight 0
        sel = select_reassign(b.probs_TE, idx_TK, w_TK, b.active_T, budget, kind="router_sum",
                              reassign_mode="drop")  # fmt: skip
        idx_TK, w_TK = sel.topk_idx_TK, sel.topk_w_TK
        assert (w_TK == 0).any()
    out = fused_experts(b.z_TH, gu, dn, idx_TK, w_TK)
    assert_near_reference(out, experts_reference(b.z_TH, gu, dn, idx_TK, w_TK), dtype)


@pytest.mark.parametrize("fold", [False, True])
def test_the_gate_up_launch_routes_the_pairs_as_the_route_launch_does(monkeypatch, fold):
    """Up to ROUTE_IN_MAX pairs the gate_up launch counts and lists the pairs itself (no route
    launch) and writes the lists the down launch reads: the output is the route launch's bit for
    bit, with empty slots, a token routed twice to one expert (`similar`'s re-routing can) and
    more pairs for one expert than a tile holds, with and without the reduce in the down launch."""
    import kernels.experts as ke

    T, E, K, H, I = 12, 8, 4, 40, 24
    b = make_batch(T, E, K, H, seed=51)
    gu, dn = make_experts(E, H, I, torch.float32, seed=52)
    idx_TK = b.topk_idx_TK.clone()
    idx_TK[:, 0] = 3  # expert 3: every token, 12 pairs and more, past a tile of 8
    idx_TK[2, 1] = 3  # token 2 twice on expert 3
    w_TK = b.topk_w_TK.clone()
    w_TK[::3, 2] = 0  # empty slots
    assert T * K <= ke.ROUTE_IN_MAX
    small = dict(TB=8, num_warps=4, num_stages=2, PER_SM=1)  # noqa: C408
    cfg = ke.ExpertsConfig(gate_up=dict(BI=8, BH=16, **small), down=dict(BHO=16, BI=8, **small),
                           use_kept=False, reduce_in_down=fold)
    res = torch.randn(T, H, generator=torch.Generator().manual_seed(53))
    routed_here = fused_experts(b.z_TH, gu, dn, idx_TK, w_TK, config=cfg, residual_TH=res)
    monkeypatch.setattr(ke, "ROUTE_IN_MAX", 0)  # every launch size takes the route launch
    assert torch.equal(routed_here, fused_experts(b.z_TH, gu, dn, idx_TK, w_TK, config=cfg, residual_TH=res))
    assert_near_reference(routed_here - res, experts_reference(b.z_TH, gu, dn, idx_TK, w_TK))


@pytest.mark.parametrize("fold", [pytest.param(False, marks=pytest.mark.slow), True])  # make test: the fold
def test_gate_up_and_down_in_one_launch_equal_the_two_launches(monkeypatch, fold):
    """The one-launch FFN (`_ffn_kernel`: gate_up's items, then down's, each waiting for its
    expert's gate_up items) gives the two launches' output bit for bit, with and without the
    reduce folded in, with empty slots, a token twice on one expert and more pairs than a tile.
    Its flags are back at 0 after the launch (a captured graph replays it). Above ROUTE_IN_MAX
    pairs (the route launch's lists) the two launches run, never the one."""
    import kernels.experts as ke
    from kernels._triton import arrival_counters

    T, E, K, H, I = 12, 8, 4, 40, 24
    b = make_batch(T, E, K, H, seed=61)
    gu, dn = make_experts(E, H, I, torch.float32, seed=62)
    idx_TK = b.topk_idx_TK.clone()
    idx_TK[:, 0] = 3
    idx_TK[2, 1] = 3
    w_TK = b.topk_w_TK.clone()
    w_TK[::3, 2] = 0
    small = dict(TB=8, num_warps=4, num_stages=2, PER_SM=1)  # noqa: C408
    cfg = ke.ExpertsConfig(gate_up=dict(BI=8, BH=16, **small), down=dict(BHO=16, BI=8, **small),
                           use_kept=False, reduce_in_down=fold)
    res = torch.randn(T, H, generator=torch.Generator().manual_seed(63))
    one = fused_experts(b.z_TH, gu, dn, idx_TK, w_TK, config=cfg, residual_TH=res)
    assert not arrival_counters(2 * 16 + 1, torch.device("cpu"), "experts_ffn").any()  # flags and give-ups
    monkeypatch.setattr(ke, "FUSED_FFN", False)
    assert torch.equal(one, fused_experts(b.z_TH, gu, dn, idx_TK, w_TK, config=cfg, residual_TH=res))
    assert_near_reference(one - res, experts_reference(b.z_TH, gu, dn, idx_TK, w_TK))
    monkeypatch.setattr(ke, "FUSED_FFN", True)
    monkeypatch.setattr(ke, "ROUTE_IN_MAX", T * K - 1)  # one pair too many: the route launch and the two

    class Never:
        def __getitem__(self, grid):
            raise AssertionError("the one launch ran with the route launch's lists")

    monkeypatch.setattr(ke._ffn_kernel, "on", lambda dev: Never())
    assert torch.equal(one, fused_experts(b.z_TH, gu, dn, idx_TK, w_TK, config=cfg, residual_TH=res))


def test_a_wait_of_the_one_launch_ffn_that_cannot_end_gives_up_and_is_counted(monkeypatch):
    """A down item whose expert's gate_up items never all arrive (on a GPU: a producer that was
    not resident) stops waiting after FFN_MAX_SPINS polls and counts itself in `ffn_waits_given_up`,
    instead of hanging the device; here a slot's count starts one short."""
    import kernels.experts as ke
    from kernels._triton import arrival_counters

    T, E, K, H, I = 4, 8, 2, 32, 16
    b = make_batch(T, E, K, H, seed=71)
    gu, dn = make_experts(E, H, I, torch.float32, seed=72)
    monkeypatch.setattr(ke, "FFN_MAX_SPINS", 3)
    flags = arrival_counters(2 * 16 + 1, torch.device("cpu"), "experts_ffn")
    before = ke.ffn_waits_given_up()
    flags[0] = -1  # slot 0 will count one gate_up item short
    try:
        fused_experts(b.z_TH, gu, dn, b.topk_idx_TK, b.topk_w_TK, config=ke.ExpertsConfig(use_kept=False))
        assert ke.ffn_waits_given_up() > before
    finally:
        flags.zero_()


def test_the_timing_breakdowns_first_stage_is_the_route_launch_only_where_there_is_one(monkeypatch):
    """`_stages=1` (tools/bench_kernels.py's breakdown: route, +gate_up, ...) runs the route launch
    above ROUTE_IN_MAX pairs and nothing at or below it, where gate_up does the routing."""
    import kernels.experts as ke

    launched = []

    class Recorder:  # stands in for a kernel: kernel.on(dev)[grid](*args) records the launch
        def __init__(self, name):
            self.name = name

        def on(self, dev):
            return self

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append(self.name)

    monkeypatch.setattr(ke, "_route_kernel", Recorder("route"))
    monkeypatch.setattr(ke, "_gate_up_kernel", Recorder("gate_up"))
    monkeypatch.setattr(ke, "ROUTE_IN_MAX", 64)
    for T, want in ((4, []), (40, ["route"])):  # 16 and 160 pairs at top-4
        b = make_batch(T, 8, 4, 16, seed=T)
        gu, dn = make_experts(8, 16, 16, torch.float32, seed=T)
        launched.clear()
        ke.fused_experts(b.z_TH, gu, dn, b.topk_idx_TK, b.topk_w_TK, _stages=1)
        assert launched == want, (T, launched)


def test_fused_experts_gptoss_layout():
    T, E, K, H, I = 5, 8, 2, 40, 24
    b = make_batch(T, E, K, H, seed=3)
    gu, dn, kw, _ = gptoss_experts(E, H, I)
    out = fused_experts(b.z_TH, gu, dn, b.topk_idx_TK, b.topk_w_TK, **kw)
    assert_near_reference(out, experts_reference(b.z_TH, gu, dn, b.topk_idx_TK, b.topk_w_TK, **kw))


def test_an_expert_launch_the_device_cannot_hold_sheds_stages_then_halves_its_reduction_tile(monkeypatch):
    """An expert entry whose pipelined tiles need more shared memory than the device has (Triton's
    OutOfResources, raised before anything is enqueued; a bf16 entry run in float32), on each of
    the four kernels that stream weights: one stage fewer at a time, then half the reduction tile
    (BH for gate_up, BI for down), until it fits; the sum is the reference's, the fitted launch is
    remembered, and fit=False runs each launch as named. The one-launch FFN (`_ffn_kernel`) the device
    cannot hold runs as the two launches, each fitted, and is not tried again."""
    from triton.runtime.errors import OutOfResources

    from dataclasses import replace

    import kernels.experts as ke
    from kernels.experts import ExpertsConfig

    seen = []
    reduce_key = {"_ffn_kernel": "BH", "_gate_up_kernel": "BH", "_gate_up_kept_kernel": "BH", "_down_kernel": "BI", "_down_kept_kernel": "BI"}
    for name, red in reduce_key.items():
        kernel = getattr(ke, name)
        launcher = kernel.on(torch.device("cpu"))

        class Limited:  # a device that holds num_stages x reduction tile <= 64
            def __init__(self, name=name, red=red, launcher=launcher):
                self.name, self.red, self.launcher = name, red, launcher

            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    need = kwargs["num_stages"] * kwargs[self.red]
                    seen.append((self.name, kwargs["num_stages"], kwargs[self.red]))
                    if need > 64:
                        raise OutOfResources(need * 1024, 65536, "shared memory")
                    return self.launcher[grid](*args, **kwargs)
                return launch

        monkeypatch.setattr(kernel, "on", lambda dev, limited=Limited(): limited)
    monkeypatch.setattr(ke, "_FITTED", {})
    monkeypatch.setattr(ke, "_FFN_HELD", {})
    T, E, K, H, I = 5, 8, 2, 64, 64
    b = make_batch(T, E, K, H, seed=4)
    gu, dn = make_experts(E, H, I, torch.float32, seed=4)
    sel = select_reassign(b.probs_TE, b.topk_idx_TK, b.topk_w_TK, b.active_T, 3, kind="router_sum")
    ref = experts_reference(b.z_TH, gu, dn, sel.topk_idx_TK, sel.topk_w_TK)
    cfg = ExpertsConfig(gate_up=dict(TB=16, BI=16, BH=32, num_warps=4, num_stages=3, PER_SM=1),  # noqa: C408
                        down=dict(TB=16, BHO=16, BI=64, num_warps=4, num_stages=2, PER_SM=1),  # noqa: C408
                        gate_up_kept=dict(BI=16, BH=128, num_warps=4, num_stages=1, PER_SM=1),  # noqa: C408
                        down_kept=dict(BHO=16, BI=32, num_warps=4, num_stages=4))  # noqa: C408
    four = replace(cfg, use_kept=False)
    for config, want in ((four, [("_ffn_kernel", 3, 32), ("_gate_up_kernel", 3, 32), ("_gate_up_kernel", 2, 32),
                                 ("_down_kernel", 2, 64), ("_down_kernel", 1, 64)]),
                         (cfg, [("_gate_up_kept_kernel", 1, 128), ("_gate_up_kept_kernel", 1, 64),
                                ("_down_kept_kernel", 4, 32), ("_down_kept_kernel", 3, 32), ("_down_kept_kernel", 2, 32)])):
        seen.clear()
        out = fused_experts(b.z_TH, gu, dn, sel.topk_idx_TK, sel.topk_w_TK, keep_M=sel.keep_M, config=config)
        assert_near_reference(out, ref)
        assert seen == want
        seen.clear()
        fused_experts(b.z_TH, gu, dn, sel.topk_idx_TK, sel.topk_w_TK, keep_M=sel.keep_M, config=config)
        fitted = {name: (name, stages, tile) for name, stages, tile in want if name != "_ffn_kernel"}  # last tries
        assert seen == list(fitted.values())  # straight to the launches that fitted (the two, not the one)
        seen.clear()
        with pytest.raises(OutOfResources, match="shared memory"):  # a tuner's launch: as named or not at all
            fused_experts(b.z_TH, gu, dn, sel.topk_idx_TK, sel.topk_w_TK, keep_M=sel.keep_M, config=config, fit=False)
        assert seen == [want[0]]


def tiny_qwen3_moe(dtype, device, seed=0):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(
        vocab_size=96, hidden_size=40, intermediate_size=64, moe_intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=10, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, decoder_sparse_step=1, max_position_embeddings=64,
    )  # fmt: skip
    model = Qwen3MoeForCausalLM(cfg).to(device, dtype).eval()
    with torch.no_grad():  # transformers leaves 3-D expert weights uninitialised until from_pretrained
        for name, p in model.named_parameters():
            if "experts" in name or "gate.weight" in name:
                p.normal_(0, 0.2)
    return model


def model_logits(model, ids, impl):
    model.set_experts_implementation(impl)
    with torch.no_grad():
        return model(ids).logits.float()


def test_base_triton_registers_and_matches_eager_cpu():
    assert register_base_triton() == register_base_triton() == "base_triton"
    model = tiny_qwen3_moe(torch.float32, "cpu")
    ids = torch.randint(0, 96, (2, 5))
    ref = model_logits(model, ids, "eager")
    out = model_logits(model, ids, "base_triton")
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- slow sweep


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12))
def test_random_sweep(seed):
    rnd = random.Random(seed)
    T, E, K = rnd.choice([1, 3, 16, 64]), rnd.choice([8, 60, 64, 128]), rnd.choice([2, 4, 6, 8])
    M = rnd.randint(1, E)
    mode, renorm = rnd.choice(["backfill", "drop"]), rnd.choice([True, False])
    dtype = rnd.choice([torch.float32, torch.float16])
    b = make_batch(T, E, K, 8, dtype, seed=seed)
    score_E = torch.randint(0, 3, (E,)).float() if seed % 2 else torch.rand(E)
    out = select_reassign(b.probs_TE, b.topk_idx_TK, b.topk_w_TK, b.active_T, M, score_E,
                          reassign_mode=mode, renormalize=renorm)  # fmt: skip
    keep_E, idx_TK, w_TK = reference_select(b, score_E, M, mode, renorm)
    assert torch.equal(out.keep_E, keep_E)
    assert_same_routing(out.topk_idx_TK, out.topk_w_TK, idx_TK, w_TK, 1e-3 if dtype == torch.float16 else 1e-5)
    H, I = rnd.choice([(40, 24), (72, 56)])
    bx = make_batch(T, E, K, H, dtype, seed=seed)
    gu, dn = make_experts(E, H, I, dtype, seed=seed)
    got = fused_experts(bx.z_TH, gu, dn, out.topk_idx_TK, out.topk_w_TK)
    assert_near_reference(got, experts_reference(bx.z_TH, gu, dn, out.topk_idx_TK, out.topk_w_TK), dtype)


# ----------------------------------------------------------------------------- GPU


def rel_err(out, ref) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("T,E,K,budget", [(1, 128, 8, None), (16, 128, 8, 16), (64, 60, 4, 8), (128, 64, 6, None)])
def test_gpu_bf16_experts(T, E, K, budget):
    H, I, dev = 2048, 768, "cuda"
    b = make_batch(T, E, K, H, torch.bfloat16, device=dev, seed=T)
    gu, dn = make_experts(E, H, I, torch.bfloat16, seed=1, device=dev)
    idx_TK, w_TK = b.topk_idx_TK, b.topk_w_TK
    if budget is not None:
        sel = select_reassign(b.probs_TE, idx_TK, w_TK, b.active_T, budget)
        idx_TK, w_TK = sel.topk_idx_TK, sel.topk_w_TK
    out = fused_experts(b.z_TH, gu, dn, idx_TK, w_TK)
    ref = experts_reference(b.z_TH[:8].cpu(), gu.cpu(), dn.cpu(), idx_TK[:8].cpu(), w_TK[:8].cpu())
    assert rel_err(out[:8].cpu(), ref) <= 1e-2


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("kept", [False, True], ids=["v2", "v3"])
def test_gpu_gptoss_20b_experts_in_bf16(kept):
    """Compiled, gpt-oss-20b's expert shapes (H = I = 2880, 32 experts, top-4) in bf16 with biases:
    the interleaved gate_up's one tile of adjacent rows, split after the dot (the CPU tests run it
    only interpreted), with a partial last H block of the default BH=128, against float64."""
    from dataclasses import replace

    from kernels.experts import get_config
    from kernels.select import route_select

    T, E, K, H, I, dev = 16, 32, 4, 2880, 2880, torch.device("cuda")
    b = make_batch(T, E, K, H, torch.bfloat16, device=dev, seed=51)
    gu, dn = make_experts(E, H, I, torch.bfloat16, GPTOSS, seed=52, device=dev)
    g = torch.Generator().manual_seed(53)
    gub, db = torch.randn(E, 2 * I, generator=g), torch.randn(E, H, generator=g)
    _, sel = route_select(torch.randn(T, E, generator=g).to(dev), K, b.active_T, 16, norm_topk=True)
    out = fused_experts(b.z_TH, gu, dn, sel.topk_idx_TK, sel.topk_w_TK, keep_M=sel.keep_M, layout=GPTOSS,
                        gate_up_bias=gub.to(dev, torch.bfloat16), down_bias=db.to(dev, torch.bfloat16),
                        config=replace(get_config(H, I, T, dev), use_kept=kept))
    ref = experts_reference(b.z_TH[:8].cpu(), gu.cpu(), dn.cpu(), sel.topk_idx_TK[:8].cpu(), sel.topk_w_TK[:8].cpu(),
                            layout=GPTOSS, gate_up_bias=gub.bfloat16(), down_bias=db.bfloat16())
    assert rel_err(out[:8].cpu(), ref) <= 1e-2


@pytest.mark.gpu
@cuda
def test_gpu_every_tuned_expert_entry_of_this_gpu_runs_in_float32():
    """Each expert entry of this GPU's table (tuned and timed in bf16) at its own H, I and T, in
    float32, whose tiles need twice the shared memory: both paths (four launches, and the kept
    path with a budget) launch on this device and match the float64 reference. A table must never
    select a launch the device cannot hold (issue 42); decode attention and the skinny GEMM fit
    theirs, and this is where an expert entry that does not fit would show."""
    from dataclasses import replace

    from kernels.experts import get_config
    from kernels.select import route_select
    from kernels.tuned import device_name, load_configs

    dev = torch.device("cuda")
    keys = sorted(k for k in load_configs(device_name(dev)) if k.startswith("H="))
    if not keys:
        pytest.skip(f"{device_name(dev)}'s table has no expert entry")
    E, K = 32, 8
    weights = {}  # (H, I) -> the experts on the GPU and in float64 on the host, made once per shape
    for key in keys:
        H, I, T = (int(part.split("=")[1]) for part in key.split(","))
        if (H, I) not in weights:
            weights.clear()
            gu, dn = make_experts(E, H, I, torch.float32, seed=1, device=dev)
            weights[H, I] = gu, dn, gu.cpu().double(), dn.cpu().double()
        gu, dn, gu64, dn64 = weights[H, I]
        b = make_batch(T, E, K, H, torch.float32, device=dev, seed=T)
        _, sel = route_select(torch.randn(T, E, generator=torch.Generator().manual_seed(T)).to(dev), K, b.active_T, 16,
                              norm_topk=True)
        n = min(T, 8)
        ref = experts_reference(b.z_TH[:n].cpu().double(), gu64, dn64, sel.topk_idx_TK[:n].cpu(),
                                sel.topk_w_TK[:n].cpu().double())
        for kept in (False, True):
            out = fused_experts(b.z_TH, gu, dn, sel.topk_idx_TK, sel.topk_w_TK, keep_M=sel.keep_M,
                                config=replace(get_config(H, I, T, dev), use_kept=kept, kept_max=None))
            assert rel_err(out[:n].cpu(), ref) <= 1e-4, f"{key} {'kept' if kept else 'four launches'}"


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_select_and_score(kind):
    T, E, K, H = 64, 128, 8, 256
    b = make_batch(T, E, K, H, torch.bfloat16, device="cuda", seed=2)
    art = make_artifacts(E, H, device="cuda")
    cpu_b = RoutedBatch(**{k: (v.cpu() if torch.is_tensor(v) else v) for k, v in vars(b).items()})
    cpu_art = Artifacts(**{k: (v.cpu() if torch.is_tensor(v) else v) for k, v in vars(art).items()})
    sel = step_for(b, kind, 16, art)
    _, score_E = build_selector(kind, cpu_art).keep(cpu_b, 16)
    torch.testing.assert_close(sel.score_E.cpu(), score_E, rtol=1e-4, atol=1e-5)
    keep_ref, idx_TK, w_TK = reference_select(cpu_b, sel.score_E.cpu(), 16, "backfill", True)
    assert torch.equal(sel.keep_E.cpu(), keep_ref)
    assert_same_routing(sel.topk_idx_TK, sel.topk_w_TK, idx_TK, w_TK, 1e-2)


@pytest.mark.gpu
@cuda
def test_gpu_route_select():
    T, E, K, M = 64, 128, 8, 16
    b = make_batch(T, E, K, 8, device="cuda", seed=3)
    # distinct logits in every row (multiples of 1/16, exact in bf16): the reassignment below takes
    # each token's next-preferred kept expert, which a tie in probability would leave to tie order
    # (the kernel takes the lower id; the reference does not say), and the global CUDA generator's
    # draws tied there once (session 27)
    g = torch.Generator().manual_seed(3)
    logits_TE = ((torch.stack([torch.randperm(E, generator=g) for _ in range(T)]) - E // 2) / 16).to(torch.bfloat16)
    logits_TE = logits_TE.cuda()
    routing, sel = route_select(logits_TE, K, b.active_T, M, norm_topk=True, kind="router_sum")
    probs_TE = logits_TE.float().softmax(-1)
    torch.testing.assert_close(routing.probs_TE, probs_TE, rtol=1e-4, atol=1e-6)
    # bf16 logits tie often (8 mantissa bits; T*E = 8192 draws): the kernel breaks ties to the lower
    # id, torch.topk in no specified order. So check what ties cannot change: every token's chosen
    # probabilities are the K largest, each expert once, and the weights are their renormalisation.
    chosen_TK = probs_TE.gather(1, routing.topk_idx_TK)
    torch.testing.assert_close(chosen_TK.sort(-1, descending=True).values, probs_TE.topk(K, dim=-1).values)
    assert all(len(set(row)) == K for row in routing.topk_idx_TK.tolist())
    torch.testing.assert_close(routing.topk_w_TK.float(), chosen_TK / chosen_TK.sum(-1, keepdim=True),
                               rtol=1e-2, atol=1e-3)
    cpu = RoutedBatch(z_TH=b.z_TH.cpu(), probs_TE=routing.probs_TE.cpu(), topk_idx_TK=routing.topk_idx_TK.cpu(),
                      topk_w_TK=routing.topk_w_TK.cpu(), active_T=b.active_T.cpu(), layer=1)  # fmt: skip
    keep_E, r_idx, r_w = reference_select(cpu, sel.score_E.cpu(), M, "backfill", True)
    assert torch.equal(sel.keep_E.cpu(), keep_E)
    assert_same_routing(sel.topk_idx_TK, sel.topk_w_TK, r_idx, r_w, 1e-2)


@pytest.mark.gpu
@cuda
def test_gpu_cuda_graph_replay_equals_eager():
    T, E, K, H, I = 16, 128, 8, 2048, 768
    b = make_batch(T, E, K, H, torch.bfloat16, device="cuda", seed=4)
    art = make_artifacts(E, H, device="cuda")
    pred_w_EH = prepare_predictor(art.pred_w_LHE[1])
    gu, dn = make_experts(E, H, I, torch.bfloat16, seed=4, device="cuda")

    def step():
        sel = step_for(b, "base", 16, art, pred_w_EH=pred_w_EH)
        return sel.keep_M, fused_experts(b.z_TH, gu, dn, sel.topk_idx_TK, sel.topk_w_TK)

    kt.POISON = False
    eager = [t.clone() for t in step()]  # also compiles everything before capture
    replay, static = capture_graph(step)
    for _ in range(2):
        replay()
    torch.cuda.synchronize()
    assert torch.equal(static[0], eager[0])
    assert torch.equal(static[1], eager[1])  # deterministic: bit-identical, not just close
    # new inputs in the same buffers: the replay follows them
    b.z_TH.copy_(torch.randn_like(b.z_TH))
    replay()
    fresh = step()
    torch.cuda.synchronize()
    assert torch.equal(static[1], fresh[1])


@pytest.mark.gpu
@cuda
def test_gpu_tiny_qwen3_moe_base_triton_matches_eager():
    register_base_triton()
    model = tiny_qwen3_moe(torch.bfloat16, "cuda")
    ids = torch.randint(0, 96, (4, 16), device="cuda")  # 64 tokens: the kernel path, not the fallback
    ref = model_logits(model, ids, "eager")
    out = model_logits(model, ids, "base_triton")
    assert rel_err(out, ref) <= 1e-2


# ---- decode attention ----------------------------------------------------------------------------
ATTN_SHAPES = [  # B, Hq, K, L, D, E, last slot: grouped (Qwen3-like), multi-head, MLA-like D != E
    (3, 8, 2, 200, 32, 32, 130),
    (2, 4, 4, 64, 16, 16, 0),
    (2, 16, 16, 100, 48, 32, 99),
]


def _attention_inputs(B, Hq, K, L, D, E, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, D, generator=g).to(device, dtype)
    k = torch.randn(B, K, L, D, generator=g).to(device, dtype)
    v = torch.randn(B, K, L, E, generator=g).to(device, dtype)
    allowed = torch.rand(B, L, generator=g) > 0.3
    allowed[-1] = False  # a row with nothing to attend to: zeros
    return q, k, v, allowed.to(device)


@pytest.mark.parametrize("B,Hq,K,L,D,E,last", ATTN_SHAPES)
def test_decode_attention_matches_reference(B, Hq, K, L, D, E, last):
    """Interpreted on the CPU: equal to per-head attention over repeated K/V, slots after `last`
    never read (they hold NaN here)."""
    from kernels.attention import decode_attention, decode_attention_reference

    q, k, v, allowed = _attention_inputs(B, Hq, K, L, D, E)
    k[:, :, last + 1:], v[:, :, last + 1:] = float("nan"), float("nan")
    out = decode_attention(q, k, v, allowed, torch.tensor([last]), 0.2)
    ref = decode_attention_reference(q, k, v, allowed, last, 0.2)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert out[-1].abs().max() == 0


def test_decode_attention_in_many_shares_combines_in_the_last_and_leaves_its_counters_at_zero():
    """Ten shares of one (row, KV head), most of them past the filled slots (empty shares): the
    last program to arrive combines them; the counters return to 0, so a second launch (a graph
    replay) gives the same result."""
    from kernels.attention import (
        arrival_counters,
        decode_attention,
        decode_attention_reference,
        splits_for,
    )

    B, Hq, K, L, D, E, last = 1, 4, 2, 640, 16, 16, 150
    assert splits_for(B * K, L) == 10  # 3 blocks of 64 filled: 7 empty shares
    q, k, v, allowed = _attention_inputs(B, Hq, K, L, D, E)
    allowed[:] = True
    first = decode_attention(q, k, v, allowed, torch.tensor([last]), 0.3)
    assert (arrival_counters(B * K, q.device)[: B * K] == 0).all()
    again = decode_attention(q, k, v, allowed, torch.tensor([last]), 0.3)
    torch.testing.assert_close(first, decode_attention_reference(q, k, v, allowed, last, 0.3), rtol=1e-5, atol=1e-5)
    assert torch.equal(first, again)


@pytest.mark.parametrize("block_n,target", [(16, 1), (16, 12), (32, 40), (16, 64), (128, 4)])
def test_decode_attention_under_every_launch_matches_the_reference(block_n, target):
    """A tuned launch (slots per block, programs targeted) changes how the cache is cut into
    shares, not the result: one share, several (3, 10, and 16: the most `splits_for` gives), and
    shares past the filled slots."""
    from kernels.attention import (
        AttentionLaunch,
        decode_attention,
        decode_attention_reference,
        splits_for,
    )

    B, Hq, K, L, D, E, last = 2, 4, 2, 300, 16, 16, 170
    launch = AttentionLaunch(block_n=block_n, num_warps=2, target_programs=target)
    q, k, v, allowed = _attention_inputs(B, Hq, K, L, D, E)
    out = decode_attention(q, k, v, allowed, torch.tensor([last]), 0.3, launch=launch)
    assert splits_for(B * K, L, launch) == {1: 1, 12: 3, 40: 10, 64: 16, 4: 1}[target]
    torch.testing.assert_close(out, decode_attention_reference(q, k, v, allowed, last, 0.3), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block_n,target", [(16, 1), (16, 40), (64, 8)])
def test_decode_attention_with_sinks_matches_the_reference(block_n, target):
    """Attention sinks (one logit per query head with no value, GPT-OSS): the reference's softmax
    over [scores, sink], in one share or many (share 0 adds the sink); a row with nothing allowed
    gives 0; sinks of another length are refused."""
    from kernels.attention import (
        AttentionLaunch,
        decode_attention,
        decode_attention_reference,
        splits_for,
    )

    B, Hq, K, L, D, E, last = 3, 8, 2, 200, 16, 16, 170
    q, k, v, allowed = _attention_inputs(B, Hq, K, L, D, E)
    sinks_H = 2 * torch.randn(Hq, generator=torch.Generator().manual_seed(3))
    launch = AttentionLaunch(block_n=block_n, num_warps=2, target_programs=target)
    out = decode_attention(q, k, v, allowed, torch.tensor([last]), 0.3, launch=launch, sinks_H=sinks_H)
    assert splits_for(B * K, L, launch) == {1: 1, 40: 7, 8: 2}[target]
    torch.testing.assert_close(out, decode_attention_reference(q, k, v, allowed, last, 0.3, sinks_H),
                               rtol=1e-5, atol=1e-5)
    without = decode_attention(q, k, v, allowed, torch.tensor([last]), 0.3, launch=launch)
    assert (out[:-1] - without[:-1]).abs().max() > 1e-3  # the sinks took mass
    assert out[-1].abs().max() == 0
    with pytest.raises(ValueError, match="sinks"):
        decode_attention(q, k, v, allowed, torch.tensor([last]), 0.3, sinks_H=sinks_H[:4])


def test_a_launch_the_device_cannot_hold_is_halved_until_it_fits(monkeypatch):
    """A tuned entry whose tiles need more shared memory than the device has (Triton's
    OutOfResources, raised before anything is enqueued): the launch is halved in BLOCK_N until it
    fits, gives the reference's result, and the launch that fitted is remembered for that shape
    and dtype; another error is not swallowed."""
    from triton.runtime.errors import OutOfResources

    import kernels.attention as attention
    from kernels.attention import AttentionLaunch, decode_attention, decode_attention_reference

    launcher = attention._decode_attention.on(torch.device("cpu"))
    seen = []

    class Limited:  # a device that holds BLOCK_N <= 32 only
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append(kwargs["BLOCK_N"])
                if kwargs["BLOCK_N"] > 32:
                    raise OutOfResources(kwargs["BLOCK_N"] * 2048, 65536, "shared memory")
                return launcher[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(attention._decode_attention, "on", lambda dev: Limited())
    monkeypatch.setattr(attention, "_FITTED", {})
    B, Hq, K, L, D, E, last = 2, 4, 2, 300, 16, 16, 170
    q, k, v, allowed = _attention_inputs(B, Hq, K, L, D, E)
    tuned = AttentionLaunch(block_n=128, num_warps=2, target_programs=8)
    out = decode_attention(q, k, v, allowed, torch.tensor([last]), 0.3, launch=tuned)
    torch.testing.assert_close(out, decode_attention_reference(q, k, v, allowed, last, 0.3), rtol=1e-5, atol=1e-5)
    assert seen == [128, 64, 32]
    assert [f.block_n for f in attention._FITTED.values()] == [32]
    seen.clear()
    decode_attention(q, k, v, allowed, torch.tensor([last]), 0.3, launch=tuned)
    assert seen == [32]  # straight to the launch that fitted
    seen.clear()
    decode_attention(q.double(), k.double(), v.double(), allowed, torch.tensor([last]), 0.3, launch=tuned)
    assert seen == [128, 64, 32]  # another dtype is fitted on its own
    seen.clear()
    with pytest.raises(OutOfResources, match="shared memory"):  # a tuner's candidate: as named or not at all
        decode_attention(q, k, v, allowed, torch.tensor([last]), 0.3, launch=tuned, fit=False)
    assert seen == [128]

    class Broken:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise OutOfResources(300, 255, "registers")
            return launch

    monkeypatch.setattr(attention._decode_attention, "on", lambda dev: Broken())
    with pytest.raises(OutOfResources, match="registers"):
        decode_attention(q, k, v, allowed, torch.tensor([last]), 0.3, launch=tuned)


def test_bad_attention_launches_are_refused():
    from kernels.attention import AttentionLaunch

    with pytest.raises(ValueError, match="block_n must be a power of two"):
        AttentionLaunch(block_n=48)
    with pytest.raises(ValueError, match="target_programs must be >= 1"):
        AttentionLaunch(target_programs=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,Hq,K,L,D,E,last,sinks", [(*shape, False) for shape in ATTN_SHAPES] + [
    (64, 32, 4, 640, 128, 128, 300, False), (16, 32, 4, 1024, 128, 128, 700, False),
    (16, 64, 8, 640, 64, 64, 300, True)])  # the last: gpt-oss-20b's heads, with its attention sinks
def test_gpu_decode_attention(B, Hq, K, L, D, E, last, sinks, dtype):
    """Compiled: as the reference, in one share or many (the last to finish combines), attention
    sinks included, and the same again when replayed in a CUDA graph (the arrival counters reset
    themselves)."""
    from kernels.attention import decode_attention, decode_attention_reference

    q, k, v, allowed = _attention_inputs(B, Hq, K, L, D, E, dtype, "cuda")
    k[:, :, last + 1:], v[:, :, last + 1:] = float("nan"), float("nan")
    last_1 = torch.tensor([last], device="cuda")
    sinks_H = torch.randn(Hq, generator=torch.Generator().manual_seed(5)).to("cuda", dtype) if sinks else None
    out = decode_attention(q, k, v, allowed, last_1, 0.2, sinks_H=sinks_H)
    ref = decode_attention_reference(q, k, v, allowed, last, 0.2, sinks_H)
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # (a relative norm: a row may be all zeros)
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = decode_attention(q, k, v, allowed, last_1, 0.2, sinks_H=sinks_H)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(replayed, out)


# ----------------------------------------------------------------------------- experts v3


V3_CASES = [  # T, E, K, H, I, dtype, budget (None: the union), reassign
    (1, 8, 2, 40, 24, torch.float32, None, "backfill"),
    (5, 60, 4, 72, 40, torch.float16, 5, "drop"),
    (16, 64, 6, 48, 56, torch.float32, 9, "backfill"),
    (16, 32, 4, 40, 24, torch.float32, 6, "similar"),
    (64, 128, 8, 40, 24, torch.float32, 16, "backfill"),
]


@pytest.mark.parametrize("T,E,K,H,I,dtype,budget,mode", V3_CASES)
def test_fused_experts_kept_list_matches_reference(T, E, K, H, I, dtype, budget, mode):
    """The two-launch path (the selection's kept list, output written directly) against float64."""
    from kernels.select import Rule

    b = make_batch(T, E, K, H, dtype, seed=T + E + 1)
    gu, dn = make_experts(E, H, I, dtype, seed=E + 1)
    sim = torch.rand(E, E, generator=torch.Generator().manual_seed(2)) if mode == "similar" else None
    sel = select_reassign(b.probs_TE, b.topk_idx_TK, b.topk_w_TK, b.active_T, budget, kind="router_sum", sim_EE=sim,
                          rule=Rule(reassign_mode=mode))  # fmt: skip
    if mode == "similar":  # a token may then hold one expert twice: its weights add up
        assert any(len(set(r.tolist())) < K for r in sel.topk_idx_TK)
    out = fused_experts(b.z_TH, gu, dn, sel.topk_idx_TK, sel.topk_w_TK, keep_M=sel.keep_M)
    assert_near_reference(out, experts_reference(b.z_TH, gu, dn, sel.topk_idx_TK, sel.topk_w_TK), dtype)


def test_fused_experts_kept_list_gptoss_layout_with_bias():
    from kernels.select import route_select

    T, E, K, H, I = 7, 8, 2, 40, 24
    b = make_batch(T, E, K, H, seed=5)
    gu, dn, kw, g = gptoss_experts(E, H, I)
    _, sel = route_select(torch.randn(T, E, generator=g), K, b.active_T, 3, norm_topk=True)
    out = fused_experts(b.z_TH, gu, dn, sel.topk_idx_TK, sel.topk_w_TK, keep_M=sel.keep_M, **kw)
    assert_near_reference(out, experts_reference(b.z_TH, gu, dn, sel.topk_idx_TK, sel.topk_w_TK, **kw))


def gptoss_transformers(gu, dn, kw, x_TH, idx_TK, w_TK):
    """transformers' own GptOssExperts (eager) on the same weights: the layout as gpt-oss defines it."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    E, H, I2 = gu.shape
    cfg = GptOssConfig(hidden_size=H, intermediate_size=I2 // 2, num_local_experts=E, swiglu_limit=kw["layout"].limit)
    cfg._experts_implementation = "eager"
    m = GptOssExperts(cfg)
    with torch.no_grad():
        for name, p in (("gate_up_proj", gu), ("down_proj", dn), ("gate_up_proj_bias", kw["gate_up_bias"]),
                        ("down_proj_bias", kw["down_bias"])):
            getattr(m, name).copy_(p)
        return m(x_TH, idx_TK, w_TK)


# Interleaved gate_up (gate and up rows alternate) is loaded as one tile of 2*BI adjacent rows and
# split after the dot. Blocks smaller than the shape (BI=BH=16 for I=24, H=40) give two I blocks,
# the second one partial, and a partial last H block: the split's offsets and masked tail.
SMALL_GATE_UP = {"TB": 16, "BI": 16, "BH": 16, "num_warps": 4, "num_stages": 1, "PER_SM": 2}
SMALL_GATE_UP_KEPT = {"BI": 16, "BH": 16, "num_warps": 4, "num_stages": 1, "PER_SM": 2}


INTERLEAVED_CASES = [  # layout, dtype, kept (v3) or not (v2); the fast tier runs the first and the last
    pytest.param(GPTOSS, torch.float32, False, id="gptoss-fp32-v2"),
    pytest.param(GPTOSS, torch.float16, False, id="gptoss-fp16-v2"),
    pytest.param(GPTOSS, torch.float16, True, id="gptoss-fp16-v3"),
    pytest.param(ExpertsLayout(interleaved=True), torch.float32, False, id="interleaved-rows-silu-fp32-v2"),
    pytest.param(ExpertsLayout(interleaved=True), torch.float32, True, id="interleaved-rows-silu-fp32-v3"),
    pytest.param(GPTOSS, torch.float32, True, id="gptoss-fp32-v3"),
]


@pytest.mark.parametrize("layout,dtype,kept", INTERLEAVED_CASES)
def test_interleaved_gate_up_in_partial_blocks_matches_the_references(layout, dtype, kept, monkeypatch):
    """Both paths (v2 four launches, v3 kept list), biases and slots of weight 0 included, against
    the float64 loop and, in fp32, transformers' GptOssExperts: gate = even rows, up = odd ones."""
    import kernels.experts as ke
    from kernels.select import route_select

    T, E, K, H, I = 7, 8, 2, 40, 24
    b = make_batch(T, E, K, H, dtype, seed=21)
    gu, dn = make_experts(E, H, I, dtype, layout, seed=22)
    g = torch.Generator().manual_seed(23)
    kw = {"layout": layout, "gate_up_bias": torch.randn(E, 2 * I, generator=g).to(dtype),
          "down_bias": torch.randn(E, H, generator=g).to(dtype)}
    _, sel = route_select(torch.randn(T, E, generator=g), K, b.active_T, 3, norm_topk=True, reassign_mode="drop")
    assert (sel.topk_w_TK == 0).any()  # slots on an expert that was not kept: skipped
    cfg = ke.ExpertsConfig(gate_up=SMALL_GATE_UP, gate_up_kept=SMALL_GATE_UP_KEPT, use_kept=kept)
    paths, v3 = [], ke._fused_experts_kept
    monkeypatch.setattr(ke, "_fused_experts_kept", lambda *a, **k: paths.append("v3") or v3(*a, **k))
    out = fused_experts(b.z_TH, gu, dn, sel.topk_idx_TK, sel.topk_w_TK, keep_M=sel.keep_M, config=cfg, **kw)
    assert paths == (["v3"] if kept else [])
    idx_TK, w_TK = sel.topk_idx_TK, sel.topk_w_TK
    assert_near_reference(out, experts_reference(b.z_TH, gu, dn, idx_TK, w_TK, **kw), dtype)
    if layout == GPTOSS and dtype == torch.float32:
        assert_near_reference(out, gptoss_transformers(gu, dn, kw, b.z_TH, idx_TK, w_TK).double())


@pytest.mark.parametrize("kept", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_residual_add_in_the_last_launch_equals_adding_the_output(kept, dtype):
    """residual_TH folded into reduce (four launches) or v3's down: bit for bit the output of the
    same launches without it plus the residual, as PyTorch adds two tensors of that dtype."""
    from kernels.select import route_select

    T, E, K, H, I = 6, 16, 4, 48, 24
    b = make_batch(T, E, K, H, dtype, seed=11)
    gu, dn = make_experts(E, H, I, dtype, seed=12)
    g = torch.Generator().manual_seed(13)
    _, sel = route_select(torch.randn(T, E, generator=g), K, b.active_T, 5, norm_topk=True)
    residual_TH = (torch.randn(T, H, generator=g) * 3).to(dtype)
    keep_M = sel.keep_M if kept else None
    plain = fused_experts(b.z_TH, gu, dn, sel.topk_idx_TK, sel.topk_w_TK, keep_M=keep_M)
    folded = fused_experts(b.z_TH, gu, dn, sel.topk_idx_TK, sel.topk_w_TK, keep_M=keep_M, residual_TH=residual_TH)
    assert folded.dtype == dtype and torch.equal(folded, residual_TH + plain)
    assert not torch.equal(folded, plain)


@pytest.mark.parametrize("dtype,residual", [(torch.float32, False), (torch.float16, True)])
def test_the_reduce_inside_the_down_launch_gives_the_reduce_launchs_output_bit_for_bit(dtype, residual, monkeypatch):
    """ExpertsConfig.reduce_in_down (three launches): each column block's last down item sums the
    block in slot order, so the output equals the four-launch path's exactly, budgeted slots of
    weight 0 and the residual add included; its arrival counters return to 0 (a second launch, as
    a graph replay, gives the same)."""
    import kernels._triton as kt
    from kernels._triton import arrival_counters
    from kernels.experts import ExpertsConfig
    from kernels.select import route_select

    monkeypatch.setattr(kt, "POISON", True)  # scratch starts as NaN: a sum read before its rows are written shows
    T, E, K, H, I = 20, 16, 4, 72, 24  # ragged: 72 = 2 column blocks of 32 and one of 8; 2 token steps
    b = make_batch(T, E, K, H, dtype, seed=21)
    gu, dn = make_experts(E, H, I, dtype, seed=22)
    g = torch.Generator().manual_seed(23)
    _, sel = route_select(torch.randn(T, E, generator=g), K, b.active_T, 5, norm_topk=True)
    w_TK = sel.topk_w_TK.clone()
    w_TK[::3, -1] = 0  # empty slots, as reassign's drop mode leaves them
    res = (torch.randn(T, H, generator=g) * 3).to(dtype) if residual else None
    down = {"TB": 16, "BHO": 32, "BI": 16, "num_warps": 2, "num_stages": 1, "PER_SM": 2}
    four = ExpertsConfig(down=down, use_kept=False)
    three = ExpertsConfig(down=down, use_kept=False, reduce_in_down=True)
    expected = fused_experts(b.z_TH, gu, dn, sel.topk_idx_TK, w_TK, config=four, residual_TH=res)
    got = fused_experts(b.z_TH, gu, dn, sel.topk_idx_TK, w_TK, config=three, residual_TH=res)
    assert torch.equal(got, expected) and not expected.isnan().any()
    assert (arrival_counters(3, b.z_TH.device, "experts_down")[:3] == 0).all()
    assert torch.equal(fused_experts(b.z_TH, gu, dn, sel.topk_idx_TK, w_TK, config=three, residual_TH=res), expected)


def test_the_reduce_inside_the_down_launch_writes_the_output_when_nothing_is_routed():
    """Every weight 0 (no work item): each column block still gets its one (empty) item, which
    writes zeros plus the residual, as the reduce launch does."""
    from kernels.experts import ExpertsConfig

    T, E, K, H, I = 3, 8, 2, 40, 16
    b = make_batch(T, E, K, H, seed=31)
    gu, dn = make_experts(E, H, I, torch.float32, seed=32)
    res = torch.randn(T, H, generator=torch.Generator().manual_seed(33))
    zero_w = torch.zeros_like(b.topk_w_TK)
    cfg = ExpertsConfig(down={"TB": 16, "BHO": 16, "BI": 16, "num_warps": 2, "num_stages": 1, "PER_SM": 1},
                        use_kept=False, reduce_in_down=True)
    assert torch.equal(fused_experts(b.z_TH, gu, dn, b.topk_idx_TK, zero_w, config=cfg, residual_TH=res), res)
    assert (fused_experts(b.z_TH, gu, dn, b.topk_idx_TK, zero_w, config=cfg) == 0).all()


def _qwen3_bf16_case(T: int, seed: int) -> tuple:
    """Qwen3-30B-A3B's experts in bf16 on the GPU, T tokens routed at budget 16, and a residual:
    (x_TH, gate_up, down, selection, residual_TH)."""
    from kernels.select import route_select

    E, K, H, I = 128, 8, 2048, 768
    dev = torch.device("cuda")
    b = make_batch(T, E, K, H, torch.bfloat16, device=dev, seed=seed)
    gu, dn = make_experts(E, H, I, torch.bfloat16, seed=seed + 1, device=dev)
    g = torch.Generator().manual_seed(seed + 2)
    _, sel = route_select(torch.randn(T, E, generator=g).to(dev), K, b.active_T.to(dev), 16, norm_topk=True)
    return b.z_TH.to(dev, torch.bfloat16), gu, dn, sel, torch.randn(T, H, generator=g).to(dev, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 16, 64])
def test_gpu_the_reduce_inside_the_down_launch_is_the_reduce_launchs_sum(T):
    """Compiled, Qwen3-30B-A3B's experts in bf16 with the residual: three launches give the four
    launches' output bit for bit (the last item of a block sums after every item's rows land),
    and the same again replayed in a CUDA graph (the counters reset themselves)."""
    from base.runtime.graphs import capture_outputs
    from kernels.experts import ExpertsConfig, get_config

    x, gu, dn, sel, res = _qwen3_bf16_case(T, seed=41)
    tuned = get_config(2048, 768, T, x.device)
    four = ExpertsConfig(gate_up=tuned.gate_up, down=tuned.down, use_kept=False)
    three = ExpertsConfig(gate_up=tuned.gate_up, down=tuned.down, use_kept=False, reduce_in_down=True)

    def run(cfg):
        return fused_experts(x, gu, dn, sel.topk_idx_TK, sel.topk_w_TK, config=cfg, residual_TH=res)

    expected = run(four)
    assert torch.equal(run(three), expected)
    replay, out = capture_outputs(lambda: run(three))
    for _ in range(3):
        replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("T", [1, 16])  # up to ROUTE_IN_MAX pairs: the one launch's only sizes
def test_gpu_gate_up_and_down_in_one_launch_are_the_two_launches_bit_for_bit(monkeypatch, T, fold):
    """Compiled, Qwen3-30B-A3B's experts in bf16 with the residual and the tuned launches: the
    one-launch FFN (every program resident, down's items waiting on their expert's gate_up items
    across programs, which the interpreter's one program never does) gives the two launches' output
    bit for bit, and the same again replayed in a CUDA graph (the per-slot flags reset themselves)."""
    from dataclasses import replace

    import kernels.experts as ke
    from base.runtime.graphs import capture_outputs

    x, gu, dn, sel, res = _qwen3_bf16_case(T, seed=43)
    cfg = replace(ke.get_config(2048, 768, T, x.device), use_kept=False, reduce_in_down=fold)

    def run():  # fit=False: the one launch as the table names it (not the two, where it would not fit)
        return fused_experts(x, gu, dn, sel.topk_idx_TK, sel.topk_w_TK, config=cfg, residual_TH=res, fit=False)

    monkeypatch.setattr(ke, "FUSED_FFN", False)
    expected = run()
    monkeypatch.setattr(ke, "FUSED_FFN", True)
    before = ke.ffn_waits_given_up()
    assert torch.equal(run(), expected)
    replay, out = capture_outputs(run)
    for _ in range(3):
        replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
    assert ke.ffn_waits_given_up() == before, "a wait gave up: a program it needed was not resident"


@pytest.mark.gpu
@pytest.mark.parametrize("kept", [False, True])
def test_gpu_residual_add_in_the_last_launch_is_the_bf16_add(kept):
    """On the GPU in bf16 (which the interpreter gets wrong): the folded add is PyTorch's add."""
    x, gu, dn, sel, residual_TH = _qwen3_bf16_case(16, seed=11)
    keep_M = sel.keep_M if kept else None
    plain = fused_experts(x, gu, dn, sel.topk_idx_TK, sel.topk_w_TK, keep_M=keep_M)
    folded = fused_experts(x, gu, dn, sel.topk_idx_TK, sel.topk_w_TK, keep_M=keep_M, residual_TH=residual_TH)
    assert torch.equal(folded, residual_TH + plain)


def test_the_tuned_table_picks_the_faster_expert_path(monkeypatch):
    """use_kept (v3 with a kept list) follows the table's two objectives; without both: v3 on the
    CPU, the four-launch path on a GPU. reduce_in_down where the entry says so, else off."""
    import kernels.experts as ke

    table = {"H=8,I=4,T=16": {"gate_up": {}, "down": {}, "objective": 1.5, "objective_kept": 1.2},
             "H=8,I=4,T=64": {"gate_up": {}, "down": {}, "objective": 1.5, "objective_kept": 2.0,
                              "reduce_in_down": True},
             "H=8,I=4,T=1": {"gate_up": {}, "down": {}, "objective": 1.5}}
    monkeypatch.setattr(ke, "_load_configs", lambda name: table if name != "default" else {})
    monkeypatch.setattr(ke, "device_name", lambda device: "gpu")
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert ke.get_config(8, 4, 16, gpu).use_kept and not ke.get_config(8, 4, 64, gpu).use_kept
    assert not ke.get_config(8, 4, 1, gpu).use_kept and ke.get_config(8, 4, 1, cpu).use_kept
    assert not ke.get_config(16, 4, 16, gpu).use_kept  # no entry for the shape
    assert ke.get_config(8, 4, 64, gpu).reduce_in_down and not ke.get_config(8, 4, 16, gpu).reduce_in_down


def test_the_kept_bound_decides_the_expert_path_where_the_table_measured_it(monkeypatch):
    """An entry with kept_max (measured per kept bound by tools/tune_kernels.py) takes v3 for a kept
    list of at most that many experts (a budget) and the four-launch path above it (dense, whose
    kept list is E long), over the objectives; both paths give the reference's output."""
    import kernels.experts as ke

    table = {"H=40,I=24,T=8": {"gate_up": {}, "down": {}, "objective": 1.0, "objective_kept": 2.0, "kept_max": 4}}
    monkeypatch.setattr(ke, "_load_configs", lambda name: table if name != "default" else {})
    cfg = ke.get_config(40, 24, 8, torch.device("cpu"))
    assert cfg.use_kept and cfg.kept_max == 4  # kept_max decides, not the objectives
    ran = []
    real = ke._fused_experts_kept
    monkeypatch.setattr(ke, "_fused_experts_kept", lambda *a, **kw: ran.append("v3") or real(*a, **kw))
    g = torch.Generator().manual_seed(0)
    E, H, I, T, K = 8, 40, 24, 8, 2
    x = torch.randn(T, H, generator=g)
    gu, dn = torch.randn(E, 2 * I, H, generator=g) / H**0.5, torch.randn(E, H, I, generator=g) / I**0.5
    idx = torch.randint(0, 3, (T, K), generator=g)  # only experts 0-2 routed
    idx[:, 1] = (idx[:, 0] + 1) % 3
    w = torch.rand(T, K, generator=g)
    ref = experts_reference(x, gu, dn, idx, w)
    for bound, path in ((4, "v3"), (E, "four")):  # a budget of 4; dense's kept list
        keep_M = torch.full((bound,), -1, dtype=torch.int64)
        keep_M[:3] = torch.arange(3)
        ran.clear()
        out = ke.fused_experts(x, gu, dn, idx, w, keep_M=keep_M)
        assert ran == (["v3"] if path == "v3" else []), bound
        torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("D,E", [(16, 16), (24, 10)])
def test_write_kv_rows_matches_the_reference(dtype, D, E):
    """Interpreted on the CPU: each row's K/V heads land at its own slot of both caches, new
    values taken through strided views (as attention hands them over) and cast to the cache's
    dtype; every other slot keeps its value; a slot outside the cache writes nothing."""
    from kernels.kv_write import write_kv_rows, write_kv_rows_reference

    B, K, L = 5, 3, 40
    g = torch.Generator().manual_seed(7)
    k_cache, v_cache = torch.randn(B, K, L, D, generator=g).to(dtype), torch.randn(B, K, L, E, generator=g).to(dtype)
    k_BQKD = torch.randn(B, 1, K, D, generator=g)  # (B, Q, K, D) viewed as (B, K, D): strided like a transpose
    v_BQKE = torch.randn(B, 1, K, E, generator=g)
    k_new, v_new = k_BQKD.transpose(1, 2)[:, :, 0], v_BQKE.transpose(1, 2)[:, :, 0]
    slot_B = torch.tensor([0, 39, 7, 7, 12])
    want_k, want_v = k_cache.clone(), v_cache.clone()
    write_kv_rows_reference(want_k, want_v, k_new, v_new, slot_B)
    write_kv_rows(k_cache, v_cache, k_new, v_new, slot_B)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)

    before_k, before_v = k_cache.clone(), v_cache.clone()
    write_kv_rows(k_cache, v_cache, k_new, v_new, torch.tensor([0, L, -1, 3, 4]))  # rows 1, 2 out of range
    assert torch.equal(k_cache[1:3], before_k[1:3]) and torch.equal(v_cache[1:3], before_v[1:3])
    assert torch.equal(k_cache[3, :, 3], k_new[3].to(dtype)) and torch.equal(v_cache[4, :, 4], v_new[4].to(dtype))


def test_write_kv_rows_refuses_shapes_that_do_not_match():
    from kernels.kv_write import write_kv_rows

    k, v = torch.zeros(2, 2, 8, 4), torch.zeros(2, 2, 8, 4)
    with pytest.raises(ValueError, match="do not match"):
        write_kv_rows(k, v, torch.zeros(2, 2, 4), torch.zeros(2, 2, 4), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="contiguous in its last dimension"):
        write_kv_rows(k, v, torch.zeros(2, 4, 2).transpose(1, 2), torch.zeros(2, 2, 4), torch.zeros(2, dtype=torch.long))


@pytest.mark.gpu
@cuda
def test_gpu_write_kv_rows_matches_the_reference_in_bf16_eagerly_and_replayed():
    """Compiled on the GPU, bf16 caches (the interpreter gets bf16 wrong): the reference's writes,
    eagerly and in a replayed CUDA graph whose slots move between replays."""
    from kernels.kv_write import write_kv_rows, write_kv_rows_reference

    B, K, L, D = 16, 4, 640, 128
    g = torch.Generator().manual_seed(3)
    k_cache = torch.randn(B, K, L, D, generator=g).to("cuda", torch.bfloat16)
    v_cache = torch.randn(B, K, L, D, generator=g).to("cuda", torch.bfloat16)
    k_new, v_new = torch.randn(B, K, D, generator=g).cuda(), torch.randn(B, K, D, generator=g).cuda()
    slot_B = torch.randint(0, L, (B,), generator=g).cuda()
    want_k, want_v = k_cache.clone(), v_cache.clone()
    write_kv_rows_reference(want_k, want_v, k_new, v_new, slot_B)
    write_kv_rows(k_cache, v_cache, k_new, v_new, slot_B)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    replay, _ = capture_graph(lambda: write_kv_rows(k_cache, v_cache, k_new, v_new, slot_B))
    slot_B.add_(1).remainder_(L)
    replay()
    write_kv_rows_reference(want_k, want_v, k_new, v_new, slot_B)
    torch.cuda.synchronize()
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
