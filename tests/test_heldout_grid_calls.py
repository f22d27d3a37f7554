"""experiments/heldout/grid_calls.py: the pre-registered families from fixture runs."""
from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from experiments.heldout import grid_calls as gc


def _run(root, model: str, method: str, budget, correct, mc: dict | None = None, agreement: dict | None = None,
         engine: str = "c3-packed-cpu") -> None:
    name = f"budget={budget},method={method}{','.join(f',{k}={v}' for k, v in (mc or {}).items())},model={model}"
    d = root / f"heldout_grid_{model}" / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"method": {"name": method, **(mc or {})},
                                                   "model": {"name": model, "family": "qwen3_moe"}}))
    report = {"model": model, "num_experts": 32, "top_k": 4, "method": method, "budget": budget, "summary": {"accuracy": float(np.mean(correct))},
              "provenance": {"fingerprint": engine}, "diagnostic": {"mean_agreement": agreement or {}}}
    (d / "report.json").write_text(json.dumps(report))
    (d / "samples.jsonl").write_text("".join(json.dumps({"task": "t", "doc_id": i, "prompt_hash": f"h{i}", "correct": int(c)})
                                             + "\n" for i, c in enumerate(correct)))


def _grid(tmp_path, base_wins: bool = True, dense_acc: float = 0.8):
    n = 200
    rng = np.random.default_rng(0)
    right = rng.random(n) < 0.8
    worse = right.copy()
    worse[:40] = False  # 40 prompts the weaker rule gets wrong that the stronger gets right
    _run(tmp_path, "m1", "dense", None, rng.random(n) < dense_acc)
    strong, weak = (right, worse) if base_wins else (worse, right)
    agree = {"base": 0.9, "router_sq": 0.8} if base_wins else {"base": 0.8, "router_sq": 0.9}
    _run(tmp_path, "m1", "base", 12, strong, agreement=agree)
    _run(tmp_path, "m1", "router_sq", 12, weak)
    _run(tmp_path, "m1", "base_anchor", 12, strong, mc={"k0": 1})
    _run(tmp_path, "m1", "base", 12, weak, mc={"shrink": "auto"})
    return tmp_path


def test_the_families_pair_each_rule_with_the_others_and_call_them_after_holm(tmp_path, capsys):
    root = _grid(tmp_path)
    gc.main([str(root), str(tmp_path / "out" / "grid")])
    cal = __import__("pandas").read_csv(tmp_path / "out" / "grid_calibrated.csv")
    # the calibrated rule against base, router_sq and base_anchor (the others were not run)
    assert sorted(cal["other"]) == ["base", "base_anchor(k0=1)", "router_sq"]
    assert cal.set_index("other").loc["base", "call"] == "lower"  # 40 prompts to 0
    assert cal.set_index("other").loc["router_sq", "call"] == "inconclusive"  # the same answers
    assert (cal["p_holm"] >= cal["p"]).all()
    out = capsys.readouterr().out
    assert "calibrated BASE: called lower in 2 comparisons" in out
    assert "base_anchor(k0=1): called lower in no comparison" in out
    assert "diagnostic: validated (1 of 1 called cells agree in sign)" in out
    assert "Partial" in out and "not run yet: olmoe64_s1" in out  # one fixture model of the seven


def test_a_diagnostic_whose_sign_disagrees_is_not_validated(tmp_path, capsys):
    root = _grid(tmp_path, base_wins=True)
    report = root / "heldout_grid_m1" / "budget=12,method=base,model=m1" / "report.json"
    r = json.loads(report.read_text())
    r["diagnostic"]["mean_agreement"] = {"base": 0.7, "router_sq": 0.9}
    report.write_text(json.dumps(r))
    gc.main([str(root), str(tmp_path / "out" / "grid")])
    assert "diagnostic: not validated (0 of 1 called cells agree in sign)" in capsys.readouterr().out


def test_a_model_below_the_dense_floor_is_left_out_and_engines_are_not_mixed(tmp_path, capsys):
    root = _grid(tmp_path, dense_acc=0.1)
    gc.main([str(root), str(tmp_path / "out" / "grid")])
    out = capsys.readouterr().out
    assert "left out (dense below 0.3): m1" in out and "calibrated BASE: no comparisons yet" in out
    _run(root, "m2", "dense", None, [1, 0, 1], engine="c2-packed-cpu")
    with pytest.raises(SystemExit) as e:
        gc.main([str(root), str(tmp_path / "out" / "grid")])
    assert e.value.code == 2 and "would mix rows of 2 decode engines" in capsys.readouterr().err


def test_the_diagnostic_decision_counts_the_called_cells_that_agree():
    import pandas as pd

    diag = pd.DataFrame({"call": ["higher", "higher", "lower", "inconclusive"],
                         "signs_agree": [np.True_, np.True_, np.False_, None]})
    assert gc.decisions(pd.DataFrame(), pd.DataFrame(), diag)[2] == "diagnostic: not validated (2 of 3 called cells agree in sign)"


def test_the_front_page_bullet_reads_the_calls_and_names_where_the_recommended_rule_loses(tmp_path, capsys):
    from analysis.heldout import recommendation_bullet

    assert "no committed calls yet" in recommendation_bullet(tmp_path)
    gc.main([str(_grid(tmp_path / "runs")), str(tmp_path / "results" / "heldout" / "grid")])
    text = recommendation_bullet(tmp_path)
    assert "1 model trained here (1 Qwen3-style (renormalised): 32 experts)" in text
    assert "stays the serving recommendation" in text
    assert "lower at m1 M=12 against `base`, m1 M=12 against `base_anchor(k0=1)`: it does not become the default" in text
    assert "`base` is above `router_sq` at 1 of 1 budgets (m1 M=12) and below at none" in text
    assert "diagnostic: validated" in text
    assert "**Partial**: not run yet: olmoe64_s1" in text  # the seven pre-registered models are listed as missing
    # the recommended rule losing is named where it loses
    gc.main([str(_grid(tmp_path / "runs2", base_wins=False)), str(tmp_path / "results" / "heldout" / "grid")])
    assert "it is lower at m1 M=12 against `router_sq`, m1 M=12 against `base(shrink=auto)`" in recommendation_bullet(tmp_path)
