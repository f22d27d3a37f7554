"""The README's headline numbers against the committed files they cite (analysis/claims.py, issue 20)."""
from __future__ import annotations

from pathlib import Path

from analysis import claims

ROOT = Path(__file__).resolve().parents[1]


def test_readme_numbers_match_the_committed_files():
    failures = claims.check((ROOT / "README.md").read_text())
    failures += claims.check_results((ROOT / "results/README.md").read_text())
    failures += claims.check_tables()
    assert not failures, "the READMEs disagree with the committed files:\n" + "\n".join(failures)


def test_a_results_phrase_whose_call_changed_is_reported():
    """results/README.md's checked phrases (issue 27): dropping an exploratory mark is a disagreement."""
    text = (ROOT / "results/README.md").read_text()
    phrase = "at M=6 (exploratory) on `mini`"
    assert phrase in " ".join(text.split())
    failures = claims.check_phrases(" ".join(text.split()).replace(phrase, "at M=6 on `mini`"), claims.RESULT_CHECKS,
                                    "results/README.md")
    assert len(failures) == 1 and "lacks" in failures[0] and "exploratory" in failures[0]


def test_an_altered_number_is_reported():
    readme = (ROOT / "README.md").read_text()
    assert "1,205 tokens/s" in readme
    failures = claims.check(readme.replace("1,205 tokens/s", "1,250 tokens/s", 1))
    assert len(failures) == 1 and "End to end on an H200" in failures[0] and "lacks" in failures[0]


def test_a_phrase_the_file_no_longer_gives_is_reported(monkeypatch):
    """The other direction: README and phrase agree, the recomputed text does not."""
    check = claims.CHECKS[0]
    monkeypatch.setattr(claims, "CHECKS", [claims.Check(check.name, check.source, check.phrase,
                                                        lambda: check.render().replace("2.27×", "2.30×"))])
    monkeypatch.setattr(claims, "BLOCKS", {})
    failures = claims.check((ROOT / "README.md").read_text())
    assert len(failures) == 1 and "gives" in failures[0] and "2.30×" in failures[0]


def test_generated_blocks_are_checked_and_written(monkeypatch):
    monkeypatch.setattr(claims, "CHECKS", [])
    monkeypatch.setattr(claims, "BLOCKS", {"demo": lambda: "- generated line\n"})
    readme = "intro\n<!-- claims:demo (generated) -->\n- stale line\n<!-- /claims:demo -->\nrest\n"
    assert any("block demo" in f for f in claims.check(readme))
    written = claims.write_blocks(readme)
    assert written == "intro\n<!-- claims:demo (generated) -->\n- generated line\n<!-- /claims:demo -->\nrest\n"
    assert claims.check(written) == []
    assert any("no <!-- claims:demo" in f for f in claims.check("no markers\n"))


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
