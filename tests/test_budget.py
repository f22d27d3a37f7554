"""A budgeted tiny random Qwen3-MoE (fp32, eager experts loop): the owned MoE blocks keep at most
`budget` experts per layer and decode step, driven by transformers' generate (base/eval/generate.py)
or by explicit per-forward inputs.

What runs is observed, not inferred from indices: `MoeProbe` records which expert weight slices the
eager loop reads (`gate_up_proj[u]`, `down_proj[u]`) per forward and layer, and the router's own
output from a hook installed before the budget.

Shapes: B = 4 sequences, E = 8 experts, K = 2, H = 32, L = 2 MoE layers, M budget.
"""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from base.eval.generate import active_rows
from base.hf.budget import BudgetOptions, install_budget
from base.hf.moe_block import BudgetedMoE
from base.method.routing import reassign
from base.method.selectors import build_selector
from tests.helpers import (
    BUDGETED,
    PAD_ID,
    MoeProbe,
    budgeted,
    ids_of,
    ignore_norm_runs,
    left_padded,
    one_thread,
    random_artifacts,
    random_batch,
    tiny_qwen3,
    top_m_by_hand,
)

E, K, H, L = 8, 2, 32, 2
NEW = 5  # new tokens per generate(): one prefill forward, NEW - 1 decode steps
IDS, MASK = left_padded([6, 3, 6, 4], vocab=64, pad_id=PAD_ID)
ALL_SELECTORS = [*BUDGETED, "oea"]


def selector(name: str, k0: int = 1):
    return build_selector(name, random_artifacts(L, E, H), k0=k0 if name == "oea" else None)


def generate(model, budget=None, ids=IDS, mask=MASK, new=NEW, **kwargs):
    from tests.helpers import generate as budgeted_generate

    return budgeted_generate(model, budget, ids, mask, new, **kwargs)


_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def model():
    m = tiny_qwen3(num_experts=E, top_k=K)
    m.generation_config.eos_token_id = None  # every row decodes all NEW tokens unless a test says otherwise
    return m


@pytest.fixture(scope="module")
def dense(model):
    return generate(model)


def union_of(idx_TK: torch.Tensor, rows: torch.Tensor | None = None) -> set[int]:
    return set((idx_TK if rows is None else idx_TK[rows]).flatten().tolist())


# ---- the budget bounds what runs ---------------------------------------------------------------
@pytest.mark.parametrize("name", ALL_SELECTORS)
def test_at_most_budget_experts_run_per_layer_and_decode_step(model, monkeypatch, name):
    M = 2
    probe = MoeProbe(model)
    ignore_norm_runs(monkeypatch, probe)  # oracle measures every routed expert's norm: not decode work
    try:
        with budgeted(model, "qwen3_moe", selector(name), BudgetOptions(budget=M)) as budget, probe:
            generate(model, budget)
    finally:
        probe.remove()
    rows = {(r["step"], r["layer"]): r for r in budget.stats_rows()}
    decode = probe.decode_forwards()
    assert decode == list(range(1, NEW))
    assert {s for s, _ in rows} == set(decode)  # apply_to=decode: prefill is not recorded
    assert max(r["union"] for r in rows.values()) > M, "the budget must bind somewhere"
    for f, layer in itertools.product(decode, range(L)):
        ran, idx_TK = probe.executed[f, layer], probe.routed[f, layer][0]
        assert ran <= union_of(idx_TK)
        assert len(ran) == rows[f, layer]["kept"]
        assert set(probe.applied[f, layer][0].flatten().tolist()) == ran
        if name == "oea":  # keeps each token's top-1 (the router's top-k is sorted by p)
            assert ran == union_of(idx_TK[:, :1])
        else:
            assert len(ran) <= M


