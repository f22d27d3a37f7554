"""The request-stream tables (analysis/stream.py, analysis/stream_order.py) on hand-made run folders:
the run order is read from the rows' order, and the order-adjusted speed-ups match a hand computation."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from analysis.stream import load
from analysis.stream_order import order_table


def _run(tmp_path, rows: list[dict]):
    folder = tmp_path / "run"
    folder.mkdir()
    pd.DataFrame(rows).to_csv(folder / "stream.csv", index=False)
    (folder / "report.json").write_text(json.dumps({"model": "m", "routing": "uniform"}))
    return tmp_path


def _row(variant, budget, seconds, prefill_s, tokens=1000, steps=100, tpot=20.0, step=5.0):
    return {"slots": 4, "variant": variant, "budget": budget, "admission": "fifo", "output_tokens": tokens,
            "seconds": seconds, "tokens_per_s": tokens / seconds, "prefill_s": prefill_s, "steps": steps,
            "tpot_ms_p50": tpot, "step_ms_median": step, "speedup_vs_dense": None}


def test_dense_prefill_set_to_the_others_mean(tmp_path):
    # dense ran first: 10 s of which 6 s prefill; the two others prefilled 3 and 5 s (mean 4)
    root = _run(tmp_path, [_row("dense", None, 10.0, 6.0), _row("base", 16, 6.0, 3.0), _row("base", 10, 7.0, 5.0)])
    t = order_table(load(root)).set_index(["variant", "budget"], drop=False)
    assert t["position"].tolist() == [1, 2, 3]
    # dense adjusted: 10 - 6 + 4 = 8 s -> 125 tok/s; base@16: 1000/6 -> (1000/6)/125
    assert t.loc[("base", 16.0), "speedup_prefill_adjusted"] == pytest.approx(8.0 / 6.0)
    assert t.loc[("base", 10.0), "speedup_prefill_adjusted"] == pytest.approx(8.0 / 7.0)
    # decode only: dense 1000/4 s, base@16 1000/3 s
    assert t.loc[("base", 16.0), "speedup_decode_only"] == pytest.approx(4.0 / 3.0)
    assert t.loc[("dense", None), "speedup_prefill_adjusted"] == 1.0
    assert t.loc[("base", 16.0), "stream_ms_per_step"] == pytest.approx(60.0)
    assert t.loc[("base", 16.0), "decode_ms_per_step"] == pytest.approx(30.0)
    assert t.loc[("base", 16.0), "tpot_over_step"] == pytest.approx(4.0)


def test_a_group_without_exactly_one_dense_row_is_refused(tmp_path):
    root = _run(tmp_path, [_row("base", 16, 6.0, 3.0)])
    with pytest.raises(SystemExit, match="0 dense rows"):
        order_table(load(root))
