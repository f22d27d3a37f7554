"""A finished result is never destroyed before its replacement is complete (base/run/run_folder.py:
staging_dir, publish, recover): a rerun killed while it runs, or between any two of the swap's
renames, leaves a whole result, whatever the run's name (list overrides put brackets in it); two
runs of one folder take turns; a folder that is not the run's own is never replaced; settings that
do not change results (artifacts_dir) rerun nothing."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import run
from base.config import ConfigError
from base.run import outputs, run_folder
from base.run.pipeline import run as run_pipeline

ROOT = Path(__file__).resolve().parents[1]
FAST = ["model=tiny_qwen3", "task=smoke", "logger=none", "method=router_sum", "budget=3",
        "diagnose.enabled=false"]  # the calibration-time diagnostic is tests/test_diagnose.py's
BRACKETED = "throughput.methods=[dense,base],budget=3"  # a list override's run name: a glob character class


def _finish(compose, out: Path, *overrides: str, run_key: str | None = None) -> dict | None:
    cfg = compose([*FAST, *overrides])
    key = {} if run_key is None else {"run_key": run_key}
    return run_pipeline(run.build_config(cfg, out, **key), OmegaConf.to_yaml(cfg, resolve=True))


def _beside(out: Path, kind: str) -> list[Path]:
    """out's .<name>.<kind>-<pid> folders, by exact name (a bracketed name is no glob pattern)."""
    return [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.{kind}-")]


def _whole(out: Path) -> dict:
    """The finished run in out: report.json and config.yaml of the same run (its hash); the report."""
    report = json.loads((out / "report.json").read_text())
    assert outputs.config_hash((out / "config.yaml").read_text()) == report["config_hash"]
    return report


@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_a_rerun_killed_midway_leaves_the_finished_result_whole(compose, tmp_path):
    out = tmp_path / BRACKETED
    first = _finish(compose, out, "batch_size=8", f"artifacts_dir={tmp_path}/a")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    script = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
              "from hydra import compose, initialize_config_dir\nfrom omegaconf import OmegaConf\nimport run\n"
              "from base.run.pipeline import run as go\n"
              f"with initialize_config_dir(config_dir={str(ROOT / 'conf')!r}, version_base='1.3'):\n"
              f"    cfg = compose('config', overrides={[*FAST, 'batch_size=4', f'artifacts_dir={tmp_path}/a']!r})\n"
              f"go(run.build_config(cfg, __import__('pathlib').Path({str(out)!r})), OmegaConf.to_yaml(cfg, resolve=True))\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    deadline = time.time() + 120
    while time.time() < deadline and not [p for p in _beside(out, "partial") if (p / "config.yaml").exists()]:
        time.sleep(0.05)
    assert [p for p in _beside(out, "partial") if (p / "config.yaml").exists()], "the rerun never started writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert after == before  # every file of the finished run as it was, config.yaml matching its report
    assert json.loads((out / "report.json").read_text())["config_hash"] == first["config_hash"]
    # the next run clears the killed rerun's folder and finishes in place
    second = _finish(compose, out, "batch_size=4", f"artifacts_dir={tmp_path}/a")
    assert second["batch_size"] == 4 and not _beside(out, "partial")
    assert json.loads((out / "report.json").read_text())["batch_size"] == 4


@pytest.mark.parametrize("renames_done", [pytest.param(0, marks=pytest.mark.slow), pytest.param(1, marks=pytest.mark.slow),
                                          pytest.param(2, marks=pytest.mark.slow)])
def test_a_kill_between_the_swaps_renames_leaves_a_whole_result(compose, tmp_path, monkeypatch, renames_done):
    """publish swaps by three renames (old result aside, new result in, its report last); a kill
    after any of them leaves the next run a whole result: the old one, or the new one completed.
    The old run is of another config (batch_size 8), so it is kept beside the new one (issue 43):
    once it has been moved aside, the next run completes the new one in place."""
    out = tmp_path / BRACKETED
    old = _finish(compose, out, "batch_size=8", f"artifacts_dir={tmp_path}/a")
    cfg = compose([*FAST, "batch_size=4", f"artifacts_dir={tmp_path}/a"])
    rc = run.build_config(cfg, out)
    real_rename, done = Path.rename, []

    def dying_rename(self, target):  # the process dies after `renames_done` renames of publish
        if len(done) == renames_done:
            raise KeyboardInterrupt("killed")
        done.append(target)
        return real_rename(self, target)

    monkeypatch.setattr(run_folder, "publish", lambda stage, target, keep=None, publish=run_folder.publish: (
        monkeypatch.setattr(Path, "rename", dying_rename), publish(stage, target, keep)))
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(rc, OmegaConf.to_yaml(cfg, resolve=True))
    monkeypatch.undo()
    assert not out.exists() or not (out / "report.json").exists() or _whole(out)
    run_folder.recover(out)  # as the next run does first
    report = _whole(out)
    assert report["config_hash"] == (old["config_hash"] if renames_done < 1 else outputs.config_hash(
        OmegaConf.to_yaml(cfg, resolve=True)))
    kept = [p for p in out.parent.iterdir() if p.name.startswith(out.name + "~")]
    assert [_whole(p)["config_hash"] for p in kept] == ([old["config_hash"]] if renames_done >= 1 else [])
    assert not _beside(out, "old")
    # and the next run carries on from there: skips the finished new result, or reruns over the old
    again = run_pipeline(rc, OmegaConf.to_yaml(cfg, resolve=True))
    assert (again is None) == (renames_done >= 1) and _whole(out)["batch_size"] == 4 and not _beside(out, "partial")


@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_a_folder_that_is_not_a_run_survives_being_named_as_the_run_folder(compose, tmp_path):
    """A user's folder, or another run's, named as this run's folder: refused, every file kept."""
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "keep.txt").write_text("keep")
    (mine / "sub" / "data.csv").write_text("1,2")
    with pytest.raises(ConfigError, match="holds files that are not a run of these overrides .keep.txt, sub.; a run "
                                          "replaces only its own folder"):
        _finish(compose, mine, f"artifacts_dir={tmp_path}/a", "force=true")
    assert sorted(str(p.relative_to(mine)) for p in mine.rglob("*")) == ["keep.txt", "sub", "sub/data.csv"]
    other = tmp_path / "budget=3"
    first = _finish(compose, other, f"artifacts_dir={tmp_path}/a", run_key="budget=3")
    with pytest.raises(ConfigError, match=r"holds the run of other overrides \(budget=3\)"):
        _finish(compose, other, f"artifacts_dir={tmp_path}/a", "batch_size=4", run_key="batch_size=4,budget=3")
    assert _whole(other) == first
    # its own overrides replace it (a changed config, or force=true)
    assert _finish(compose, other, f"artifacts_dir={tmp_path}/a", "batch_size=4", run_key="budget=3")["batch_size"] == 4