def test_prefill_runs_every_routed_expert_with_apply_to_decode(model):
    probe = MoeProbe(model)
    try:
        with budgeted(model, "qwen3_moe", selector("router_sum"), BudgetOptions(budget=1)) as budget, probe:
            generate(model, budget, new=2)
    finally:
        probe.remove()
    real_T = MASK.reshape(-1).bool()
    for layer in range(L):
        assert len(probe.executed[0, layer]) > 1
        assert probe.executed[0, layer] >= union_of(probe.routed[0, layer][0], real_T)
        assert len(probe.executed[1, layer]) == 1


# ---- budget >= union is dense ------------------------------------------------------------------
@pytest.mark.parametrize("name", [*ALL_SELECTORS, "dense"])
def test_budget_covering_the_union_equals_dense(model, dense, name):
    sel = None if name == "dense" else selector(name, k0=K)
    with budgeted(model, "qwen3_moe", sel, BudgetOptions(budget=E)) as budget:
        out = generate(model, budget)
    assert torch.equal(out.sequences, dense.sequences)
    assert len(out.logits) == len(dense.logits) == NEW
    for got, want in zip(out.logits, dense.logits):
        assert torch.equal(got, want)
    assert len(budget.stats_rows()) == (NEW - 1) * L


def test_binding_budget_changes_decode_but_not_prefill(model, dense):
    with budgeted(model, "qwen3_moe", selector("router_sum"), BudgetOptions(budget=1)) as budget:
        out = generate(model, budget)
    assert torch.equal(out.logits[0], dense.logits[0])  # from the prefill forward
    assert not torch.allclose(out.logits[1], dense.logits[1])


# ---- prefill -----------------------------------------------------------------------------------
def prefill_inputs(budget, mask=MASK):
    """A prefill forward's inputs: every real (not padding) position takes part."""
    return budget.inputs(decode=False, active_T=mask.reshape(-1).bool())


def test_prefill_untouched_unless_apply_to_all(model):
    with torch.no_grad():
        dense_logits = model(input_ids=IDS, attention_mask=MASK).logits
    with (budgeted(model, "qwen3_moe", selector("router_sum"), BudgetOptions(budget=1)) as budget, torch.no_grad(),
          budget.bound(prefill_inputs(budget))):
        logits = model(input_ids=IDS, attention_mask=MASK).logits
    assert torch.equal(logits, dense_logits)
    assert budget.stats_rows() == []

    probe = MoeProbe(model)
    try:
        opts = BudgetOptions(budget=1, apply_to="all")
        with (budgeted(model, "qwen3_moe", selector("router_sum"), opts) as budget, probe, torch.no_grad(),
              budget.bound(prefill_inputs(budget))):
            logits = model(input_ids=IDS, attention_mask=MASK).logits
    finally:
        probe.remove()
    assert not torch.allclose(logits, dense_logits)
    rows = budget.stats_rows()
    assert [(r["layer"], r["decode"], r["kept"]) for r in rows] == [(0, False, 1.0), (1, False, 1.0)]
    assert all(len(probe.executed[0, layer]) == 1 for layer in range(L))


# ---- padding and finished rows -----------------------------------------------------------------
@pytest.mark.parametrize("budget", [2, E])
def test_left_padding_neither_joins_the_union_nor_adds_experts(model, budget):
    ids, mask = left_padded([3, 1], vocab=64, pad_id=PAD_ID, seed=1)
    real_T = mask.reshape(-1).bool()
    probe = MoeProbe(model)
    try:
        opts = BudgetOptions(budget=budget, apply_to="all")
        with (budgeted(model, "qwen3_moe", selector("router_sum"), opts) as moe, probe, torch.no_grad(),
              moe.bound(prefill_inputs(moe, mask))):
            model(input_ids=ids, attention_mask=mask)
    finally:
        probe.remove()
    padding_adds = False
    for r in moe.stats_rows():
        layer = r["layer"]
        idx_TK = probe.routed[0, layer][0]
        real = union_of(idx_TK, real_T)
        padding_adds |= union_of(idx_TK) > real
        assert r["union"] == len(real) and r["tokens"] == int(real_T.sum())
        ran = probe.executed[0, layer]
        assert ran <= real and len(ran) == min(budget, len(real))
        assert union_of(probe.applied[0, layer][0], ~real_T) <= ran  # padding uses kept experts only
    assert padding_adds, "padding must route to an expert no real token uses, or this test shows nothing"


