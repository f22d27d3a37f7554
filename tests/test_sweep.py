"""Resumable sweeps and the sweep summary (base/run/sweep.py, run.py): a rerun skips finished runs of
the same config and redoes the rest; every job's row says finished, skipped or failed, with the
error line of a failure."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from base.run.sweep import read_summary, record_job
from tests.test_launchers import multirun

ROOT = Path(__file__).resolve().parents[1]


def by_run(sweep_dir: Path) -> dict[str, dict]:
    return {r["run"]: r for r in read_summary(sweep_dir)}


def test_rows_update_in_place_and_refuse_unknown_values(tmp_path):
    record_job(tmp_path, "a", status="started", job=0, started="t0")
    record_job(tmp_path, "a", status="failed", error="ValueError: x", ended="t1")
    record_job(tmp_path, "b", status="started", job=1)
    record_job(tmp_path, "a", status="started", job=0, started="t2")  # a rerun: the old outcome goes
    rows = by_run(tmp_path)
    assert list(rows) == ["a", "b"]
    assert (rows["a"]["status"], rows["a"]["error"], rows["a"]["ended"], rows["a"]["started"]) == ("started", "", "", "t2")
    with pytest.raises(ValueError, match="valid: started, finished, skipped, failed"):
        record_job(tmp_path, "a", status="done")
    with pytest.raises(ValueError, match="unknown sweep summary columns"):
        record_job(tmp_path, "a", colour="red")


WRITER = """
import sys
from pathlib import Path
from base.run.sweep import record_job
for i in range(25):
    record_job(Path(sys.argv[1]), f"{sys.argv[2]}-{i}", status="finished", job=i)
