"""Issue 43's start-time and interrupt cases of run.py: each either a clean error (exit 2, one
line, nothing written) or handled, never a traceback.

In-process (fast): unknown keys (`key=value` and `+key=value`) refused naming the nearest valid key; an
exp_name that is an interpolation or over the filesystem's name limit; a file where the experiment
or artifacts folder should be; relative folders resolved against the checkout, wherever run.py
starts; wandb online without a login or a reachable server; two sweeps sharing a summary row.
Subprocess: run.py outside the project's environment; Ctrl-C during a sweep (exit 130, the row
`interrupted`); a full disk (`ulimit -f`)."""
from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import run
from base.config import ConfigError
from base.run.sweep import read_summary, record_job

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("override, message", [
    ("+bugdet=4", "bugdet is not a key of the run's configuration; did you mean budget?"),
    ("+eval.gen_token=3", "eval.gen_token is not a key of the run's configuration; did you mean eval.gen_tokens?"),
    ("+zzz=1", "zzz is not a key of the run's configuration; the keys here are: model, method"),
    # a plain typo too: Hydra's own hint there is `+budgt=8`, which adds a key nothing reads
    ("budgt=8", "budgt is not a key of the run's configuration; did you mean budget?"),
    ("method.kk0=1", "method.kk0 is not a key of the run's configuration; did you mean method.k0?"),
])
def test_a_key_the_run_would_never_read_is_refused_with_the_nearest_valid_one(override, message):
    with pytest.raises(ConfigError, match=message.replace("?", r"\?")):
        run.check_composition([override])
    run.check_composition(["budget=4", "model=tiny_qwen3", "+model.arch.new_size=4"])  # free-form sections stay open


@pytest.mark.parametrize("arg, message", [
    ("exp_name=${oc.env:HOME}", "give the folder name itself, not an interpolation"),
    ("exp_name=" + "x" * 256, "exp_name is 256 bytes long: a folder name holds at most 255"),
])
def test_exp_names_that_are_no_folder_name_are_refused(arg, message):
    with pytest.raises(ConfigError, match=message):
        run.check_command_line([arg])


def test_a_file_where_the_experiment_or_artifacts_folder_goes_is_refused(tmp_path):
    (tmp_path / "exp").write_text("")
    with pytest.raises(ConfigError, match=r"exp_name=.*exp is a file, not a folder"):
        run.check_command_line([f"outputs_dir={tmp_path}", "exp_name=exp"])
    (tmp_path / "art").write_text("")
    with pytest.raises(ConfigError, match=r"artifacts_dir=.*art is a file, not a folder"):
        run.check_command_line([f"outputs_dir={tmp_path}", f"artifacts_dir={tmp_path / 'art'}"])


def test_relative_folders_resolve_against_the_checkout_wherever_run_py_starts(tmp_path, monkeypatch, compose):
    """The issue: run from tests/ or /tmp, outputs went under the working directory while models
    resolved from the checkout, and `make report` never saw them."""
    monkeypatch.chdir(tmp_path)
    cfg = compose(["exp_name=e", "outputs_dir=outputs"])
    from omegaconf import OmegaConf

    resolved = OmegaConf.create({"o": "${repo:${outputs_dir}}"}, parent=cfg)
    assert Path(str(resolved.o)) == ROOT / "outputs"
    assert run.repo_path("outputs/artifacts") == ROOT / "outputs" / "artifacts"
    assert run.repo_path(str(tmp_path)) == tmp_path


def test_wandb_online_without_a_login_or_a_server_is_refused(monkeypatch, tmp_path, compose):
    from base.run.preflight import check_logger

    cfg = run.build_config(compose(["logger=wandb", "logger.mode=online", "model=tiny_qwen3", "task=smoke"]), tmp_path)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    with pytest.raises(ConfigError, match="needs a wandb login"):
        check_logger(cfg, reach=lambda address: True)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    with pytest.raises(ConfigError, match="cannot be reached from here"):
        check_logger(cfg, reach=lambda address: False)
    check_logger(cfg, reach=lambda address: address == ("api.wandb.ai", 443))


def test_a_run_one_sweep_finished_stays_finished_when_another_finds_it_done(tmp_path):
    """Two sweeps into one experiment at once: the second waited for the run's lock, then found
    it finished; its `skipped` used to replace the first's `finished` row."""
    record_job(tmp_path, "budget=4", status="started", pid=1)
    record_job(tmp_path, "budget=4", status="started", pid=2)
    record_job(tmp_path, "budget=4", status="finished", ended="t1", wall_s="5.0")
    record_job(tmp_path, "budget=4", status="skipped", ended="t2", wall_s="0.1")
    (row,) = read_summary(tmp_path)
    assert row["status"] == "finished" and row["wall_s"] == "5.0"
    record_job(tmp_path, "budget=8", status="skipped")  # a run finished by an earlier command
    assert read_summary(tmp_path)[1]["status"] == "skipped"