@pytest.mark.parametrize("budget", [2, E])
def test_finished_and_pad_fed_rows_excluded_in_decode(model, budget):
    with torch.no_grad():
        prefill = model(input_ids=IDS, attention_mask=MASK, use_cache=True)
    next_ids = prefill.logits[:, -1].argmax(-1, keepdim=True)
    next_ids[3] = PAD_ID  # how generate() feeds a finished row
    finished_B = torch.tensor([False, True, False, False])  # row 1 ended at its stop string
    active_T = active_rows(next_ids[:, 0], torch.tensor([PAD_ID]), finished_B)
    assert active_T.tolist() == [True, False, True, False]
    probe = MoeProbe(model)
    try:
        with (budgeted(model, "qwen3_moe", selector("router_sum"), BudgetOptions(budget=budget)) as moe, probe,
              torch.no_grad(), moe.bound(moe.inputs(decode=True, active_T=active_T))):
            model(input_ids=next_ids, attention_mask=F.pad(MASK, (0, 1), value=1),
                  cache=prefill.past_key_values)
    finally:
        probe.remove()
    rows = moe.stats_rows()
    assert len(rows) == L and all(r["decode"] and r["tokens"] == 2 for r in rows)
    finished_add = False
    for r in rows:
        idx_TK = probe.routed[0, r["layer"]][0]
        live = union_of(idx_TK, active_T)
        finished_add |= union_of(idx_TK) > live
        assert r["union"] == len(live)
        ran = probe.executed[0, r["layer"]]
        assert ran <= live and len(ran) == min(budget, len(live))
        assert union_of(probe.applied[0, r["layer"]][0], ~active_T) <= ran
    assert finished_add, "finished rows must route elsewhere, or this test shows nothing"


def test_generate_rows_fed_pad_after_eos_stop_counting(model, dense):
    S = IDS.shape[1]
    eos = int(dense.sequences[0, S])  # row 0's first new token
    assert eos not in dense.sequences[1:, S:].flatten().tolist(), "pick prompts where only row 0 ends"
    with budgeted(model, "qwen3_moe", selector("router_sum"), BudgetOptions(budget=2)) as budget:
        out = generate(model, budget, eos_token_id=eos)
    assert (out.sequences[0, S + 1:] == PAD_ID).all()
    rows = budget.stats_rows()
    assert {r["step"] for r in rows} == set(range(1, NEW))
    # Step 1 feeds row 0 its eos token; from step 2 on it is fed the pad token and must not count.
    assert all(r["tokens"] == 3 for r in rows if r["step"] >= 2)


# ---- statistics --------------------------------------------------------------------------------
@torch.no_grad()
def expert_out_TH(experts, u: int, z_TH: torch.Tensor) -> torch.Tensor:
    """E_u(z) written out from the Qwen3 expert weights (SwiGLU), independent of the experts module."""
    gate, up = (z_TH.double() @ experts.gate_up_proj[u].double().T).chunk(2, dim=-1)
    return (F.silu(gate) * up) @ experts.down_proj[u].double().T


