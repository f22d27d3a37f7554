"""analysis/kernel_table.py on a small benchmark JSON: the expert table's cells and columns, the
selection table's extras, and the inputs it refuses."""
from __future__ import annotations

import json

import pytest

from analysis import kernel_table


def _bench(tmp_path):
    experts = [{"model": "qwen3_30b_a3b", "routing": "random", "T": T, "M": M, "union": 80, "base_triton_us": us,
                "base_triton_frac": frac, "grouped_mm_us": 3 * us}
               for T in (1, 16) for M, us, frac in (("8", 10.0, 0.5), ("16", 20.0, 0.6), ("32", 30.0, 0.7),
                                                    ("64", 40.0, 0.8), ("dense", 50.0 + T, 0.9))]
    select = [{"model": "olmoe", "T": 16, "plain_router_us": 20.04, "router_sum_extra_us": 8.0, "base_fused_extra_us": 9.0,
               "route_rsum_extra_us": -5.0, "route_base_extra_us": -4.96, "base_torch_extra_us": 110.0}]
    path = tmp_path / "NVIDIA_H200.json"
    path.write_text(json.dumps({"device": "NVIDIA_H200", "copy_GBps": 4259.4, "torch": "2.11", "triton": "3.6",
                                "transformers": "5.17", "experts": experts, "select": select}))
    return path


def test_the_tables_read_the_benchmark(tmp_path, capsys):
    kernel_table.main([str(_bench(tmp_path)), "--out", str(tmp_path / "t")])
    md = (tmp_path / "t.md").read_text()
    assert "copy bandwidth 4259 GB/s; NVIDIA_H200" in md and md == "Made by" + md.split("Made by", 1)[1]
    row16 = next(line for line in md.splitlines() if line.startswith("|  16 |"))
    assert "| 20.0 (60%) |" in row16 and "| 66.0 (90%) |" in row16  # M=16 and the dense union at 16 tokens
    assert "198" in row16 and "60" in row16  # grouped_mm: 3 x 66.0 dense, 3 x 20.0 at M=16
    olmoe = [c.strip() for c in next(line for line in md.splitlines() if "olmoe" in line).split("|")[1:-1]]
    assert olmoe == ["olmoe", "16", "20", "8", "9", "-5", "-5", "110"]  # rounded to 0.1 µs: 20.04, -4.96
    assert "NVIDIA_H200" in capsys.readouterr().out


@pytest.mark.parametrize("content, message", [(None, "no such file"), ("{", "not JSON"),
                                               ('{"device": "x"}', "no copy_GBps, experts, select")])
def test_a_file_that_is_not_a_benchmark_is_refused(tmp_path, capsys, content, message):
    path = tmp_path / "b.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as e:
        kernel_table.main([str(path), "--out", str(tmp_path / "t")])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "t.md").exists()
