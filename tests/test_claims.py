"""The READMEs' numbers against the committed files they cite (analysis/claims.py, issue 20; one registry
per document since issue 44)."""
from __future__ import annotations

from pathlib import Path

import pytest

from analysis import claims

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", list(claims.DOCS))
def test_each_document_matches_the_committed_files(path):
    """Every registered document: its checked phrases and its generated blocks."""
    failures = claims.check_document(path)
    assert not failures, f"{path} disagrees with the committed files:\n" + "\n".join(failures)


@pytest.mark.slow
def test_the_comparison_tables_carry_current_cross_grid_columns():
    failures = claims.check_tables()
    assert not failures, "\n".join(failures)


def test_every_results_readme_is_registered():
    """A README under results/ that reads committed numbers (the index and each area's) is checked;
    the archive's is left out on purpose (nothing reads its grids), so are the per-folder READMEs
    written by hand beside their own tables."""
    assert {"README.md", "results/README.md", "results/quality/README.md", "results/speed/README.md"} <= set(claims.DOCS)
    assert all((ROOT / path).exists() for path in claims.DOCS)


def test_a_quality_phrase_whose_call_changed_is_reported():
    """results/quality/README.md's checked phrases (issue 27): a call the tables no longer make is a disagreement."""
    path = "results/quality/README.md"
    text = " ".join((ROOT / path).read_text().split())
    phrase = "only `router_sum` is shown worse than `base`"
    assert phrase in text
    failures = claims.check_phrases(text.replace(phrase, "no rule is shown worse than `base`"), claims.DOCS[path].checks,
                                    path)
    assert len(failures) == 1 and "lacks" in failures[0] and "Ablation" in failures[0]


def test_an_altered_number_is_reported():
    path = "results/speed/README.md"
    text = (ROOT / path).read_text()
    assert "in 8 of its 25 cells" in text
    # every occurrence: the kernel table's reading and the front page's old Kernels bullet say it alike
    failures = claims.check_document(path, text.replace("in 8 of its 25 cells", "in 9 of its 25 cells"))
    assert len(failures) == 1 and "[Kernels]" in failures[0] and "lacks" in failures[0]


def test_a_phrase_the_file_no_longer_gives_is_reported(monkeypatch):
    """The other direction: document and phrase agree, the recomputed text does not."""
    check = claims.KERNEL_BANDWIDTH
    stale = claims.Check(check.name, check.source, check.phrase, lambda: check.render().replace("8 of its", "7 of its"))
    monkeypatch.setitem(claims.DOCS, "results/speed/README.md", claims.Document([stale], {}))
    failures = claims.check_document("results/speed/README.md")
    assert len(failures) == 1 and "gives" in failures[0] and "7 of its" in failures[0]


def test_generated_blocks_are_checked_and_written(monkeypatch, tmp_path):
    monkeypatch.setattr(claims, "ROOT", tmp_path)
    monkeypatch.setitem(claims.DOCS, "demo.md", claims.Document([], {"demo": lambda: "- generated line\n"}))
    readme = "intro\n<!-- claims:demo (generated) -->\n- stale line\n<!-- /claims:demo -->\nrest\n"
    assert any("block demo" in f for f in claims.check_document("demo.md", readme))
    written = "intro\n<!-- claims:demo (generated) -->\n- generated line\n<!-- /claims:demo -->\nrest\n"
    (tmp_path / "demo.md").write_text(readme)
    assert claims.write_document("demo.md") == ["demo"] and (tmp_path / "demo.md").read_text() == written
    assert claims.write_document("demo.md") == []  # already current: nothing rewritten
    assert claims.check_document("demo.md") == []
    assert any("no <!-- claims:demo" in f for f in claims.check_document("demo.md", "no markers\n"))


