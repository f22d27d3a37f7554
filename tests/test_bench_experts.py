"""tools/bench_experts.py's harness on the CPU (the interpreter): its A/B table, its guard against a
wrong kernel, and its refusals."""
from __future__ import annotations

import sys
import types

import pandas as pd
import pytest


@pytest.mark.slow
def test_the_ab_writes_every_round_of_both_implementations(tmp_path, monkeypatch):
    import kernels.experts
    import tools.bench_experts as bench

    monkeypatch.setattr(sys, "argv", ["bench_experts", "--smoke", "--rounds", "2", "--reps", "1", "--ts", "3",
                                      "--budgets", "2,dense", "--baseline", kernels.experts.__file__,
                                      "--csv", str(tmp_path / "ab.csv")])
    bench.main()
    t = pd.read_csv(tmp_path / "ab.csv")
    assert set(t["impl"]) == {"current", "baseline"} and set(t["M"].astype(str)) == {"2", "dense"}
    assert len(t) == 2 * 2 * 2  # rounds x budgets x implementations, one smoke shape and token count
    kept = t.groupby("M")["kept"].first()
    assert kept["2"] == 2 and kept["dense"] > 2  # budget 2 keeps two experts; dense keeps the union


@pytest.mark.slow
def test_an_implementation_that_disagrees_is_refused_before_any_timing(monkeypatch, capsys):
    import kernels.experts
    import tools.bench_experts as bench

    wrong = types.ModuleType("_experts_wrong")
    wrong.fused_experts = lambda x_TH, *args, **kwargs: kernels.experts.fused_experts(x_TH, *args, **kwargs) + 1
    monkeypatch.setattr(bench, "load_module", lambda path, name: wrong)
    monkeypatch.setattr(sys, "argv", ["bench_experts", "--smoke", "--rounds", "2", "--ts", "2", "--budgets", "dense",
                                      "--baseline", kernels.experts.__file__])
    monkeypatch.setattr(bench, "interleaved_rounds", lambda *a, **k: pytest.fail("timed a wrong implementation"))
    with pytest.raises(SystemExit, match="baseline and current disagree"):
        bench.main()


@pytest.mark.parametrize("argv,message", [
    (["--rounds", "3"], "--rounds must be >= 5"),
    (["--models", "qwen3"], "--models takes qwen3_30b_a3b"),
    (["--budgets", "16,all"], "--budgets integers or `dense`"),
    (["--baseline", "/nonexistent/experts.py"], "no such file"),
])
def test_bad_arguments_are_refused_before_anything_runs(monkeypatch, capsys, argv, message):
    import tools.bench_experts as bench

    monkeypatch.setattr(sys, "argv", ["bench_experts", *argv])
    monkeypatch.setattr(bench, "cases", lambda *a, **k: pytest.fail("ran past a bad argument"))
    with pytest.raises(SystemExit):
        bench.main()
    assert message in capsys.readouterr().err


def test_the_rounds_rotate_which_implementation_runs_first(monkeypatch):
    """tools/timing.interleaved_rounds: every case and implementation once a round, the
    implementations' order rotated each round, one row each with the case's labels."""
    import tools.timing as timing

    timed = []
    monkeypatch.setattr(timing, "time_graph", lambda calls, reps, dev: (timed.append(calls[0]) or 1.5, "graph"))
    work = [({"T": 1}, {"a": "a1", "b": "b1"}), ({"T": 16}, {"a": "a16", "b": "b16"})]
    rows = timing.interleaved_rounds(work, ["a", "b"], 3, 1, None)
    assert timed == ["a1", "b1", "a16", "b16", "b1", "a1", "b16", "a16", "a1", "b1", "a16", "b16"]
    assert [(r["T"], r["impl"], r["round"]) for r in rows[:4]] == [(1, "a", 0), (1, "b", 0), (16, "a", 0), (16, "b", 0)]
    assert {r["us"] for r in rows} == {1.5} and len(rows) == 12