"""


def test_concurrent_jobs_lose_no_rows(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), f"w{k}"], cwd=ROOT) for k in range(4)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    assert len(by_run(tmp_path)) == 100
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


@pytest.mark.slow
def test_rerun_skips_finished_runs_and_redoes_an_interrupted_one(tmp_path):
    sweep = ("stage=describe", "seed=0,1,2")
    assert multirun(tmp_path, *sweep).returncode == 0
    sweep_dir = tmp_path / "default"
    first = by_run(sweep_dir)
    assert [r["status"] for r in first.values()] == ["finished"] * 3
    # a job killed before its report (report.json is written last) leaves no report
    killed = next(iter(first))
    (sweep_dir / killed / "report.json").unlink()
    proc = multirun(tmp_path, *sweep)
    assert proc.returncode == 0 and proc.stdout.count("skipping. force=true reruns it") == 2
    rows = by_run(sweep_dir)
    assert {k: r["status"] for k, r in rows.items()} == {k: "finished" if k == killed else "skipped" for k in first}
    assert json.loads((sweep_dir / killed / "report.json").read_text())["config_hash"] == rows[killed]["config_hash"]


@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_failed_jobs_are_listed_with_their_error_lines(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("too short to calibrate on")
    proc = multirun(tmp_path, "stage=throughput", "budget=2", "throughput.methods=[dense],[dense,router_sum],[dense,base]",
                    "throughput.batch_sizes=[2]", "throughput.prompt_len=4", "throughput.gen_tokens=3",
                    "throughput.stats_steps=1", "throughput.profile_batch=null", f"calibration.files=[{short}]")
    assert proc.returncode != 0  # a failed job fails the sweep, after the other jobs ran
    rows = list(by_run(tmp_path / "default").values())
    status = {r["overrides"].rsplit("throughput.methods=", 1)[1].split(",throughput")[0]: r for r in rows}
    assert {k: r["status"] for k, r in status.items()} == {"[dense]": "finished", "[dense,router_sum]": "finished",
                                                           "[dense,base]": "failed"}
    assert status["[dense,base]"]["error"].startswith("ConfigError: calibration.files hold ")
    assert not (tmp_path / "default" / status["[dense,base]"]["run"] / "report.json").exists()


@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_a_point_that_fails_at_start_is_recorded_and_the_sweep_goes_on(tmp_path):
    """The first point's budget is above the model's experts: it is listed as failed with its error,
    leaves no folder, and the next point runs; the command then ends with exit 2, naming it."""
    proc = multirun(tmp_path, "exp_name=bad", "stage=describe", "budget=17,4")
    assert proc.returncode == 2 and "error: budget=17 exceeds the 16 experts" in proc.stderr
    assert "error: 1 of 2 sweep points failed, each with its error in sweep_summary.csv" in proc.stderr
    assert "Traceback" not in proc.stderr
    rows = {r["overrides"].rsplit("budget=", 1)[1]: r for r in read_summary(tmp_path / "bad")}
    error = "ConfigError: budget=17 exceeds the 16 experts of tiny_qwen3; choose 1..16 or null (dense)"
    assert (rows["17"]["status"], rows["17"]["error"]) == ("failed", error)
    assert rows["4"]["status"] == "finished" and (tmp_path / "bad" / rows["4"]["run"] / "report.json").exists()
    assert not (tmp_path / "bad" / rows["17"]["run"]).exists()


@pytest.mark.slow
def test_points_whose_run_folders_collide_are_refused_before_the_sweep_starts(tmp_path):
    """`/` becomes `_` in a folder name: these two points would share one folder."""
    proc = multirun(tmp_path, "stage=describe", "calibration.files=[data/a.txt],[data_a.txt]")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert ("error: sweep points `calibration.files=[data/a.txt],model=tiny_qwen3,stage=describe,task=smoke` and "
            "`calibration.files=[data_a.txt],model=tiny_qwen3,stage=describe,task=smoke` would share the run folder") in proc.stderr
    assert list(tmp_path.iterdir()) == []  # refused before Hydra made the sweep folder


@pytest.mark.slow
def test_a_killed_sweep_resumes(tmp_path):
    """SIGKILL the whole sweep once its first run has finished and the second started; the same
    command then skips the finished run and reruns the others (the killed one included)."""
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", f"outputs_dir={tmp_path}", f"artifacts_dir={tmp_path}/art",
           "logger=none", "model=tiny_qwen3", "task=smoke", "method=router_sum", "budget=2,3,4", "batch_size=8",
           "diagnose.enabled=false"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    sweep_dir = tmp_path / "default"
    deadline = time.time() + 300
    while time.time() < deadline:
        statuses = [r["status"] for r in read_summary(sweep_dir)]
        if "finished" in statuses and "started" in statuses:
            break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = {p.parent.name for p in sweep_dir.glob("*/report.json")}
    assert 1 <= len(done) < 3
    assert "started" in {r["status"] for r in read_summary(sweep_dir)}  # the killed job's row
    assert subprocess.run(cmd, check=False, cwd=tmp_path, env=env, capture_output=True, timeout=600).returncode == 0
    rows = by_run(sweep_dir)
    assert len(rows) == 3 and {k for k, r in rows.items() if r["status"] == "skipped"} == done
    assert {r["status"] for k, r in rows.items() if k not in done} == {"finished"}


@pytest.mark.slow
def test_a_finished_run_s_row_carries_its_headline_numbers(tmp_path):
    """Evaluation: summary accuracy, kept and union experts; a rerun that skips it keeps them."""
    assert multirun(tmp_path, "method=base", "budget=2,3", "batch_size=4").returncode == 0
    rows = by_run(tmp_path / "default")
    for name, row in rows.items():
        report = json.loads((tmp_path / "default" / name / "report.json").read_text())
        assert row["status"] == "finished" and row["tokens_per_s"] == ""
        assert float(row["accuracy"]) == pytest.approx(report["summary"]["accuracy"], rel=1e-5)
        assert 0 < float(row["kept_mean"]) <= report["budget"] < float(row["union_mean"])
    (tmp_path / "default" / "sweep_summary.csv").unlink()  # a summary that never saw the runs finish
    assert multirun(tmp_path, "method=base", "budget=2,3", "batch_size=4").returncode == 0
    again = by_run(tmp_path / "default")
    assert {r["status"] for r in again.values()} == {"skipped"}
    assert [r["accuracy"] for r in again.values()] == [r["accuracy"] for r in rows.values()]


def test_headline_numbers_of_each_kind_of_run(tmp_path):
    from base.run.report import headline

    ev = {"summary": {"accuracy": 0.5, "kept_mean": 3.0, "union_mean": 9.5, "weight_retained": 0.9}}
    assert headline(ev) == {"accuracy": 0.5, "kept_mean": 3.0, "union_mean": 9.5, "tokens_per_s": None}
    steps = {"throughput": [
        {"batch_size": 8, "mode": "graph", "budget": None, "tokens_per_s": 100.0, "kept_mean": 9.0, "union_mean": 9.0},
        {"batch_size": 16, "mode": "eager", "budget": None, "tokens_per_s": 1.0, "kept_mean": 9.0, "union_mean": 9.0},
        {"batch_size": 16, "mode": "graph", "budget": None, "tokens_per_s": 150.0, "kept_mean": 12.0, "union_mean": 12.0},
        {"batch_size": 16, "mode": "graph", "budget": 4, "tokens_per_s": 300.0, "kept_mean": 4.0, "union_mean": 12.0}]}
    assert headline(steps) == {"accuracy": None, "kept_mean": 4.0, "union_mean": 12.0, "tokens_per_s": 300.0}
    stream = {"stream": [{"slots": 4, "budget": None, "tokens_per_s": 50, "kept_mean": None, "union_mean": None}]}
    assert headline(stream)["tokens_per_s"] == 50.0 and headline(stream)["kept_mean"] is None
    serve = {"serve": [{"slots": 4, "variant": v, "budget": b, "rate": r, "arrivals": "burst" if r is None else "poisson",
                        "output_throughput": t} for v, b, r, t in
                       [("dense", None, None, 10.0), ("base", 4, None, 20.0), ("base", 4, None, 40.0),
                        ("base", 4, None, 30.0), ("base", 4, 2.0, 5.0)]]}
    assert headline(serve)["tokens_per_s"] == 30.0  # base's burst streams, the median over repeats
    record_job(tmp_path, "r", status="finished", **headline(steps))
    row = by_run(tmp_path)["r"]
    assert (row["accuracy"], row["kept_mean"], row["union_mean"], row["tokens_per_s"]) == ("", "4", "12", "300")
