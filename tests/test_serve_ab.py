"""analysis/serve_ab.py: two scheduler settings' interleaved serve runs, compared stream by stream."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from scipy.stats import mannwhitneyu

from analysis import serve_ab


def _run(root: Path, name: str, tok_s: list[float], prefill_s: float, device: str = "cuda:0", model: str = "m",
         report: bool = True) -> Path:
    d = root / name
    d.mkdir(parents=True)
    rows = [{"model": model, "variant": v, "method": v, "budget": b, "rate": None, "repeat": r,
             "output_throughput": t * (2 if v == "base" else 1), "prefill_s": prefill_s, "ttft_ms_p50": 100.0,
             "step_ms_median": 5.0 if v == "base" else 10.0}
            for r, t in enumerate(tok_s) for v, b in (("dense", None), ("base", 16))]
    pd.DataFrame(rows).to_csv(d / "serve.csv", index=False)
    if report:
        (d / "report.json").write_text(f'{{"stage": "throughput", "model": "{model}", "device": "{device}"}}')
    return d


def test_the_ab_takes_medians_over_every_stream_of_a_label_and_tests_tokens_per_second(tmp_path):
    runs = [_run(tmp_path, "1_old", [100, 101], 0.9), _run(tmp_path, "2_new", [110, 111], 0.8),
            _run(tmp_path, "3_old", [102, 103], 0.9), _run(tmp_path, "4_new", [112, 113], 0.8)]
    df = serve_ab.load(runs)
    assert serve_ab.order_of(df) == "a b a b"
    t = serve_ab.compare(df).set_index("variant")
    # dense: old streams 100..103 (median 101.5), new 110..113 (median 111.5)
    assert t.loc["dense", "old_tok_s"] == 101.5 and t.loc["dense", "new_tok_s"] == 111.5
    assert t.loc["dense", "old_tok_s_min"] == 100 and t.loc["dense", "new_tok_s_max"] == 113
    assert t.loc["base", "new_over_old_tok_s"] == pytest.approx(223 / 203 - 1)
    assert t.loc["dense", "new_over_old_prefill_s"] == pytest.approx(0.8 / 0.9 - 1)
    p = mannwhitneyu([110, 111, 112, 113], [100, 101, 102, 103], method="exact").pvalue
    assert t.loc["dense", "p_tok_s"] == pytest.approx(p)
    assert t.loc["dense", "p_tok_s_holm"] == pytest.approx(min(1.0, 2 * p))  # Holm over the two cells, equal p
    # 4 streams against 4 cannot reach p < 0.05 after Holm over two cells (2 x 0.0286): not called
    assert set(t["call_tok_s"]) == {"inconclusive"}
    assert set(t["engine"]) == {"t1-cuda"}


def test_the_ab_calls_a_difference_only_where_the_corrected_test_passes(tmp_path):
    runs = [_run(tmp_path, f"{i}_{lab}", [base + i + k for k in range(3)], 1.0)
            for i, (lab, base) in enumerate([("a", 100), ("b", 200)] * 2, start=1)]
    t = serve_ab.compare(serve_ab.load(runs)).set_index("variant")
    assert (t["p_tok_s_holm"] < 0.05).all() and set(t["call_tok_s"]) == {"b higher"}


@pytest.mark.parametrize("case, message", [
    ("three labels", "exactly two labels"),
    ("unnamed", "named <i>_<label>"),
    ("same place", "share one place"),
    ("unfinished", "not a finished run"),
    ("two models", "different models"),
    ("two engines", "engine"),
])
def test_the_ab_refuses_runs_it_cannot_compare(tmp_path, case, message, capsys):
    runs = [_run(tmp_path, "1_a", [100], 1.0), _run(tmp_path, "2_b", [110], 1.0)]
    if case == "three labels":
        runs.append(_run(tmp_path, "3_c", [120], 1.0))
    elif case == "unnamed":
        runs.append(_run(tmp_path, "extra", [120], 1.0))
    elif case == "same place":
        runs.append(_run(tmp_path, "2_a", [120], 1.0))
    elif case == "unfinished":
        runs.append(_run(tmp_path, "3_a", [120], 1.0, report=False))
    elif case == "two models":
        runs.append(_run(tmp_path, "3_a", [120], 1.0, model="other"))
    elif case == "two engines":
        runs.append(_run(tmp_path, "3_a", [120], 1.0, device="cpu"))
    with pytest.raises(SystemExit) as e:
        serve_ab.main([*map(str, runs), "--out", str(tmp_path / "ab")])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "ab.csv").exists()


def test_the_ab_writes_its_table_with_the_order_and_engine(tmp_path):
    runs = [_run(tmp_path, "1_default", [100, 100], 0.9), _run(tmp_path, "2_finer", [110, 110], 0.8)]
    serve_ab.main([*map(str, runs), "--out", str(tmp_path / "out" / "ab")])
    text = (tmp_path / "out" / "ab.md").read_text()
    assert "order a b (a: `default`, b: `finer`)" in text and "`t1-cuda`" in text
    assert "| dense | - | burst | tok_s | 100 [100, 100] | 110 [110, 110] | +10.0 % | 2 / 2 |" in text
    assert pd.read_csv(tmp_path / "out" / "ab.csv").columns[-1] == "engine"
