"""analysis/attention_roofline.py: the best matching launch per shape and its bytes."""
from __future__ import annotations

import pandas as pd
import pytest

from analysis.attention_roofline import roofline


def rows(model="qwen3_30b_a3b"):
    # (BLOCK_N, us, matches): the fastest candidate differs from the reference, so the next one is the best
    return pd.DataFrame([{"model": model, "B": 16, "filled": 640, "D": 128, "BLOCK_N": bn, "num_warps": 4,
                          "target_programs": 64, "us": us, "matches_reference": ok}
                         for bn, us, ok in ((32, 5.0, False), (64, 10.0, True), (128, 20.0, True))])


def test_the_best_matching_launch_and_its_bandwidth():
    r = roofline(rows(), copy_gbps=3000.0).iloc[0]
    assert r["BLOCK_N"] == 64 and r["us"] == 10.0
    # 16 rows x 4 KV heads x 640 slots x (128 + 128) x 2 bytes = 20.97 MB in 10 us
    assert r["MB"] == pytest.approx(16 * 4 * 640 * 256 * 2 / 1e6)
    assert r["GB_s"] == pytest.approx(r["MB"] / 10.0 * 1e3)
    assert r["of_copy"] == pytest.approx(r["GB_s"] / 3000.0)


def test_a_model_without_a_known_head_count_is_refused(capsys):
    with pytest.raises(SystemExit):
        roofline(rows("mixtral"), copy_gbps=3000.0)
    assert "no KV head count for ['mixtral']" in capsys.readouterr().err
