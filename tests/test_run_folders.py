"""Where run.py may put a run (run.py: RunFolders, base/run/run_folder.py: check_run_folder,
check_target): below outputs_dir unless allow_outside_outputs=true, never in a folder that holds the
checkout, the working directory, outputs_dir or artifacts_dir, never over a folder that is not the
run's own; artifact paths stay in artifacts_dir whatever model.name says; a failed start leaves
nothing behind. Each refusal comes before Hydra makes a folder."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import run
from base.run.artifacts import artifact_dir

ROOT = Path(__file__).resolve().parents[1]
FAST = ["model=tiny_qwen3", "task=smoke", "logger=none", "stage=describe"]


def _run_py(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """run.py started in `cwd`, its outputs_dir `cwd/outputs` unless given (a relative outputs_dir is
    relative to the checkout, wherever run.py starts: tests/test_start_refusals.py)."""
    flags = [a for a in args if a.startswith("-")]
    rest = [a for a in args if not a.startswith("-")]
    if not any(a.startswith("outputs_dir=") for a in rest):
        rest.insert(0, f"outputs_dir={cwd}/outputs")
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *flags, *FAST, *rest],
                          cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _user_files(folder: Path) -> list[str]:
    (folder / "sub").mkdir(parents=True)
    (folder / "keep.txt").write_text("keep")
    (folder / "sub" / "data.csv").write_text("1,2")
    return _tree(folder)


SLOW = pytest.mark.slow  # one interpreter start each; the first and the last run in the fast tier


@pytest.mark.parametrize("args, message", [
    (["hydra.run.dir=."], "hydra.run.dir=. would make {cwd} a run folder, and it holds the working directory"),
    pytest.param(["hydra.run.dir=.", "allow_outside_outputs=true"], "and it holds the working directory", marks=SLOW),
    pytest.param(["hydra.run.dir=..", "allow_outside_outputs=true"], "and it holds the working directory", marks=SLOW),
    pytest.param(["-m", "hydra.sweep.dir=.", "allow_outside_outputs=true", "budget=3,4"],
                 "hydra.sweep.dir=. would make {cwd}", marks=SLOW),
    pytest.param(["-m", "hydra.sweep.dir=outputs/sw", "hydra.sweep.subdir=.", "budget=3,4"],
                 "hydra.sweep.subdir=. puts the run of `budget=3,model=tiny_qwen3,stage=describe,task=smoke` at outputs/sw, "
                 "not in a folder of its own", marks=SLOW),
    pytest.param(["hydra.run.dir=elsewhere/run"],
                 "hydra.run.dir=elsewhere/run is outside outputs_dir={cwd}/outputs ({cwd}/outputs): runs go below outputs_dir; "
                 "set allow_outside_outputs=true to write to {cwd}/elsewhere/run", marks=SLOW),
    (["hydra.run.dir=outputs/mine"], ("run folder outputs/mine holds files that are not a run of these overrides "
                                      "(keep.txt, sub); a run replaces only its own folder")),
])
def test_a_run_folder_that_would_replace_what_the_run_did_not_make_is_refused(tmp_path, args, message):
    """From a folder holding work (as the checkout does): refused before anything is written."""
    work = tmp_path / "work"
    _user_files(work)
    _user_files(work / "outputs" / "mine")
    before = _tree(work)
    proc = _run_py(work, *args)
    assert proc.returncode == 2 and message.format(cwd=work) in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and _tree(work) == before


@pytest.mark.slow
def test_outside_outputs_dir_with_the_flag_and_a_new_folder(tmp_path):
    proc = _run_py(tmp_path, "hydra.run.dir=elsewhere/run", "allow_outside_outputs=true",
                   f"artifacts_dir={tmp_path}/art")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {"config.yaml", "report.json", ".hydra", "run.log"} <= set(_tree(tmp_path / "elsewhere" / "run"))


@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_a_failed_start_leaves_nothing_behind(tmp_path):
    """No folder, no .hydra/, no log: what the command made for the run goes again; a folder that
    was there before stays."""
    proc = _run_py(tmp_path, f"outputs_dir={tmp_path}/new/outputs", "budget=17")
    assert proc.returncode == 2 and "error: budget=17 exceeds the 16 experts" in proc.stderr
    assert _tree(tmp_path) == []
    (tmp_path / "outputs" / "default").mkdir(parents=True)
    proc = _run_py(tmp_path, "budget=17")
    assert proc.returncode == 2 and _tree(tmp_path) == ["outputs", "outputs/default"]


@pytest.mark.parametrize("name", ["/abs/path/model", "../../escaped", "..", ""])
def test_artifacts_stay_in_artifacts_dir_whatever_model_name_says(compose, tmp_path, name):
    rc = run.build_config(compose([*FAST, f"model.name={name}", f"artifacts_dir={tmp_path}/art"]), tmp_path / "o")
    folder = artifact_dir(rc, {"name": name}).resolve()
    assert folder.parent.parent == (tmp_path / "art").resolve()


def test_a_single_run_and_a_sweeps_point_name_a_boolean_alike(tmp_path):
    """Hydra names a sweep's point by its parsed values (diagnose.enabled=False) and a single run by
    what was typed (=false): one folder for both, so the second finds the first finished; a marker
    written with the other spelling names the same run."""
    from base.run.run_folder import check_target, run_name, same_run, write_marker

    assert run_name("diagnose.enabled=false,method=dense") == run_name("diagnose.enabled=False,method=dense")
    assert run_name("a=[true,false],b=falsey,c=TRUE") == "a=[True,False],b=falsey,c=True"
    assert run_name("model.path=/data/true") == "model.path=_data_true"  # a path, not a boolean
    assert same_run("diagnose.enabled=False", "diagnose.enabled=false") and not same_run(None, "x=1")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "report.json").write_text("{}")
    write_marker(folder, "diagnose.enabled=False,method=dense", "h")
    check_target(folder, "diagnose.enabled=false,method=dense")  # no refusal
    with pytest.raises(run.ConfigError, match="holds the run of other overrides"):
        check_target(folder, "diagnose.enabled=true,method=dense")


@pytest.mark.slow  # two run.py processes
def test_a_single_run_after_a_sweep_of_the_same_point_is_skipped(tmp_path):
    first = _run_py(tmp_path, "-m", "exp_name=b", "diagnose.enabled=false")
    assert first.returncode == 0, first.stderr
    again = _run_py(tmp_path, "exp_name=b", "diagnose.enabled=false")
    assert again.returncode == 0, again.stderr
    assert "skipping" in again.stdout + again.stderr
    assert [p.name for p in (tmp_path / "outputs" / "b").iterdir() if p.is_dir()] == \
        ["diagnose.enabled=False,model=tiny_qwen3,stage=describe,task=smoke"]