def test_each_sweeps_record_is_kept(tmp_path):
    sweep = tmp_path / "exp"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("first sweep\n")
    run._keep_earlier_sweep_record(sweep)
    kept = list(sweep.glob("multirun.*.yaml"))
    assert len(kept) == 1 and kept[0].read_text() == "first sweep\n" and not (sweep / "multirun.yaml").exists()


def test_run_py_outside_its_environment_says_how_to_run_it(tmp_path):
    bare = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin")
    if bare is None or subprocess.run([bare, "-c", "import hydra"], capture_output=True).returncode == 0:
        pytest.skip("no python3 without hydra on this machine")
    proc = subprocess.run([bare, str(ROOT / "run.py")], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "hydra is not installed for" in proc.stderr and "make install" in proc.stderr


def _tiny_sweep(tmp_path: Path, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "run.py"), "-m", f"outputs_dir={tmp_path}", f"artifacts_dir={tmp_path}/art",
            "logger=none", "model=tiny_qwen3", "task=smoke", "method=router_sum", "budget=2,3", "batch_size=8", *extra]


@pytest.mark.slow
def test_ctrl_c_during_a_sweep_exits_130_and_marks_the_row_interrupted(tmp_path):
    # SIGINT's disposition as a terminal gives it: a shell's background job (`make test-all &`)
    # ignores SIGINT, its children inherit that, and Python then leaves it ignored
    proc = subprocess.Popen(_tiny_sweep(tmp_path), cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 300
    while (time.time() < deadline and proc.poll() is None
           and "started" not in {r["status"] for r in read_summary(tmp_path / "default")}):
        time.sleep(0.05)
    time.sleep(0.5)  # inside the run (model building or calibration)
    statuses = [r["status"] for r in read_summary(tmp_path / "default")]
    assert proc.poll() is None, f"the sweep ended before the interrupt (rows: {statuses}): nothing to test"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, (
        f"rc {proc.returncode}; rows when interrupted: {statuses}; stderr: {err[-1500:]}; stdout: {out[-1500:]}")
    assert "interrupted" in {r["status"] for r in read_summary(tmp_path / "default")}


def test_an_interrupt_dropped_in_a_finaliser_is_delivered_again(monkeypatch):
    """Ctrl-C landing in a __del__ raises there and Python drops it (the sweep above once went on
    to exit 0): run.py delivers it again, to the code that runs next."""
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job ignores SIGINT
    try:
        run.redeliver_lost_interrupts()

        class Finaliser:
            def __del__(self):
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            Finaliser()
            deadline = time.time() + 10
            while time.time() < deadline:
                time.sleep(0.01)
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.slow
def test_a_full_disk_is_one_line_naming_the_file(tmp_path):
    """`ulimit -f` (the same error path as a full disk): one line naming what could not be written."""
    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (3_000, 3_000))

    proc = subprocess.run(_tiny_sweep(tmp_path), cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=300, preexec_fn=small_files)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "error: could not write" in proc.stderr and "multirun.yaml" in proc.stderr and "file size limit" in proc.stderr
    assert not any(tmp_path.rglob("multirun.yaml"))  # nothing half-written stays


def test_an_experiment_that_does_not_exist_is_refused_not_skipped():
    """conf/config.yaml's experiment group is optional, so Hydra skipped a misspelt one and ran the
    default configuration; the refusal names the experiments, for a sweep's value too."""
    for args in (["experiment=nosuch"], ["-m", "experiment=throughput,nosuch"]):
        with pytest.raises(ConfigError, match="experiment=nosuch is not an experiment; choose one of: .*throughput"):
            run.check_composition(args)


def test_a_sweep_point_out_of_range_is_refused_before_any_point_runs():
    """Hydra runs a sweep's points in turn, so a bad later point used to fail after the first had
    written its folder; every point's ranges and rules are checked at start."""
    with pytest.raises(ConfigError, match=r"budget=0 is out of range.*\(sweep point: .*budget=0"):
        run.check_composition(["-m", "model=tiny_qwen3", "task=smoke", "budget=4,0"])
    run.check_composition(["-m", "model=tiny_qwen3", "task=smoke", "budget=4,8"])


def test_shaping_a_checkpoints_model_is_refused():
    """model.arch builds a random-weight model; a pretrained model's shape is its config.json, so an
    arch override there changed nothing but the run's name."""
    with pytest.raises(ConfigError, match=r"model.arch shapes a model built with random weights .*model mini loads a checkpoint"):
        run.check_composition(["+model.arch.num_experts=4"])
    run.check_composition(["model=qwen3_30b", "model.init=random", "model.arch.num_experts=64"])
