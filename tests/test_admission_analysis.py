"""analysis/admission.py on hand-made run folders: FIFO and union runs paired by method, budget and
seed; the union difference per seed, and accuracy over prompts with a prompt counted once however
many seeds score it (issue 20: (seed, prompt) pairs are not independent units)."""
from __future__ import annotations

import json

import pandas as pd

from analysis.admission import compare, runs


def _run(root, name, admission, seed, union, correct):
    d = root / name
    d.mkdir()
    (d / "report.json").write_text(json.dumps({
        "stage": "evaluate", "method": "base", "budget": 8, "eval": {"batch_seed": seed, "admission": admission},
        "summary": {"union_mean": union, "kept_mean": 8.0, "occupancy_mean": 14.0, "accuracy": sum(correct) / 4}}))
    rows = [{"task": "t", "doc_id": i, "prompt_hash": str(i), "correct": float(c)} for i, c in enumerate(correct)]
    (d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_union_runs_pair_with_fifo_runs_of_the_same_seed(tmp_path):
    _run(tmp_path, "f0", "fifo", 0, 21.0, [1, 1, 0, 0])
    _run(tmp_path, "u0", "union", 0, 20.0, [1, 0, 1, 1])
    _run(tmp_path, "f1", "fifo", 1, 22.0, [1, 1, 1, 0])
    _run(tmp_path, "u1", "union", 1, 21.5, [1, 1, 1, 1])
    row = compare(runs(tmp_path)).iloc[0]
    assert row["seeds"] == 2 and row["union_mean_diff_by_seed"] == "-1.000 -0.500"
    # per prompt over the two seeds, union - fifo: doc0 0, doc1 -0.5, doc2 +0.5, doc3 +1
    assert row["prompts"] == 4 and row["accuracy_diff"] == 0.25
    assert "permutation" in row["test"] and row["call"] == "inconclusive"  # four prompts decide nothing
    assert pd.isna(row["budget"]) is False and row["accuracy_union"] == (0.75 + 1.0) / 2


def test_one_seed_uses_the_exact_test_on_prompts(tmp_path):
    _run(tmp_path, "f0", "fifo", 0, 21.0, [0, 0, 0, 0, 0, 1])
    _run(tmp_path, "u0", "union", 0, 20.0, [1, 1, 1, 1, 1, 1])
    row = compare(runs(tmp_path)).iloc[0]
    assert row["prompts"] == 6 and row["test"].startswith("exact McNemar")
    assert row["p"] == 0.0625  # 5 discordant, all one way: 2 * (1/2)^5
