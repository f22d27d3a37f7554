"""Issue 41's calibration-time diagnostic (base/run/diagnose.py) against a direct computation on a
tiny model: every rule's agreement is the prefix agreement of its own served tokens with dense's,
worked out here token by token; the paired comparison calls a rule that stays on dense's path
where another leaves it higher, and names it in worse_than."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from base.hf.budget import BudgetOptions, install_budget
from base.method.selectors import build_selector
from base.run.diagnose import Agreement, agreement, decode, held_out_prompts, prefix_agreement
from tests.helpers import loaded_tiny_qwen3, model_artifacts, torch_threads


model = pytest.fixture(scope="module")(loaded_tiny_qwen3)


def test_held_out_prompts_come_after_the_calibrations_tokens():
    ids = list(range(100))
    prompts = held_out_prompts(ids, skip=40, prompt_len=5, count=4)
    assert prompts == [list(range(40, 45)), list(range(55, 60)), list(range(70, 75)), list(range(85, 90))]
    assert held_out_prompts(ids, skip=98, prompt_len=5, count=4) == []


def test_prefix_agreement_by_hand():
    assert prefix_agreement([1, 2, 3, 4], [1, 2, 9, 4]) == 0.5
    assert prefix_agreement([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert prefix_agreement([5, 2, 3, 4], [1, 2, 3, 4]) == 0.0


def test_the_diagnostic_equals_a_direct_computation_on_a_tiny_model(model):
    arts = model_artifacts(model)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 200, (6,), generator=g).tolist() for _ in range(10)]

    def make(rule: str):
        return install_budget(model, "qwen3_moe", build_selector(rule, arts), BudgetOptions(budget=2, record_stats=False))

    with torch_threads(1):
        result = agreement(model, make, ["base", "router_sum"], prompts, gen_tokens=8, slots=4, budget=2)
        dense = decode(model, None, prompts, 8, 4)
        for rule in ("base", "router_sum"):
            b = make(rule)
            try:
                tokens = decode(model, b, prompts, 8, 4)
            finally:
                b.remove()
            by_hand = [next((i for i, (a, d) in enumerate(zip(t, r)) if a != d), 8) / 8 for t, r in zip(tokens, dense)]
            assert result.per_prompt[rule].tolist() == pytest.approx(by_hand)
    assert 0 <= result.mean["base"] <= 1 and result.budget == 2


def test_a_rule_that_stays_on_the_dense_path_is_called_higher():
    rng = np.random.default_rng(0)
    good = rng.uniform(0.8, 1.0, 60)
    bad = good - rng.uniform(0.1, 0.3, 60)
    same = good.copy()
    result = Agreement(12, {"base": bad, "router_sq": good, "twin": bad.copy(), "other": same})
    rows = {r["rule"]: r for r in result.compare("base")}
    assert rows["router_sq"]["call"] == "higher" and rows["twin"]["call"] == "inconclusive"
    assert result.worse_than("base") == ["router_sq", "other"]
    assert result.report("base")["mean_agreement"]["router_sq"] == pytest.approx(good.mean())


def test_the_calibration_grows_with_the_expert_count():
    from base.config import CalibConfig, calibration_tokens

    c = CalibConfig(files=["x"])
    assert [calibration_tokens(c, e, k) for e, k in ((32, 4), (32, 8), (64, 8), (128, 8))] == [8192, 8192, 8192, 16384]


@pytest.mark.parametrize("overrides, message", [
    (["method=router_sq", "method.shrink=0.5"], "method.shrink scales a predictor's norms: it needs base or base_anchor"),
    (["method=base", "method.shrink=1.5"], "method.shrink=1.5 is out of range"),
])
def test_a_bad_shrink_is_refused(compose, tmp_path, overrides, message):
    import run
    from base.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        run.build_config(compose(["model=tiny_qwen3", "task=smoke", *overrides]), tmp_path)
    assert run.build_config(compose(["model=tiny_qwen3", "task=smoke", "method=base", "method.shrink=auto"]),
                            tmp_path).method.shrink_value() == "auto"


def test_the_run_warns_when_another_rule_stays_closer_to_dense(compose, tmp_path, monkeypatch, capsys):
    """run_diagnostic on measured agreements (stubbed): a rule significantly closer to dense than the
    run's is named in a warning and the report; `auto` picks the alpha with the highest mean."""
    import run
    from base.run import diagnose

    cfg = run.build_config(compose(["model=tiny_qwen3", "task=smoke", "method=base", "budget=3",
                                    f"artifacts_dir={tmp_path}/a"]), tmp_path / "o")
    rng = np.random.default_rng(1)
    good = rng.uniform(0.7, 1.0, 64)

    def measured(cfg, model, tokenizer, layers, budget, specs, make_budgeter):
        labels = [diagnose.rule_label(*s) for s in specs]
        values = {lab: (good - 0.2 if lab == "base" else good) for lab in labels}
        if any("shrink" in lab for lab in labels):  # the alpha grid: 0.5 best
            values = {lab: good - abs(float(lab.split("=")[-1].rstrip(")")) - 0.5) for lab in labels}
        return {"per_prompt": {k: v.tolist() for k, v in values.items()}, "budget": budget}

    monkeypatch.setattr(diagnose, "_measure", measured)
    layers = [type("L", (), {"num_experts": 16, "top_k": 4, "router": type("R", (), {"weight": torch.zeros(4, 8)})()})()]
    monkeypatch.setattr(diagnose, "_cached", lambda cfg, layers, key, compute: compute())
    report = diagnose.run_diagnostic(cfg, None, None, layers, None)
    assert report["run_rule"] == "base" and "router_sq stays closer to dense than base" in report["warning"]
    assert "WARNING diagnostic" in capsys.readouterr().out
    alpha, _ = diagnose.resolve_shrink(cfg, None, None, layers, "base", None, 3, None)
    assert alpha == 0.5
