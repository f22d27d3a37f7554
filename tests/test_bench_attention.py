"""tools/bench_attention.py's harness on the CPU (the interpreter): its A/B table and its guard
against a fast wrong launch."""
from __future__ import annotations

import sys
import types

import pandas as pd
import pytest
import torch


@pytest.mark.slow
def test_a_candidate_that_differs_from_the_reference_is_never_the_best():
    """The search times every candidate; one whose output is wrong (here instant, so fastest) is not
    chosen."""
    from kernels import attention
    from tools.bench_attention import SMOKE, search, shapes

    def decode_attention(*inputs, launch):
        if launch.block_n == 16:
            return torch.zeros_like(inputs[0])
        return attention.decode_attention(*inputs, launch=launch)

    wrong_fast = types.SimpleNamespace(AttentionLaunch=attention.AttentionLaunch, decode_attention=decode_attention)
    _, inputs = next(shapes(SMOKE, torch.device("cpu"), torch.float32))
    ref = attention.decode_attention_reference(*inputs[:4], int(inputs[4]), inputs[5]).float()
    launch, rows = search(wrong_fast, inputs, ref, SMOKE, reps=1, dev=torch.device("cpu"))
    assert launch.block_n == 32
    assert {r["BLOCK_N"] for r in rows if not r["matches_reference"]} == {16}


@pytest.mark.slow
def test_the_ab_writes_every_round_of_both_implementations(tmp_path, monkeypatch):
    import kernels.attention
    import tools.bench_attention as bench

    monkeypatch.setattr(sys, "argv", ["bench_attention", "--smoke", "--rounds", "2", "--reps", "1",
                                      "--baseline", kernels.attention.__file__, "--csv", str(tmp_path / "ab.csv")])
    bench.main()
    t = pd.read_csv(tmp_path / "ab.csv")
    assert set(t["impl"]) == {"current", "baseline"} and set(t["launch"]) == {"best", "default"}
    assert len(t) == 2 * 2 * 2  # rounds x launches x implementations, one smoke shape
    search = pd.read_csv(tmp_path / "ab_search.csv")
    assert set(search["impl"]) == {"current", "baseline"} and (search["kernel"] == "attention").all()


def test_fewer_than_five_rounds_are_refused(monkeypatch, capsys):
    import tools.bench_attention as bench

    monkeypatch.setattr(sys, "argv", ["bench_attention", "--rounds", "3"])
    with pytest.raises(SystemExit):
        bench.main()
    assert "--rounds must be >= 5" in capsys.readouterr().err
