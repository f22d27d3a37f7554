"""The README's headline numbers against the committed files they cite (analysis/claims.py, issue 20)."""
from __future__ import annotations

from pathlib import Path

from analysis import claims

ROOT = Path(__file__).resolve().parents[1]


def test_readme_numbers_match_the_committed_files():
    failures = claims.check((ROOT / "README.md").read_text())
    assert not failures, "README.md disagrees with the committed files:\n" + "\n".join(failures)


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
