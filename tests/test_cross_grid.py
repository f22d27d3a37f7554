"""analysis/cross_grid.py: the cross-grid correction over every committed comparison table (issue 27),
on a small results/ folder: q against Benjamini-Hochberg by hand, the headline family's Holm,
exclusions, the exploratory label, and a stale table reported."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import cross_grid as F
from analysis import stats as S
from analysis.ablation import main as ablation_main
from tests.outputs_fixture import fidelity_run
from tests.test_stats import _bh_by_hand


def _paired(rows) -> pd.DataFrame:
    return pd.DataFrame([{"method": m, "budget": b, "metric": k, "unit": "prompts (1000)", "diff": d, "low": d - 0.01,
                          "high": d + 0.01, "p": p, "p_tost": pt, "margin": S.MARGINS[k], "se": 0.005, "n": 1000,
                          "test": "t", "a_only": np.nan, "b_only": np.nan} for m, b, k, d, p, pt in rows])


@pytest.fixture()
def results(tmp_path, monkeypatch):
    """Two grids' paired tables and a batching table (with its null-by-construction dense row)."""
    _paired([("r1", 6, "accuracy", 0.03, 1e-4, 0.9), ("r2", 6, "accuracy", 0.02, 0.004, 0.9),
             ("r1", 6, "kl", -0.01, 0.008, 0.5), ("r1", 6, "dll", 0.01, 1e-9, 0.5),
             ("r2", 6, "kl", 0.0, 0.9, 1e-6)]).to_csv(tmp_path / "g1_paired.csv", index=False)
    _paired([("r1", 8, "accuracy", -0.05, 1e-8, 0.9), ("r2", 8, "accuracy", 0.01, 0.3, 0.9)]).to_csv(
        tmp_path / "g2_paired.csv", index=False)
    shift = _paired([("base", 8, "accuracy", -0.03, 0.01, 0.9), ("dense", None, "accuracy", 0.0, 1.0, 1e-9)])
    shift.assign(static=0.9, continuous=0.87).to_csv(tmp_path / "g2_batching.csv", index=False)
    (tmp_path / "notes.csv").write_text("a,b\n1,2\n")  # not a comparison table: left alone
    monkeypatch.setattr(F, "HEADLINE", {"g2_paired": ("accuracy",), "g2_batching": ("accuracy",)})
    return tmp_path


def test_q_is_benjamini_hochberg_over_every_table_and_the_headline_family_is_holm(results):
    tables, long = F.apply(results)
    assert set(tables) == {"g1_paired", "g2_paired", "g2_batching"}
    fam = long[(long["excluded"] == "") & long["p"].notna()]
    assert len(fam) == 4 + 2 + 1  # dll and the dense row left out
    assert np.allclose(fam["q"], _bh_by_hand(fam["p"].to_numpy()))
    head = fam[fam["table"].isin(["g2_paired", "g2_batching"])]
    assert np.allclose(head["p_headline"], S.holm(head["p"].to_numpy()))
    assert fam.loc[fam["table"] == "g1_paired", "p_headline"].isna().all()
    g1 = tables["g1_paired"].set_index(["method", "metric"])
    assert g1.loc[("r1", "dll"), "call"] == S.EXCLUDED and np.isnan(g1.loc[("r1", "dll"), "q"])
    assert g1.loc[("r2", "kl"), "call"] == "tie" and g1.loc[("r2", "kl"), "q_tost"] < S.ALPHA
    assert tables["g2_batching"].set_index("method").loc["dense", "call"] == S.EXCLUDED


@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_a_call_that_fails_the_cross_grid_correction_is_exploratory(results):
    tables, _ = F.apply(results)
    g1 = tables["g1_paired"].set_index(["method", "metric"])
    # r2's accuracy p = 0.004 passes Holm over g1's family of four (0.012) and BH over all seven
    assert g1.loc[("r2", "accuracy"), "call"] == "higher" and g1.loc[("r2", "accuracy"), "scope"] == "confirmed"
    shift = tables["g2_batching"].set_index("method").loc["base"]
    # p = 0.01: its own family of one, BH over the seven and Holm over the three headline rows all pass
    assert shift["call"] == "lower" and shift["scope"] == "confirmed"
    # p = 0.03 still passes its grid, but Holm over the headline family (1e-8, 0.03, 0.3) gives 0.06
    t = pd.read_csv(results / "g2_batching.csv")
    t.loc[t["method"] == "base", "p"] = 0.03
    t.to_csv(results / "g2_batching.csv", index=False)
    tables, long = F.apply(results)
    row = long[long["table"] == "g2_batching"].set_index("method").loc["base"]
    assert row["call"] == "lower" and row["p_headline"] == pytest.approx(0.06) and row["scope"] == "exploratory"
    assert tables["g2_paired"].set_index("method").loc["r2", "scope"] == ""  # inconclusive: no scope


@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_written_tables_check_clean_and_a_stale_column_is_reported(tmp_path):
    outputs = tmp_path / "outputs" / "grid"
    rng = np.random.default_rng(1)
    base = (rng.random(80) < 0.8).astype(int)
    worse = base.copy()
    worse[np.flatnonzero(base)[:25]] = 0
    for method, correct in (("base", base), ("router_sum", worse)):
        fidelity_run(outputs, method, 6, 0, correct, rng.gamma(2.0, 0.05, 80), [0.9] * 20, [0.1] * 20)
    res = tmp_path / "results"
    ablation_main(str(outputs), str(res / "grid"))
    assert F.write(res) == ["grid_paired"] and F.check(res) == []
    md = (res / "grid.md").read_text()
    assert "Cross-grid" in md and "p_headline" in md and "| confirmed |" in md
    t = pd.read_csv(res / "grid_paired.csv")
    t.loc[0, "q"] = 0.5
    t.to_csv(res / "grid_paired.csv", index=False)
    assert F.check(res) == ["grid_paired: q out of date in 1 row(s): run `python -m analysis.cross_grid`"]
    assert (res / "cross_grid.md").read_text().count("grid_paired") == 1


def test_a_transcripts_comparisons_are_called_on_holm_over_that_transcript(tmp_path, monkeypatch):
    """An `analysis.paired` transcript is one grid: its calls rest on Holm over its comparisons, as
    every table's do. 10 vs 2 discordant prompts (p = 0.039) is higher alone; beside a comparison
    with a larger p, Holm doubles it (0.077) and the call is inconclusive."""
    def block(a, b, a_only, b_only, diff):
        return (f"```\n$ python -m analysis.paired outputs/x/{a} outputs/x/{b}\n         n: 1000\n      diff: {diff}\n"
                f"    a_only: {a_only}\n    b_only: {b_only}\n```\n")

    (tmp_path / "one.md").write_text(block("A", "B", 10, 2, 0.008))
    (tmp_path / "two.md").write_text(block("A", "B", 10, 2, 0.008) + block("A", "C", 5, 5, 0.0))
    monkeypatch.setattr(F, "MD_PAIRED", ("one.md", "two.md"))
    rows = F.md_rows(tmp_path).set_index(["table", "method"])
    assert 0.025 < S.mcnemar_exact(10, 2) < 0.05
    assert rows.loc[("one.md", "A vs B"), "call"] == "higher"
    assert rows.loc[("two.md", "A vs B"), "call"] == "inconclusive"
    assert rows.loc[("two.md", "A vs C"), "call"] == "inconclusive"
