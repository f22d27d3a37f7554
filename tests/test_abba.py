"""analysis/abba.py on synthetic commit_abba folders: the per-cell medians over rounds, the exact test
and its Holm correction, and the sides it refuses."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from analysis import abba


def side(root: Path, name: str, dense: list[float], base: list[float], finished: bool = True) -> Path:
    run = root / name / "qwen3_uniform_b16"
    run.mkdir(parents=True)
    rows = [{"batch_size": 16, "method": m, "budget": b, "variant": m, "mode": "graph",
             "ms_per_step": sorted(ms)[len(ms) // 2], "ms_runs": ";".join(map(str, ms))}
            for m, b, ms in (("dense", None, dense), ("base", 16, base))]
    pd.DataFrame(rows).to_csv(run / "throughput.csv", index=False)
    if finished:
        (run / "report.json").write_text(json.dumps({"model": "qwen3_30b", "gpu": "GPU_X"}))
    return root / name


def test_the_rounds_of_each_label_are_pooled_and_tested(tmp_path):
    """base: every b round below every a round (exact p = 2 / C(10, 5) = 0.0079 before Holm, x2 after);
    dense: the two sides' rounds interleave: inconclusive."""
    same = [10.0, 10.1, 10.2, 10.05, 10.15]
    sides = [side(tmp_path, "1_a", same[:3], [5.0, 5.1, 5.2]), side(tmp_path, "2_b", same[3:] + [10.3], [4.0, 4.1, 4.2]),
             side(tmp_path, "3_b", [10.25, 10.12], [4.3, 4.05]), side(tmp_path, "4_a", [10.22, 10.08], [5.3, 5.05])]
    t = abba.compare(abba.load(sides)).set_index("variant")
    assert t.loc["base", "a_rounds"] == 5 and t.loc["base", "b_rounds"] == 5
    assert t.loc["base", "a_ms"] == 5.1 and t.loc["base", "b_ms"] == 4.1
    assert t.loc["base", "p"] == pytest.approx(2 / 252)
    assert t.loc["base", "p_holm"] == pytest.approx(4 / 252)
    assert t.loc["base", "call"] == "b faster"
    assert t.loc["dense", "call"] == "inconclusive"


def test_a_label_with_one_run_or_a_killed_side_is_refused(tmp_path, capsys):
    a1, b2 = side(tmp_path, "1_a", [10.0], [5.0]), side(tmp_path, "2_b", [10.0], [4.0])
    with pytest.raises(SystemExit):
        abba.load([a1, b2])
    assert "at least two runs" in capsys.readouterr().err
    killed = side(tmp_path, "3_b", [10.0], [4.0], finished=False)
    with pytest.raises(SystemExit):
        abba.load([a1, b2, killed])
    assert "holds 0 finished throughput runs" in capsys.readouterr().err


def stopped_side(root: Path, name: str, cells: dict[tuple[str, int | None], list[float]]) -> Path:
    """A run stopped at its limit, as base/run/run_folder.py leaves it: no report.json, the cells it
    finished in its staging folder's throughput_rows.jsonl."""
    stage = root / name / "throughput" / ".qwen3_uniform_b16.partial-123"
    stage.mkdir(parents=True)
    (stage / "config.yaml").write_text("model:\n  name: qwen3_30b\n")
    (stage / "throughput_rows.jsonl").write_text("".join(
        json.dumps({"batch_size": 16, "method": m, "budget": b, "variant": m, "mode": "graph",
                    "ms_per_step": sorted(ms)[len(ms) // 2], "ms_runs": ";".join(map(str, ms))}) + "\n"
        for (m, b), ms in cells.items()))
    return root / name


def test_a_stopped_run_adds_the_cells_it_finished_and_a_one_sided_cell_is_not_tested(tmp_path, capsys):
    """1_a stopped after dense: its dense rounds count, base has a's rounds from 4_a only; 4_a stopped
    before finishing any cell would be refused; a cell one label never reached is `one side only`
    and outside the Holm family."""
    sides = [stopped_side(tmp_path, "1_a", {("dense", None): [10.0, 10.1, 10.2]}),
             side(tmp_path, "2_b", [9.0, 9.1], [4.0, 4.1]), side(tmp_path, "3_b", [9.2, 9.05], [4.2, 4.05]),
             side(tmp_path, "4_a", [10.05, 10.15], [5.0, 5.1])]
    df = abba.load(sides)
    t = abba.compare(df).set_index("variant")
    assert t.loc["dense", "a_rounds"] == 5 and t.loc["base", "a_rounds"] == 2
    assert t.loc["dense", "call"] == "b faster"
    assert "1_a" in abba.markdown(t.reset_index(), df)  # the caption names the stopped run
    only_b = [stopped_side(tmp_path / "x", "1_a", {("dense", None): [10.0, 10.1]}),
              side(tmp_path / "x", "2_b", [9.0], [4.0]), side(tmp_path / "x", "3_b", [9.1], [4.1]),
              stopped_side(tmp_path / "x", "4_a", {("dense", None): [10.2]})]
    t = abba.compare(abba.load(only_b)).set_index("variant")
    assert t.loc["base", "call"] == "one side only" and pd.isna(t.loc["base", "p_holm"])
    assert t.loc["dense", "p_holm"] == t.loc["dense", "p"]  # a family of one tested cell
    empty = tmp_path / "y" / "1_a" / "throughput" / ".r.partial-9"
    empty.mkdir(parents=True)
    (empty / "throughput_rows.jsonl").write_text("")
    with pytest.raises(SystemExit):
        abba.load([tmp_path / "y" / "1_a", side(tmp_path / "y", "2_b", [9.0], [4.0])])
    assert "no finished cell" in capsys.readouterr().err