def test_a_second_run_of_the_same_folder_waits_for_the_first(compose, tmp_path, capsys):
    """The folder's lock is held (as a first run holds it while it runs): the second run stages
    nothing until it is free, then finds the folder as the first left it."""
    out = tmp_path / BRACKETED
    cfg = compose([*FAST, f"artifacts_dir={tmp_path}/a"])
    second: list = []
    with run_folder.run_lock(out):
        job = threading.Thread(target=lambda: second.append(
            run_pipeline(run.build_config(cfg, out), OmegaConf.to_yaml(cfg, resolve=True))))
        job.start()
        deadline = time.time() + 60
        while time.time() < deadline and "in progress" not in capsys.readouterr().out:
            time.sleep(0.05)
        time.sleep(0.5)
        assert job.is_alive() and not _beside(out, "partial")  # waiting, nothing staged
    job.join(120)
    assert second[0]["config_hash"] == _whole(out)["config_hash"]
    assert not (out.parent / f".{out.name}.lock").exists()  # the finished run leaves no lock file


def test_the_folder_lock_goes_when_its_run_ends_and_still_admits_one_at_a_time(tmp_path):
    """A finished run leaves no `.<name>.lock` beside its folder. Its holder removes it while it
    holds it; a run that was waiting on the removed file, or one that made a new file meanwhile,
    still takes its turn alone: many holders in a row, each checking that no other holds it."""
    out = tmp_path / BRACKETED
    lock = out.parent / f".{out.name}.lock"
    holding, seen, errors = [0], [], []

    def take_turns(n: int) -> None:
        try:
            for _ in range(n):
                with run_folder.run_lock(out):
                    holding[0] += 1
                    seen.append(holding[0])
                    time.sleep(0.002)
                    holding[0] -= 1
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    with run_folder.run_lock(out):
        assert lock.exists()
    assert not lock.exists()
    workers = [threading.Thread(target=take_turns, args=(40,)) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert not errors and len(seen) == 160 and set(seen) == {1}  # never two holders at once
    assert not lock.exists() and not list(out.parent.iterdir())


@pytest.mark.slow  # test_a_second_run_of_the_same_folder_waits_for_the_first is the fast one
def test_two_identical_runs_at_once_leave_one_whole_result(tmp_path):
    """Two processes start the same run together: one computes it, the other waits and then skips
    it; the result in the folder is whole (config.yaml beside report.json) as soon as the first exits."""
    out = tmp_path / BRACKETED
    script = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
              "from hydra import compose, initialize_config_dir\nfrom omegaconf import OmegaConf\nimport run\n"
              "from base.run.pipeline import run as go\n"
              f"with initialize_config_dir(config_dir={str(ROOT / 'conf')!r}, version_base='1.3'):\n"
              f"    cfg = compose('config', overrides={[*FAST, f'artifacts_dir={tmp_path}/a']!r})\n"
              f"go(run.build_config(cfg, __import__('pathlib').Path({str(out)!r})), OmegaConf.to_yaml(cfg, resolve=True))\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    while all(p.poll() is None for p in procs):
        time.sleep(0.02)
    assert (out / "report.json").exists(), "the first run to end left no result"
    first = _whole(out)
    logs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in logs]
    assert sum("skipping" in stdout for stdout, _ in logs) == 1  # one computed, the other found it done
    assert _whole(out) == first and not _beside(out, "partial") and not _beside(out, "old")


