"""The README's Quick start line is what `make demo` prints: the demo's steps run here (into a
temporary outputs folder) and the line is regenerated from their own output (issue 44: the Quick
start promised numbers the demo no longer printed, and no check caught it)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.headline import demo_line

ROOT = Path(__file__).resolve().parents[1]


def readme_demo_block() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- claims:demo\b[^\n]*-->\n(.*?)<!-- /claims:demo -->", text, re.DOTALL)
    assert m, "README.md has no <!-- claims:demo --> block"
    return m.group(1)


@pytest.mark.slow
def test_the_quick_start_line_is_what_the_demo_prints(tmp_path):
    env = {**os.environ, "DEMO_OUTPUTS": str(tmp_path), "PY": sys.executable, "OMP_NUM_THREADS": "2",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(["bash", "experiments/demo.sh", f"artifacts_dir={tmp_path}/artifacts"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = demo_line(tmp_path / "demo")
    assert f"Quick start line: {line.strip()}" in proc.stdout
    assert readme_demo_block() == line, ("README.md's Quick start line is not what the demo prints now; put this "
                                         f"line between its claims:demo markers:\n{line}")