def _grid(tmp_path: Path) -> Path:
    """A committed grid as analysis/ablation.py writes it: <grid>.csv, _paired.csv, .md."""
    import pandas as pd

    grid = tmp_path / "ablation_demo"
    pd.DataFrame([{"method": "dense", "budget": None, "metric": "accuracy", "mean": 0.97}]).to_csv(
        grid.with_suffix(".csv"), index=False)
    rows = [("router_sum", 6, "accuracy", -0.05, "lower", 1e-6), ("oracle", 6, "accuracy", 0.001, "tie", 0.9),
            ("top1_union", 6, "accuracy", -0.004, "inconclusive", 0.4), ("router_sum", 6, "kl", 0.1, "higher", 1e-9),
            ("oracle", 6, "kl", -0.02, "lower", 1e-4)]
    pd.DataFrame([{"method": m, "budget": b, "metric": k, "diff": d, "low": d - 0.01, "high": d + 0.01, "p": p,
                   "call": c, "mdd": 0.03, "n": 1050} for m, b, k, d, c, p in rows]).to_csv(
        tmp_path / "ablation_demo_paired.csv", index=False)
    grid.with_suffix(".md").write_text("Made by ...\n\nModel mini, prompt pool: task pool_ablation, task.limit=150.\n")
    return grid


def test_a_reading_states_each_call_in_the_metrics_own_sense(tmp_path):
    from analysis.readings import grid_reading, headline, prompts_per_run

    text = grid_reading(_grid(tmp_path))
    acc = next(line for line in text.splitlines() if line.startswith("- **accuracy**"))
    kl = next(line for line in text.splitlines() if line.startswith("- **KL**"))
    assert "worse than base: router_sum at M=6 (-0.050" in acc and "tie: oracle at M=6" in acc
    assert "inconclusive: top1_union at M=6" in acc and "better than base" not in acc
    # lower KL is better: the oracle's "lower" reads as better, router_sum's "higher" as worse
    assert "better than base: oracle at M=6" in kl and "worse than base: router_sum at M=6" in kl
    assert "5 calls, Holm-corrected" in text and "Dense accuracy 0.970" in text
    head = headline([_grid(tmp_path)], "- intro:")
    assert head.startswith("- intro:\n  - `mini`") and prompts_per_run([_grid(tmp_path)]) == "1,050"
    # the headline counts the inconclusive calls instead of listing them
    assert "1 inconclusive" in head and "inconclusive: top1_union" not in head


def test_a_reading_marks_exploratory_calls_and_states_what_an_accuracy_tie_would_need(tmp_path):
    import pandas as pd

    from analysis.readings import grid_reading
    from analysis.stats import ALPHA, equivalence_n

    grid = _grid(tmp_path)
    p = pd.read_csv(tmp_path / "ablation_demo_paired.csv")
    p["scope"] = ["confirmed", "", "", "exploratory", "confirmed"]
    p["a_only"], p["b_only"] = [10, 5, 30, None, None], [60, 3, 40, None, None]
    p.to_csv(tmp_path / "ablation_demo_paired.csv", index=False)
    text = grid_reading(grid)
    kl = next(line for line in text.splitlines() if line.startswith("- **KL**"))
    assert "worse than base: router_sum at M=6 (+0.1000 [+0.0900, +0.1100], exploratory)" in kl
    assert "oracle at M=6 (-0.0200" in kl and "-0.0200 [-0.0300, -0.0100])" in kl  # confirmed: no mark
    assert "1 of the 4 calls fail the cross-grid correction" in text
    need = equivalence_n(70 / 1050, alpha=ALPHA / 5)  # the median of 70, 8 and 70 discordant of 1050 prompts
    assert f"would need about {need:,} prompts" in text and "(6.7 % of prompts)" in text


def test_the_front_pages_stay_front_pages():
    """Issue 44: README.md a front page of at most 200 lines, results/README.md an index of at most
    150; the history lives in the area READMEs."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
    assert len((ROOT / "results/README.md").read_text().splitlines()) <= 150
