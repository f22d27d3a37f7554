"""analysis/tradeoff.ipynb runs headless (nbclient, what `make install` installs) on a small
outputs/ tree and draws its figures, and calls a paired comparison as analysis/stats.py does: "tie"
only where the corrected equivalence test (TOST) with its stated margin passes, never because an
interval contains zero."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.outputs_fixture import make_outputs

NOTEBOOK = Path(__file__).resolve().parents[1] / "analysis" / "tradeoff.ipynb"


def _cells(kind: str) -> str:
    return "\n".join("".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == kind)


def test_notebook_says_how_to_run_it_with_what_make_install_installs():
    import tomllib

    dev = tomllib.loads((NOTEBOOK.parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert any(d.startswith("nbclient") for d in dev) and any(d.startswith("ipykernel") for d in dev)
    head = json.loads(NOTEBOOK.read_text())["cells"][0]
    assert ".venv/bin/jupyter execute analysis/tradeoff.ipynb" in "".join(head["source"])  # nbclient's command


def test_notebook_tie_is_the_equivalence_test_of_analysis_stats():
    """The notebook defines no call of its own: its calls come from tables.paired_accuracy
    (stats.grid_calls -> stats.call), and its text states stats.py's definitions."""
    from analysis import stats as S

    md, code = _cells("markdown"), _cells("code")
    assert "contains zero" not in md.replace("merely contains zero is not a tie", "")
    assert "excludes zero" not in md and "tie\" unless" not in md
    assert "TOST" in md and "stats.MARGINS" in md and "stats.TIE_METRICS" in md and "stats.call" in md
    assert "T.paired_accuracy(" in code and "S.MARGINS" in code and "S.TIE_METRICS" in code
    assert '"tie"' not in code and "'tie'" not in code  # no hand-made tie rule
    assert S.call(0.0, 0.5, 0.01) == "tie" and S.call(0.0, 0.5, 0.2) == "inconclusive"  # what the text says
    assert "accuracy" not in S.TIE_METRICS  # hence: an accuracy comparison is never a tie


def test_notebook_is_stored_without_outputs():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


@pytest.mark.slow
def test_notebook_executes_headless_on_a_fixture_tree(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("BASE_MOE_OUTPUTS", str(make_outputs(tmp_path / "outputs")))
    monkeypatch.setenv("BASE_MOE_RESULTS", str(tmp_path / "no_results"))  # outputs/ alone, as on a user's machine
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 7  # trade-off, kept, union, rules, reassign, R², heat map of the fixture sweep
    text = " ".join(o.get("data", {}).get("text/plain", "") + o.get("text", "") for o in outputs)
    assert "qs_fixture" in text and "base+drop" in text  # the loader's frames, keyed by sweep and variant
    assert "drawing your runs" in text  # outputs/ alone, never mixed with results/

    # the paired calls it shows are analysis/stats.py's: every interval here holds zero (the old
    # notebook's "tie"), and every call is inconclusive (accuracy: no tie without a passed TOST)
    from analysis import tables as T
    from analysis.load import load

    samples = load(tmp_path / "outputs", None).outputs.samples
    expected = T.paired_accuracy(samples, sorted(set(samples["variant"]) - {"base", "dense"}))
    assert len(expected) and ((expected["low"] < 0) & (expected["high"] > 0)).all()
    (shown,) = [o["data"]["text/plain"] for o in outputs if "p_tost_holm" in o.get("data", {}).get("text/plain", "")]
    assert shown.count("inconclusive") == (expected["call"] == "inconclusive").sum() == len(expected)
    assert " tie" not in shown
