"""analysis/tradeoff.ipynb runs headless (nbclient) on a small outputs/ tree and draws its figures."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.outputs_fixture import make_outputs

NOTEBOOK = Path(__file__).resolve().parents[1] / "analysis" / "tradeoff.ipynb"


def test_notebook_is_stored_without_outputs():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


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
