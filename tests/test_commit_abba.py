"""experiments/gpu/commit_abba.sh refuses a bad A/B before its first run spends device time: a label
that is not a commit (run.py would refuse it only at the b side's first run, after a's), both sides
one commit with the same tuned tables, an unknown model, an archive that does not unpack; one commit
whose tree b holds a table tuned in the call is an A/B of the tables."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def tree(tmp_path):
    for rel in ("experiments/gpu/commit_abba.sh", "experiments/gpu/env.sh", "experiments/gpu/checks.sh",
                "conf/model/qwen3_30b.yaml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    (tmp_path / ".abba").mkdir()
    (tmp_path / ".abba/a.tgz").write_bytes(b"not an archive")
    return tmp_path


@pytest.mark.parametrize("env,message", [
    ({"ABBA_A_COMMIT": "34120f8", "BASE_COMMIT": "7b82bb9+select"}, "'7b82bb9+select' is not a commit"),
    ({"ABBA_A_COMMIT": "main", "BASE_COMMIT": "7b82bb9"}, "'main' is not a commit"),
    ({"ABBA_A_COMMIT": "34120f8", "BASE_COMMIT": "7b82bb9", "ABBA_MODEL": "qwen3"}, "no model 'qwen3'"),
    ({"ABBA_A_COMMIT": "34120f8", "BASE_COMMIT": "7b82bb9"}, "a.tgz does not unpack"),
])
def test_a_bad_ab_is_refused_before_any_run(tree, env, message):
    out = tree / "out"
    res = subprocess.run(["bash", str(tree / "experiments/gpu/commit_abba.sh")], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "OUT": str(out), **env}, timeout=60, check=False)
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert "[abba" not in res.stdout  # no run started
    assert not (out / "abba.tgz").exists()


FAKE_RUN = """#!/bin/bash
# stands in for `python3 run.py ...`: says whether this tree's calibration artifacts were there
if [ -d outputs/artifacts ]; then echo "[throughput] batch 16 reused"; else
  mkdir -p outputs/artifacts/m && echo "[throughput] batch 16 computed"; fi
