"""Issue 42: "a kernel config that reaches kernels/configs/ without a GPU run of its tests is a
defect". Every GPU's tuned table (kernels/configs/<GPU>.json; default.json is no GPU's) needs a
committed GPU test log on that GPU with no failures (results/gpu_tests/, analysis/gpu_tests.py)
that ran it: by content (the log's `table <name> <sha256>` line, written since session 36: a table
a tuner installs in a device call is tested before it has a commit), or, for a log from before those
lines, at a commit that already held the table as committed now."""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from analysis.gpu_tests import read_log

ROOT = Path(__file__).resolve().parents[1]


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)


def untested_tables(repo: Path, logs: Path) -> list[str]:
    """The tuned tables of `repo` that no log under `logs` tested, each with why."""
    rows = [read_log(p) for p in sorted(logs.glob("*.log"))]
    missing = []
    for table in sorted((repo / "kernels/configs").glob("*.json")):
        if table.name == "default.json":
            continue
        digest = hashlib.sha256(table.read_bytes()).hexdigest()[:16]
        # kernels/tuned.py names a GPU's table after the device's name, spaces as _
        runs = [r for r in rows if r.gpu.replace(" ", "_") == table.stem and r.outcome == "no failures"]
        if any(r.tables.get(table.name) == digest for r in runs):
            continue
        rel = f"kernels/configs/{table.name}"
        as_committed = _git(repo, "diff", "--quiet", "HEAD", "--", rel).returncode == 0
        last = _git(repo, "log", "-1", "--format=%H", "--", rel).stdout.strip()
        if as_committed and last and any(
                not r.tables and _git(repo, "merge-base", "--is-ancestor", last, r.commit.split()[0]).returncode == 0
                for r in runs):
            continue
        missing.append(f"{rel} ({digest}): no GPU test log on {table.stem} with no failures ran it")
    return missing


def test_every_committed_tuned_table_had_a_gpu_run_of_its_tests():
    if _git(ROOT, "rev-parse", "--is-shallow-repository").stdout.strip() != "false":
        pytest.skip("needs the repository's history (a full git clone)")
    assert untested_tables(ROOT, ROOT / "results/gpu_tests") == []


def _log(folder: Path, name: str, gpu: str, commit: str, summary: str, tables: dict[str, str] | None = None):
    lines = [f"{gpu}, 580.159.04, 345 MHz, 2619 MHz, 36", "torch 2.11.0", f"commit {commit}"]
    lines += [f"table {k} {v}" for k, v in (tables or {}).items()]
    (folder / name).write_text("\n".join([*lines, f"== {summary} in 10.00s ==", "rc=0", ""]))


def test_a_table_changed_after_its_last_gpu_run_is_caught(tmp_path):
    """A log from before the table lines vouches for the table its commit held; a table changed since
    is untested until a log names its content; a run on another GPU or with failures never counts."""
    repo, logs = tmp_path / "repo", tmp_path / "logs"
    (repo / "kernels/configs").mkdir(parents=True)
    logs.mkdir()
    table = repo / "kernels/configs/Fake_GPU_80GB.json"
    for cmd in (["init", "-q"], ["config", "user.email", "t@t"], ["config", "user.name", "t"]):
        _git(repo, *cmd)
    table.write_text('{"select:E=128,T=16": {"num_warps": 4}}')
    (repo / "kernels/configs/default.json").write_text("{}")
    _git(repo, "add", "-A"), _git(repo, "commit", "-qm", "table")
    first = _git(repo, "rev-parse", "--short", "HEAD").stdout.strip()
    assert len(untested_tables(repo, logs)) == 1  # no log at all

    _log(logs, "a.log", "Fake GPU 80GB", first, "90 passed")
    assert untested_tables(repo, logs) == []

    table.write_text('{"select:E=128,T=16": {"num_warps": 8}}')  # re-tuned, not yet committed
    assert untested_tables(repo, logs) != []
    _git(repo, "commit", "-qam", "re-tuned")
    assert untested_tables(repo, logs) != []  # the old log's commit predates the change

    digest = hashlib.sha256(table.read_bytes()).hexdigest()[:16]
    _log(logs, "b.log", "Other GPU", first, "90 passed", {table.name: digest})
    _log(logs, "c.log", "Fake GPU 80GB", first, "1 failed, 89 passed", {table.name: digest})
    assert untested_tables(repo, logs) != []
    _log(logs, "d.log", "Fake GPU 80GB", first, "90 passed", {table.name: digest})  # tested before its commit
    assert untested_tables(repo, logs) == []