def test_stats_rows_match_a_manual_computation(model, monkeypatch):
    M = 3
    probe = MoeProbe(model)
    ignore_norm_runs(monkeypatch, probe)  # energy statistics measure every routed expert
    try:
        opts = BudgetOptions(budget=M, energy=True)
        with budgeted(model, "qwen3_moe", selector("router_sum"), opts) as budget, probe:
            generate(model, budget)
    finally:
        probe.remove()
    rows = budget.stats_rows()
    assert len(rows) == (NEW - 1) * L
    lost_somewhere = False
    for r in rows:
        f, layer = r["step"], r["layer"]
        idx_TK, w_TK, _, z_TH = probe.routed[f, layer]
        experts = budget.layers[layer].experts
        score = {}
        for t, k in itertools.product(range(idx_TK.shape[0]), range(K)):
            score[int(idx_TK[t, k])] = score.get(int(idx_TK[t, k]), 0.0) + float(w_TK[t, k])
        keep = top_m_by_hand(score, M)
        pairs = [(t, int(idx_TK[t, k]), float(w_TK[t, k])) for t in range(idx_TK.shape[0]) for k in range(K)]
        energy = {(t, u): w ** 2 * float(expert_out_TH(experts, u, z_TH[t:t + 1]).norm()) ** 2
                  for t, u, w in pairs}
        lost = {t for t, u, _ in pairs if u not in keep}
        lost_somewhere |= bool(lost)
        want = {
            "union": len(score), "kept": len(keep), "tokens": idx_TK.shape[0], "tokens_lost": len(lost),
            "weight_total": sum(w for *_, w in pairs), "weight_kept": sum(w for _, u, w in pairs if u in keep),
            "energy_total": sum(energy.values()),
            "energy_kept": sum(e for (_, u), e in energy.items() if u in keep),
        }
        assert {k: r[k] for k in want} == pytest.approx(want, rel=1e-4), (f, layer)
        assert probe.executed[f, layer] == keep
    assert lost_somewhere


# ---- renormalisation as configured -------------------------------------------------------------
@pytest.fixture(scope="module")
def model_unnormalised():
    m = tiny_qwen3(num_experts=E, top_k=K, norm_topk_prob=False)
    m.generation_config.eos_token_id = None
    return m


@pytest.mark.parametrize(("norm_topk_prob", "mode", "rescaled"), [
    (True, "model", True), (True, "always", True), (True, "never", False),
    (False, "model", False), (False, "always", True), (False, "never", False),
])
def test_renormalize_option(model, model_unnormalised, norm_topk_prob, mode, rescaled):
    m = model if norm_topk_prob else model_unnormalised
    probe = MoeProbe(m)
    try:
        opts = BudgetOptions(budget=2, reassign="drop", renormalize=mode)
        with budgeted(m, "qwen3_moe", selector("router_sum"), opts) as budget, probe:
            generate(m, budget, new=3)
    finally:
        probe.remove()
    assert budget.policy.renormalize is rescaled
    checked = 0
    for f, layer in itertools.product(probe.decode_forwards(), range(L)):
        idx_TK, w_TK = probe.routed[f, layer][:2]
        new_w_TK = probe.applied[f, layer][1]
        keep = probe.executed[f, layer]
        for t in range(idx_TK.shape[0]):
            kept_w = sum(float(w) for u, w in zip(idx_TK[t].tolist(), w_TK[t]) if u in keep)
            if kept_w == 0.0 or kept_w == float(w_TK[t].sum()):
                continue  # lost everything (nothing to rescale) or nothing
            want = float(w_TK[t].sum()) if rescaled else kept_w
            assert float(new_w_TK[t].sum()) == pytest.approx(want, rel=1e-5)
            checked += 1
    assert checked > 0


def test_budget_above_expert_count_fails_clearly(model):
    with pytest.raises(ValueError, match=f"budget=9 exceeds the {E} experts"):
        install_budget(model, "qwen3_moe", selector("router_sum"), BudgetOptions(budget=9))