"""


def test_a_warm_machines_tree_a_keeps_its_artifacts_for_the_same_commit_only(tree, tmp_path):
    """The second call with the same tree-a commit finds the first call's calibration artifacts
    (its first a run skips calibrating); a call with another commit starts without them."""
    import tarfile

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_RUN)
    (bin_dir / "python3").chmod(0o755)
    src = tmp_path / "a_src"
    src.mkdir()
    (src / "run.py").write_text("")
    with tarfile.open(tree / ".abba/a.tgz", "w:gz") as tf:
        tf.add(src / "run.py", arcname="run.py")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "BASE_COMMIT": "7b82bb9",
           "ABBA_TREE_A": str(tmp_path / "tree_a"), "ABBA_RUNS": str(tmp_path / "runs")}

    def first_a_run(commit: str) -> str:
        res = subprocess.run(["bash", str(tree / "experiments/gpu/commit_abba.sh")], capture_output=True, text=True,
                             env={**env, "ABBA_A_COMMIT": commit}, timeout=60, check=False)
        assert res.returncode == 0, res.stderr
        return (tmp_path / "runs/1_a.log").read_text()

    assert "computed" in first_a_run("34120f8")
    assert "reused" in first_a_run("34120f8")
    assert "computed" in first_a_run("29bc72f")


def _fake_tree_a(tree, tmp_path, table: str) -> dict:
    """Tree a's archive (run.py and kernels/configs/GPU.json holding `table`), a stand-in python3, and
    the environment of a call whose tree b is commit 7b82bb9."""
    import tarfile

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_RUN)
    (bin_dir / "python3").chmod(0o755)
    src = tmp_path / "a_src"
    (src / "kernels/configs").mkdir(parents=True)
    (src / "run.py").write_text("")
    (src / "kernels/configs/GPU.json").write_text(table)
    with tarfile.open(tree / ".abba/a.tgz", "w:gz") as tf:
        tf.add(src / "run.py", arcname="run.py")
        tf.add(src / "kernels", arcname="kernels")
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "BASE_COMMIT": "7b82bb9",
            "ABBA_A_COMMIT": "7b82bb9", "ABBA_TREE_A": str(tmp_path / "tree_a"), "ABBA_RUNS": str(tmp_path / "runs")}


@pytest.mark.parametrize("tuned", [False, True])
def test_one_commit_on_both_sides_is_an_ab_of_the_tables_tuned_in_the_call(tree, tmp_path, tuned):
    """Tree b's kernels/configs as the commit's (tree a's): nothing to compare, refused before any run.
    A table this call's tuner changed in tree b: the four runs go ahead, the differing table named."""
    env = _fake_tree_a(tree, tmp_path, '{"select:E=128,T=16": {"num_warps": 8}}')
    (tree / "kernels/configs").mkdir(parents=True)
    (tree / "kernels/configs/GPU.json").write_text('{"select:E=128,T=16": {"num_warps": 4}}' if tuned else
                                                   '{"select:E=128,T=16": {"num_warps": 8}}')
    res = subprocess.run(["bash", str(tree / "experiments/gpu/commit_abba.sh")], capture_output=True, text=True,
                         env=env, timeout=60, check=False)
    if not tuned:
        assert res.returncode == 2 and "both sides are commit 7b82bb9 with the same kernels/configs" in res.stderr
        assert "run 1" not in res.stdout and not (tmp_path / "out/abba.tgz").exists()
        return
    assert res.returncode == 0, res.stderr
    assert "b's tuned tables differ from a's" in res.stdout and "GPU.json" in res.stdout
    assert sorted(p.name for p in (tmp_path / "runs").glob("*.log")) == ["1_a.log", "2_b.log", "3_b.log", "4_a.log"]


def test_a_missing_tree_b_archive_is_refused_before_any_run(tree):
    out = tree / "out"
    res = subprocess.run(["bash", str(tree / "experiments/gpu/commit_abba.sh")], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "OUT": str(out), "ABBA_A_COMMIT": "34120f8",
                              "ABBA_B_COMMIT": "afb361a"}, timeout=60, check=False)
    assert res.returncode == 2 and "ABBA_B_COMMIT=afb361a names tree b's archive, and .abba/b.tgz is missing" in res.stderr
    assert not out.exists()


WHERE_RUN = """#!/bin/bash
# stands in for `python3 run.py ...`: says which tree and commit it ran
echo "[throughput] batch 16 in $(cat TREE) as $BASE_COMMIT"
"""


def test_tree_b_from_an_archive_runs_that_commit_not_the_working_tree(tree, tmp_path):
    """ABBA_B_COMMIT with .abba/b.tgz: runs 2 and 3 in the unpacked tree b as that commit, 1 and 4 in
    tree a; the working tree (the call's own, which ran its GPU suite) runs nothing."""
    import tarfile

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(WHERE_RUN)
    (bin_dir / "python3").chmod(0o755)
    (tree / "TREE").write_text("the working tree")
    for side in ("a", "b"):
        src = tmp_path / f"{side}_src"
        src.mkdir()
        (src / "TREE").write_text(f"tree {side}")
        with tarfile.open(tree / f".abba/{side}.tgz", "w:gz") as tf:
            tf.add(src / "TREE", arcname="TREE")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "BASE_COMMIT": "2d3b790",
           "ABBA_A_COMMIT": "2d3b790", "ABBA_B_COMMIT": "afb361a", "ABBA_TREE_A": str(tmp_path / "tree_a"),
           "ABBA_TREE_B": str(tmp_path / "tree_b"), "ABBA_RUNS": str(tmp_path / "runs")}
    res = subprocess.run(["bash", str(tree / "experiments/gpu/commit_abba.sh")], capture_output=True, text=True,
                         env=env, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    ran = {i: (tmp_path / f"runs/{i}.log").read_text() for i in ("1_a", "2_b", "3_b", "4_a")}
    assert "in tree a as 2d3b790" in ran["1_a"] and "in tree a as 2d3b790" in ran["4_a"]
    assert "in tree b as afb361a" in ran["2_b"] and "in tree b as afb361a" in ran["3_b"]
    assert not any("working tree" in log for log in ran.values())
