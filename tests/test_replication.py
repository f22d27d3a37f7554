"""analysis/replication.py, issue 27's pre-registered analysis, on a synthetic replication grid with
planted effects: one Holm family over every accuracy comparison, the decision rule, the unpaired
block bootstrap against the variance it should find, the rule-by-family interaction against a
hand-computed Hotelling T^2, and the records round trip."""
from __future__ import annotations

import json
import zlib

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

from analysis import records as R
from analysis import replication as A

P = 400  # prompts
LAYERS = 2
BUDGETS = {"mini": (6, 8, 10), "mini_olmoe": (6, 9, 12)}
# prompts a rule gains (+) or loses (-) against base, per model and budget level: planted effects
EFFECT = {("mini", "base_anchor(k0=1)"): (60, 30, 0), ("mini", "router_sum"): (-60, -40, -30),
          ("mini", "oracle"): (50, 0, 0), ("mini", "top1_union"): (40, 0, -40),
          ("mini_olmoe", "router_sq"): (60, 0, 0), ("mini_olmoe", "router_sum"): (-50, -30, 0),
          ("mini_olmoe", "base_anchor(k0=1)"): (0, 0, 0)}


def _correct(model: str, rule: str, level: int, rng: np.random.Generator) -> np.ndarray:
    base = np.zeros(P, int)
    base[: P // 2] = 1  # base right on the first half
    if rule == "base":
        return base
    out = base.copy()
    k = EFFECT.get((model, rule), (0, 0, 0))[level]
    # 10 noise prompts each way (discordant, balanced; which ones depends on the rule and budget),
    # then the planted gain or loss on prompts no noise touches
    noise = np.random.default_rng(zlib.crc32(f"{model} {rule} {level}".encode()))
    out[P // 2 + noise.choice(np.arange(100, P // 2), 10, replace=False)] = 1
    out[noise.choice(np.arange(100, P // 2), 10, replace=False)] = 0
    if k > 0:
        out[P // 2: P // 2 + k] = 1
    elif k < 0:
        out[: -k] = 0
    return out


def _run(root, model: str, method: str, budget, correct: np.ndarray, rng: np.random.Generator, energy: float) -> None:
    name, _, k0 = method.partition("(k0=")
    k0 = int(k0.rstrip(")")) if k0 else None
    d = root / model / f"method={method},budget={budget}"
    d.mkdir(parents=True)
    (d / "report.json").write_text(json.dumps({
        "stage": "evaluate", "method": name, "budget": budget, "seed": 0, "model": model,
        "method_config": {"name": name, "k0": k0},
        "eval": {"batch_seed": 0, "tasks": ["pool_replication"], "limit": None, "batching": "continuous",
                 "admission": "fifo"}}))
    (d / "samples.jsonl").write_text("".join(json.dumps({
        "task": f"replication_{'ab'[i % 2]}", "doc_id": i // 2, "prompt_hash": f"h{i}", "correct": float(c),
        "decode_batch": 0, "prompt_tokens": 10, "new_tokens": 5}) + "\n" for i, c in enumerate(correct)))
    steps = 120 + int(rng.integers(0, 20))
    dense = rng.uniform(9, 11, (steps, LAYERS))
    e = np.clip(energy + rng.normal(0, 0.01, (steps, LAYERS)), 0, 1)
    rows = [{"layer": li, "step": s + 1, "decode": True, "union": 20.0, "kept": float(budget or 20), "tokens": 16.0,
             "weight_total": 16.0 if model == "mini" else 11.0, "energy_kept": 10 * e[s, li], "energy_total": 10.0,
             "out_err": (1 - e[s, li]) * dense[s, li], "out_dense": dense[s, li]}
            for s in range(steps) for li in range(LAYERS)]
    pd.DataFrame(rows).to_csv(d / "selection_steps.csv", index=False)


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    root = tmp_path_factory.mktemp("repl")
    rng = np.random.default_rng(0)
    for model, budgets in BUDGETS.items():
        for level, budget in enumerate(budgets):
            for rule in ("base", *A.RULES):
                energy = 0.80 if rule == "router_sum" else 0.95
                _run(root / "outputs", model, rule, budget, _correct(model, rule, level, rng), rng, energy)
        _run(root / "outputs", model, "dense", None, np.r_[np.ones(P - 10, int), np.zeros(10, int)], rng, 1.0)
    dests = []
    for model in BUDGETS:
        A.write_records(root / "outputs" / model, root / "records" / f"replication_{model}")
        dests.append(root / "records" / f"replication_{model}")
    table, calls, inter, prompts = A.analyse(dests)
    return {"root": root, "table": table, "calls": calls, "inter": inter, "prompts": prompts}


@pytest.mark.slow  # the synthetic grid: 44 run folders written and read (~15 s)
def test_primary_family_is_every_rule_at_every_budget_with_one_holm_correction(grid):
    prim = grid["calls"][grid["calls"]["family"] == "primary"]
    assert len(prim) == 6 * 3 * 2 and set(prim["method"]) == set(A.RULES) and "dense" not in set(prim["method"])
    assert np.allclose(prim["p_holm"], multipletests(prim["p"], method="holm")[1])
    assert "tie" not in set(prim["call"])
    # counts by hand from the planted vectors
    r = prim.set_index(["model", "method", "budget"]).loc[("mini", "base_anchor(k0=1)", 6)]
    a = _correct("mini", "base_anchor(k0=1)", 0, None)
    b = _correct("mini", "base", 0, None)
    assert (r["a_only"], r["b_only"]) == (int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())) == (70, 10)  # 60 planted + 10 noise each way
    assert r["p"] == pytest.approx(stats.binomtest(70, 80, 0.5).pvalue) and r["call"] == "higher"
    calls = prim.set_index(["model", "method", "budget"])["call"]
    assert calls[("mini", "router_sum", 10)] == "lower" and calls[("mini_olmoe", "router_sq", 6)] == "higher"
    assert calls[("mini_olmoe", "top1_union", 9)] == "inconclusive"
    assert (prim["mdd_exact"] > 0).all()


@pytest.mark.slow  # the synthetic grid: 44 run folders written and read (~15 s)
def test_decision_rule(grid):
    rec = A.recommend(grid["calls"][grid["calls"]["family"] == "primary"])
    # mini: base_anchor(k0=1) higher at 6 and 8, lower nowhere; oracle higher but not deployable;
    # top1_union higher at 6 but lower at 10: does not qualify
    assert rec["models"]["mini"]["rule"] == "base_anchor(k0=1)" and rec["models"]["mini"]["higher_at"] == [6, 8]
    assert "oracle" not in rec["models"]["mini"]["qualifying"] and "top1_union" not in rec["models"]["mini"]["qualifying"]
    assert rec["models"]["mini_olmoe"]["rule"] == "router_sq" and not rec["same"]
    assert dict(rec["lower"]["router_sum"]) == {"mini": [6, 8, 10], "mini_olmoe": [6, 9]}
    assert set(dict(rec["lower"]["top1_union"])) == {"mini"}
    # no rule higher anywhere: base
    flat = grid["calls"].assign(call="inconclusive")
    assert {v["rule"] for v in A.recommend(flat)["models"].values()} == {"base"}


@pytest.mark.slow  # the synthetic grid: 44 run folders written and read (~15 s)
def test_recommendation_text_names_the_calls(grid):
    text = A.recommendation_text(grid["calls"])
    assert "`base_anchor(k0=1)` on `mini`" in text and "`router_sq` on `mini_olmoe`" in text
    newest = A.THROUGHPUT[0].removeprefix("results/roofline/").rsplit("/", 1)[0]  # the grid's folder, its table's name off
    assert "Holm over all 36" in text and "× dense and" in text and f"`{newest}`" in text  # batch 16 from the newest
    assert "not replicated on fresh prompts" in text


@pytest.mark.slow  # the synthetic grid: 44 run folders written and read (~15 s)
def test_interaction_detects_a_planted_family_difference_and_matches_hand_hotelling(grid):
    inter = grid["inter"]
    om = inter[inter["test"] == "omnibus"].set_index("level")
    assert om.loc["tight", "call"] == "differs"  # base_anchor/oracle/top1_union up on mini, router_sq up on olmoe
    # Hotelling T^2 by hand on the centred contrasts at the tight level
    da = A._diffs(grid["prompts"]["mini"], 6)
    db = A._diffs(grid["prompts"]["mini_olmoe"], 6)
    dd = (da - db.loc[da.index]).to_numpy(float)
    e = (dd - dd.mean(1, keepdims=True))[:, :-1]
    n, p = e.shape
    xbar, cov = e.mean(0), np.cov(e, rowvar=False)
    t2 = n * xbar @ np.linalg.solve(cov, xbar)
    f = (n - p) / (p * (n - 1)) * t2
    assert om.loc["tight", "p"] == pytest.approx(stats.f.sf(f, p, n - p), rel=1e-6)
    rule = inter[(inter["test"] == "per rule") & (inter["level"] == "tight")].set_index("method")
    assert rule.loc["router_sq", "diff"] == pytest.approx(-60 / P) and rule.loc["router_sq", "call"] == "differs"
    # the loose level: router_sum -30 on mini, 0 on olmoe; top1_union -40 on mini: differs too
    assert inter[(inter["test"] == "per rule") & (inter["level"] == "loose")].set_index("method").loc[
        "base_anchor(k0=2)", "call"] == "not detected"


@pytest.mark.slow  # the synthetic grid: 44 run folders written and read (~15 s)
def test_identical_rule_effects_in_both_families_give_no_interaction(grid):
    same = {m: grid["prompts"]["mini"].assign(model=m) for m in ("mini", "mini_olmoe")}
    # give the second model mini's budgets' records under its own budget names
    remap = dict(zip(BUDGETS["mini"], BUDGETS["mini_olmoe"]))
    same["mini_olmoe"] = same["mini_olmoe"].assign(budget=same["mini_olmoe"]["budget"].map(
        lambda b: remap.get(b, b) if pd.notna(b) else b).astype("Int64"))
    inter = A.interaction(same)
    assert (inter["p"] == 1.0).all() and set(inter["call"]) == {"not detected"}


def _prompt_frames() -> dict[str, pd.DataFrame]:
    """The planted grid's prompt records in memory (no run folders): the fast tier's representative."""
    frames = {}
    for model, budgets in BUDGETS.items():
        rows = []
        for level, budget in enumerate(budgets):
            for rule in ("base", *A.RULES):
                c = _correct(model, rule, level, None)
                rows.append(pd.DataFrame({"model": model, "method": rule, "budget": budget, "seed": 0,
                                          "task": "t", "doc_id": np.arange(P), "prompt_hash": [f"h{i}" for i in range(P)],
                                          "correct": c.astype(float)}))
        f = pd.concat(rows, ignore_index=True)
        f["budget"] = f["budget"].astype("Int64")
        frames[model] = f
    return frames


@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_primary_calls_decision_and_interaction_from_prompt_records():
    prompts = _prompt_frames()
    prim = A.primary(prompts)
    assert len(prim) == 36 and np.allclose(prim["p_holm"], multipletests(prim["p"], method="holm")[1])
    r = prim.set_index(["model", "method", "budget"]).loc[("mini", "base_anchor(k0=1)", 6)]
    assert (r["a_only"], r["b_only"], r["call"]) == (70, 10, "higher")
    assert r["p"] == pytest.approx(stats.binomtest(70, 80, 0.5).pvalue)
    rec = A.recommend(prim)
    assert rec["models"]["mini"]["rule"] == "base_anchor(k0=1)" and rec["models"]["mini_olmoe"]["rule"] == "router_sq"
    inter = A.interaction(prompts)
    assert inter[(inter["test"] == "omnibus") & (inter["level"] == "tight")]["call"].item() == "differs"


def test_block_bootstrap_se_iid_and_autocorrelated():
    rng = np.random.default_rng(1)
    # iid steps, block 1: the bootstrap se is the two-sample standard error of the means
    a, b = rng.normal(0.2, 0.05, (1500, 1)), rng.normal(0.1, 0.05, (1000, 1))
    ones_a, ones_b = np.ones_like(a), np.ones_like(b)
    diff, low, high, se = A.block_bootstrap_diff(a, ones_a, b, ones_b, block=1, n_boot=1500)
    assert diff == pytest.approx(a.mean() - b.mean())
    assert se == pytest.approx(np.sqrt(a.var(ddof=1) / 1500 + b.var(ddof=1) / 1000), rel=0.1)
    assert low < diff < high
    # AR(1) steps (rho 0.9): blocks of 32 find most of the long-run variance, one-step blocks do not
    def ar1(n):
        x = np.zeros(n)
        for i in range(1, n):
            x[i] = 0.9 * x[i - 1] + rng.normal(0, 0.01)
        return (0.5 + x)[:, None]
    x, y = ar1(4000), ar1(4000)
    true_se = np.sqrt(2 * (0.01 ** 2 / (1 - 0.9) ** 2) / 4000)  # long-run variance sigma^2 / (1 - rho)^2
    se_block = A.block_bootstrap_diff(x, np.ones_like(x), y, np.ones_like(y), block=32, n_boot=1500)[3]
    se_iid = A.block_bootstrap_diff(x, np.ones_like(x), y, np.ones_like(y), block=1, n_boot=500)[3]
    assert se_iid < 0.5 * true_se and 0.7 * true_se < se_block < 1.3 * true_se


@pytest.mark.slow  # the synthetic grid: 44 run folders written and read (~15 s)
def test_secondary_family_and_run_table(grid):
    sec = grid["calls"][grid["calls"]["family"] == "secondary"]
    assert len(sec) == 72 and set(sec["metric"]) == {"out_error", "energy_retained"}
    assert np.allclose(sec["p_holm"], multipletests(sec["p"], method="holm")[1])
    rs = sec[(sec["method"] == "router_sum")].set_index(["model", "budget", "metric"])["call"]
    assert (rs.xs("energy_retained", level="metric") == "lower").all()
    assert (rs.xs("out_error", level="metric") == "higher").all()
    t = grid["table"].set_index(["model", "method"])
    assert t.loc[("mini", "dense"), "weight_scale"] == pytest.approx(1.0)
    assert t.loc[("mini_olmoe", "dense"), "weight_scale"] == pytest.approx(11 / 16)
    assert t.loc[("mini", "dense"), "prompts"] == P


@pytest.mark.slow  # the synthetic grid: 44 run folders written and read (~15 s)
def test_records_round_trip_and_refusal(grid, tmp_path):
    root = grid["root"]
    p, s = A.read_records(root / "records" / "replication_mini")
    assert len(p) == P * (1 + 7 * 3) and set(s.columns) >= set(A.STEP_FIELDS)
    with pytest.raises(SystemExit, match="is missing"):
        A.read_records(tmp_path / "nothing")


@pytest.mark.slow
def test_committed_replication_calls_re_derive_from_the_committed_records():
    """results/replication_paired.csv's primary calls, again from results/records/replication_*.csv.gz."""
    root = A.ROOT
    committed = pd.read_csv(root / A.PAIRED)
    committed = committed[committed["family"] == "primary"].set_index(["model", "method", "budget"])
    prompts = {}
    for grid in A.GRIDS:
        p, _ = R.read(root / "results" / "records" / grid)
        prompts[str(p["model"].iloc[0])] = p
    derived = A.primary(prompts).set_index(["model", "method", "budget"])
    assert len(derived) == len(committed) == 36
    for key, r in committed.iterrows():
        d = derived.loc[key]
        assert (d["a_only"], d["b_only"], d["call"]) == (r["a_only"], r["b_only"], r["call"]), key
        assert d["p"] == pytest.approx(r["p"], rel=1e-9) and d["p_holm"] == pytest.approx(r["p_holm"], rel=1e-9)


def test_one_model_is_its_own_family():
    """replication_mini128 run alone (docs/preregistration.md): Holm over its 18, no interaction."""
    prompts = {"mini": _prompt_frames()["mini"]}
    prim = A.primary(prompts)
    assert len(prim) == 18 and np.allclose(prim["p_holm"], multipletests(prim["p"], method="holm")[1])
    assert A.interaction(prompts).empty
    calls = prim.assign(family="primary")
    assert "`base_anchor(k0=1)` on `mini` —" in A.recommendation_text(calls)
