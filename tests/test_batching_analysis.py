"""analysis/batching.py on hand-made run folders: each point under continuous batching minus the
same point under static batching, over the same prompts, with the grid's Holm-corrected calls."""
from __future__ import annotations

import json

import pytest

from analysis.ablation import runs
from analysis.batching import shift_table


def _run(root, batching, method, budget, correct, hashes=None):
    d = root / batching / f"{method}-{budget}"
    d.mkdir(parents=True)
    (d / "report.json").write_text(json.dumps({
        "stage": "evaluate", "method": method, "budget": budget, "model": "mini",
        "eval": {"batch_seed": 0, "tasks": ["pool_quality"], "limit": 150, "batching": batching},
        "summary": {"accuracy": sum(correct) / len(correct)}}))
    hashes = hashes or [str(i) for i in range(len(correct))]
    rows = [{"task": "t", "doc_id": i, "prompt_hash": h, "correct": float(c)}
            for i, (c, h) in enumerate(zip(correct, hashes))]
    (d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_fall_under_continuous_batching_is_called_lower_and_dense_is_left_out_of_the_family(tmp_path):
    n = 400
    _run(tmp_path, "static", "base", 8, [1] * n)
    _run(tmp_path, "continuous", "base", 8, [0] * 40 + [1] * (n - 40))  # 40 prompts lost, none gained
    _run(tmp_path, "static", "dense", None, [1] * n)
    _run(tmp_path, "continuous", "dense", None, [1] * n)
    t = shift_table(runs(tmp_path / "static"), runs(tmp_path / "continuous")).set_index("method")
    assert t.loc["base", "call"] == "lower" and t.loc["base", "diff"] == pytest.approx(-0.1)
    assert (t.loc["base", "a_only"], t.loc["base", "b_only"]) == (0, 40)
    assert t.loc["dense", "call"] == "excluded" and t.loc["dense", "excluded"].startswith("null by construction")
    assert t.loc["base", "p_holm"] == t.loc["base", "p"]  # a family of one: dense does not dilute it


def test_the_folders_must_be_static_then_continuous(tmp_path):
    _run(tmp_path, "static", "base", 8, [1, 0])
    _run(tmp_path, "continuous", "base", 8, [1, 0])
    with pytest.raises(SystemExit, match="first folder must hold static runs"):
        shift_table(runs(tmp_path / "continuous"), runs(tmp_path / "static"))


def test_different_prompts_are_refused(tmp_path):
    _run(tmp_path, "static", "base", 8, [1, 0], hashes=["a", "b"])
    _run(tmp_path, "continuous", "base", 8, [1, 0], hashes=["a", "c"])
    with pytest.raises(SystemExit, match="different prompts"):
        shift_table(runs(tmp_path / "static"), runs(tmp_path / "continuous"))
