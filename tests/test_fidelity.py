"""Fidelity metrics (eval.fidelity) and the batching seed (eval.seed), end to end on the tiny model
and the smoke task, in process as run.py runs them: dense is exact (error 0, energy 1, KL 0), a
budget loses something, KL is never negative, and eval.seed changes only which requests share a
decode batch."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

import run
from base.hf.families import find_moe_layers
from base.hf.moe_block import output_error
from base.method.policy import Decision, dense_decision
from base.method.routing import RoutedBatch
from base.run.pipeline import run as run_pipeline
from tests.helpers import tiny_qwen3

FAST = ["model=tiny_qwen3", "task=smoke", "logger=none", "eval.batching=static",  # the teacher-forced pass
        "diagnose.enabled=false"]  # tests/test_diagnose.py tests the diagnostic


def _evaluate(compose, tmp_path, *overrides: str) -> tuple[dict, object]:
    out = tmp_path / "_".join(o.replace("=", "-").replace("/", "") for o in overrides)
    cfg = compose([*FAST, f"artifacts_dir={tmp_path}/artifacts", *overrides])
    report = run_pipeline(run.build_config(cfg, out, ",".join(overrides)), OmegaConf.to_yaml(cfg, resolve=True))
    return report, out


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_dense_is_exact_and_a_budget_loses_something(compose, tmp_path):
    dense, dense_dir = _evaluate(compose, tmp_path, "method=dense", "eval.fidelity=true", "batch_size=4")
    s = dense["summary"]
    assert s["kl"] == 0.0 and s["dll"] == 0.0 and s["top1_agree"] == 1.0 and s["fidelity_tokens"] > 0
    assert s["out_error"] == 0.0 and s["energy_retained"] == pytest.approx(1.0, abs=1e-6)
    # the teacher-forced dense continuation is the evaluation's own: the same decode steps per row
    assert s["fidelity_tokens"] == sum(dense["eval"]["decode_steps_by_task"].values())
    steps = pd.read_csv(dense_dir / "selection_steps.csv")
    assert (steps["out_err"] == 0).all() and (steps["out_dense"] > 0).all()  # per layer and step
    fid = pd.read_csv(dense_dir / "fidelity_steps.csv")
    assert set(fid["decode_batch"]) == {0, 1} and (fid["kl_sum"] == 0).all()
    req = pd.read_json(dense_dir / "samples.jsonl", lines=True)
    assert (req["fidelity_tokens"] == req["new_tokens"] - 1).all()  # dense scores its own decode steps, no other

    budget, budget_dir = _evaluate(compose, tmp_path, "method=router_sum", "budget=2", "eval.fidelity=true",
                                   "batch_size=4")
    b = budget["summary"]
    assert b["kl"] > 0 and b["out_error"] > 0 and b["energy_retained"] < 1.0 and b["top1_agree"] <= 1.0
    fid = pd.read_csv(budget_dir / "fidelity_steps.csv")
    assert (fid["kl_sum"] >= 0).all() and (fid["tokens"] <= 4).all()
    # the same decode batches: the dense continuation decides which rows are scored, so both runs
    # score the same tokens
    assert b["fidelity_tokens"] == s["fidelity_tokens"]
    # per request: its own sums, which add up to the steps' (a paired analysis resamples prompts)
    req = pd.read_json(budget_dir / "samples.jsonl", lines=True)
    for col in ("kl_sum", "dll_sum", "agree_sum"):
        assert req[col].sum() == pytest.approx(fid[col].sum(), rel=1e-9, abs=1e-12)
    assert req["kl_sum"].gt(0).any() and req["agree_sum"].le(req["fidelity_tokens"]).all()
    sel = pd.read_csv(budget_dir / "selection.csv")
    assert ((sel["out_error"] > 0) & (sel["energy_retained"] <= 1.0)).all()


@pytest.mark.slow
def test_without_fidelity_nothing_extra_is_written(compose, tmp_path):
    report, out = _evaluate(compose, tmp_path, "method=router_sum", "budget=2")
    assert "kl" not in report["summary"] and "out_error" not in report["summary"]
    assert not (out / "fidelity_steps.csv").exists()


def test_output_error_is_zero_for_the_routers_own_routing_and_counts_active_tokens_only():
    model = tiny_qwen3()
    layer = find_moe_layers(model)[0]
    g = torch.Generator().manual_seed(0)
    T, H, E, K = 6, model.config.hidden_size, layer.num_experts, layer.top_k
    z_TH = torch.randn(T, H, generator=g)
    probs_TE = torch.softmax(torch.randn(T, E, generator=g), -1)
    w_TK, idx_TK = probs_TE.topk(K, -1)
    active_T = torch.tensor([True, True, True, False, True, False])
    batch = RoutedBatch(z_TH, probs_TE, idx_TK, w_TK, active_T, 0)
    with torch.no_grad():
        err, dense = output_error(layer.experts, batch, dense_decision(batch))
        assert err == 0 and dense > 0
        # halve every weight: the output halves, so the error is exactly a quarter of the dense energy
        half = Decision(dense_decision(batch).keep_E, idx_TK, w_TK / 2)
        err, dense = output_error(layer.experts, batch, half)
        assert err.item() == pytest.approx(dense.item() / 4, rel=1e-5)
        # inactive tokens do not count: changing only their routing changes nothing
        moved_TK = torch.where(active_T[:, None], idx_TK, (idx_TK + 1) % E)
        err, dense = output_error(layer.experts, batch, Decision(dense_decision(batch).keep_E, moved_TK, w_TK))
        assert err <= 1e-12 * dense  # the experts may sum in another order: rounding only


@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_eval_seed_changes_the_batching_only(compose, tmp_path):
    runs = {}
    for seed in (0, 1):
        report, out = _evaluate(compose, tmp_path, "method=dense", "batch_size=4", f"eval.seed={seed}")
        samples = pd.read_json(out / "samples.jsonl", lines=True).sort_values("doc_id")
        runs[seed] = (report, samples)
        assert report["eval"]["batch_seed"] == seed and report["seed"] == 0
    (r0, s0), (r1, s1) = runs[0], runs[1]
    assert list(s0["prompt_hash"]) == list(s1["prompt_hash"])  # the same prompts ...
    assert list(s0["decode_batch"]) != list(s1["decode_batch"])  # ... in other decode batches
    assert r0["artifacts"] == r1["artifacts"]  # nothing else moves (dense: no artifacts either way)
    _, again = _evaluate(compose, tmp_path / "again", "method=dense", "batch_size=4", "eval.seed=1")
    same = pd.read_json(again / "samples.jsonl", lines=True).sort_values("doc_id")
    assert list(same["decode_batch"]) == list(s1["decode_batch"])
    assert json.loads((again / "report.json").read_text())["eval"]["batch_seed"] == 1


def test_the_cache_goes_in_under_the_keyword_the_model_takes():
    """transformers >= 5.17 (the supported range) renamed past_key_values to cache; a model's
    **kwargs would swallow the wrong name and every teacher-forced step would run without a cache."""
    from types import SimpleNamespace

    from torch import nn

    from base.eval.fidelity import _step

    class Old(nn.Module):  # transformers 5.17's keyword
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                    use_cache=None, **kwargs):
            assert not kwargs, f"unexpected keywords {sorted(kwargs)}"
            return SimpleNamespace(logits=torch.zeros(1, 1, 3), past_key_values=("grown", past_key_values))

    class New(nn.Module):  # the later one
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None,
                    **kwargs):
            assert not kwargs, f"unexpected keywords {sorted(kwargs)}"
            return SimpleNamespace(logits=torch.zeros(1, 1, 3), cache=("grown", cache))

    ids, mask = torch.ones(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.long)
    for model in (Old(), New()):
        _, cache = _step(model, ids, mask, "previous")
        assert cache == ("grown", "previous")