@pytest.mark.slow
def test_a_new_artifacts_dir_does_not_make_a_finished_run_stale(compose, tmp_path, capsys):
    out = tmp_path / "run"
    _finish(compose, out, f"artifacts_dir={tmp_path}/a")
    report = (out / "report.json").read_bytes()
    assert _finish(compose, out, f"artifacts_dir={tmp_path}/elsewhere") is None
    assert "skipping" in capsys.readouterr().out and (out / "report.json").read_bytes() == report


@pytest.mark.slow  # a run and two reruns; test_a_second_run_of_the_same_folder_waits_for_the_first is the fast one
def test_a_skipped_run_made_at_another_commit_says_so(compose, tmp_path, capsys, monkeypatch):
    """A finished run of the same config is skipped whatever code made it; where its report names
    another commit than this checkout's, the skip says both, so a rerun after a code change is not
    mistaken for a new measurement. The same commit adds nothing."""
    out = tmp_path / "run"
    monkeypatch.setenv("BASE_COMMIT", "aaaaaaa")
    _finish(compose, out, f"artifacts_dir={tmp_path}/a")
    report = (out / "report.json").read_bytes()
    capsys.readouterr()
    assert _finish(compose, out, f"artifacts_dir={tmp_path}/a") is None
    said = capsys.readouterr().out
    assert "skipping" in said and "made at commit" not in said
    monkeypatch.setenv("BASE_COMMIT", "bbbbbbb")
    assert _finish(compose, out, f"artifacts_dir={tmp_path}/a") is None
    said = capsys.readouterr().out
    assert "made at commit aaaaaaa, not this checkout's bbbbbbb; skipping" in said
    assert (out / "report.json").read_bytes() == report