# ---- the owned block ----------------------------------------------------------------------------
def test_owned_blocks_replace_the_model_blocks_and_remove_restores_them_exactly(model):
    blocks = {n: m for n, m in model.named_modules() if type(m).__name__ == "Qwen3MoeSparseMoeBlock"}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with budgeted(model, "qwen3_moe", selector("router_sum"), BudgetOptions(budget=2)):
        owned = {n: m for n, m in model.named_modules() if isinstance(m, BudgetedMoE)}
        assert set(owned) == set(blocks)
        for name, block in owned.items():  # the model's own parts, as children under their own names
            assert block.gate is blocks[name].gate and block.experts is blocks[name].experts
        assert list(model.state_dict()) == list(state)  # checkpoints load into a budgeted model
        with pytest.raises(ValueError, match="already budgeted"):
            install_budget(model, "qwen3_moe", None, BudgetOptions(budget=None))
        assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
        assert all("forward" not in m.__dict__ for m in model.modules())  # no forward swaps
    after = {n: m for n, m in model.named_modules() if type(m).__name__ == "Qwen3MoeSparseMoeBlock"}
    assert all(after[n] is blocks[n] for n in blocks) and len(after) == len(blocks)
    assert not any(isinstance(m, BudgetedMoE) for m in model.modules())
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_a_block_without_inputs_is_the_model_own_block(model, dense):
    """Unbound (no driver), a budgeted model decodes exactly as the dense one and records nothing."""
    with budgeted(model, "qwen3_moe", selector("router_sum"), BudgetOptions(budget=1)) as budget:
        out = generate(model)  # transformers' generate without the budget's driver
    assert torch.equal(out.sequences, dense.sequences)
    assert budget.stats_rows() == []


# ---- oracle is optimal for its objective -------------------------------------------------------
def retained_energy(batch, keep: set[int]) -> float:
    """sum over kept experts u of sum_t w_tu^2 ||E_u(z_t)||^2 (active tokens, original pairs)."""
    e_TK = (batch.topk_w_TK * batch.norms_TK) ** 2
    return sum(float(e_TK[t, k]) for t in range(e_TK.shape[0]) for k in range(e_TK.shape[1])
               if batch.active_T[t] and int(batch.topk_idx_TK[t, k]) in keep)


@pytest.mark.parametrize("seed", range(12))
def test_oracle_retains_the_most_true_energy_on_random_batches(seed):
    b = random_batch(seed, T=6, E=8, K=2, H=4, renorm=seed % 2 == 0)
    art = random_artifacts(1, 8, 4, seed)
    union = sorted(set(b.topk_idx_TK[b.active_T].flatten().tolist()))
    for M in (1, 2, 3):
        best = max(retained_energy(b, set(c)) for c in itertools.combinations(union, min(M, len(union))))
        oracle_keep = ids_of(build_selector("oracle").keep(b, M)[0])
        assert retained_energy(b, oracle_keep) == pytest.approx(best, rel=1e-6)
        for name in BUDGETED:
            keep = ids_of(build_selector(name, art).keep(b, M)[0])
            assert len(keep) == len(oracle_keep)
            assert retained_energy(b, keep) <= best * (1 + 1e-6), (name, M)


def test_oracle_retains_the_most_true_energy_in_the_model(model):
    """Layer 0 of decode step 1 sees the same input under every selector (prefill is dense)."""
    kept = {}
    for name in BUDGETED:
        with budgeted(model, "qwen3_moe", selector(name), BudgetOptions(budget=2, energy=True)) as budget:
            generate(model, budget, new=2)
        row = next(r for r in budget.stats_rows() if r["step"] == 1 and r["layer"] == 0)
        kept[name] = row["energy_kept"]
        assert row["energy_kept"] <= row["energy_total"]
    assert all(kept["oracle"] >= v * (1 - 1e-6) for v in kept.values()), kept
    assert kept["oracle"] > min(kept.values())


def test_reassign_uses_only_kept_experts_on_random_batches():
    for seed in range(8):
        b = random_batch(seed, T=8, E=8, K=3)
        keep_E, score_E = build_selector("router_sum").keep(b, 2)
        for mode in ("backfill", "drop"):
            idx_TK, _ = reassign(b, keep_E, score_E, mode, True)
            assert set(idx_TK.flatten().tolist()) <= ids_of(keep_E)
