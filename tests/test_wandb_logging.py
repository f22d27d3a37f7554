"""How runs reach wandb (base/run/logger.py, base/run/log_run.py): grouped by experiment, tagged by
model/method/budget/stage, named readably and distinctly within a sweep; offline files of every run
in one folder (logger.dir) for one `wandb sync`; a finished run logged afterwards from its folder."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from base.run.logger import run_identity, split_overrides

ROOT = Path(__file__).resolve().parents[1]


def test_runs_of_a_sweep_get_distinct_readable_names_one_group_and_their_axes_as_tags():
    a = run_identity("sweep1", "mini", "base", 16, "evaluate", "budget=16,method=base,seed=1")
    b = run_identity("sweep1", "mini", "base", 16, "evaluate", "budget=16,method=base,seed=2")
    d = run_identity("sweep1", "mini", "dense", None, "throughput", "calibration.files=[a.txt,b.txt],method=dense")
    assert a.name == "mini base M=16 [seed=1]" and a.name != b.name and a.group == b.group == "sweep1"
    assert a.tags == ("model:mini", "method:base", "budget:16", "stage:evaluate")
    assert d.name == "mini dense throughput [calibration.files=[a.txt,b.txt]]" and "budget:dense" in d.tags
    assert split_overrides("a=1,b=[x,y],c={p:1,q:2}") == ["a=1", "b=[x,y]", "c={p:1,q:2}"]


def _offline_runs(directory: Path) -> list[Path]:
    return sorted((directory / "wandb").glob("offline-run-*"))


@pytest.mark.slow
def test_a_run_logs_to_one_sync_folder_with_group_tags_and_name(compose, tmp_path, monkeypatch):
    import wandb

    import run
    from base.run.pipeline import run as run_pipeline

    seen = []
    real_init = wandb.init
    monkeypatch.setattr(wandb, "init", lambda **kw: seen.append(real_init(**kw)) or seen[-1])
    cfg = compose(["model=tiny_qwen3", "task=smoke", "task.limit=2", "method=router_sum", "budget=2",
                   "diagnose.enabled=false", "logger=wandb", f"outputs_dir={tmp_path}/outputs", "exp_name=sweep7"])
    out = tmp_path / "outputs" / "sweep7" / "run1"
    run_pipeline(run.build_config(cfg, out, "budget=2,method=router_sum"), OmegaConf.to_yaml(cfg, resolve=True))
    logged = seen[0]
    assert (logged.name, logged.group) == ("tiny_qwen3 router_sum M=2", "sweep7")
    assert set(logged.tags) == {"model:tiny_qwen3", "method:router_sum", "budget:2", "stage:evaluate"}
    assert len(_offline_runs(tmp_path / "outputs" / "wandb")) == 1  # the one place `wandb sync` reads
    assert not list(out.rglob("offline-run-*"))


@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_a_finished_run_is_logged_afterwards_from_its_folder(compose, tmp_path):
    import run
    from base.run.log_run import log_folder
    from base.run.pipeline import run as run_pipeline

    cfg = compose(["model=tiny_qwen3", "task=smoke", "task.limit=2", "method=router_sum", "budget=2",
                   "diagnose.enabled=false", "logger=none", "exp_name=late"])
    out = tmp_path / "late" / "run"
    run_pipeline(run.build_config(cfg, out, "budget=2,method=router_sum"), OmegaConf.to_yaml(cfg, resolve=True))
    done = log_folder(out, "offline", str(tmp_path / "wb"))
    assert done["group"] == "late" and done["name"] == "tiny_qwen3 router_sum M=2"
    assert done["tables"] == ["metrics", "selection"]
    assert len(_offline_runs(tmp_path / "wb")) == 1
    assert done["sync"].startswith("wandb sync ") and "offline-run-" in done["sync"]


@pytest.mark.slow
def test_log_run_refuses_a_folder_that_holds_no_finished_run(tmp_path):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.yaml").write_text("model: {}\n")
    proc = subprocess.run([sys.executable, "-m", "base.run.log_run", str(tmp_path / "half"), "--dir", str(tmp_path / "wb")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "is not a finished run folder (it needs report.json" in proc.stderr
    assert not (tmp_path / "wb").exists()


@pytest.mark.slow
def test_a_run_logged_offline_ends_with_the_sync_command_the_installed_wandb_takes(compose, tmp_path, capsys):
    """wandb 0.2x/0.3x has no `--sync-all` and keeps runs one folder deeper: the run's report, its
    printed summary and its run.log name `wandb sync <its folder>`, which the installed wandb finds."""
    import run
    from base.run.pipeline import run as run_pipeline
    from base.run.report import print_report

    cfg = compose(["model=tiny_qwen3", "task=smoke", "task.limit=2", "method=dense", "logger=wandb",
                   f"outputs_dir={tmp_path}/outputs"])
    out = tmp_path / "outputs" / "default" / "run1"
    report = run_pipeline(run.build_config(cfg, out, "method=dense"), OmegaConf.to_yaml(cfg, resolve=True))
    (folder,) = _offline_runs(tmp_path / "outputs" / "wandb")
    assert Path(report["wandb"]["dir"]).resolve() == folder.resolve()
    command = report["wandb"]["sync"].split()
    assert command[:2] == ["wandb", "sync"] and "--sync-all" not in command
    print_report(report, out)
    said = capsys.readouterr().out.strip().splitlines()[-1]
    assert said.startswith("  wandb: logged offline to") and report["wandb"]["sync"] in said
    assert (out / "run.log").read_text().strip().splitlines()[-1] == said
    for cmd in (command, report["wandb"]["all"].split()):  # what the installed wandb would upload
        dry = subprocess.run([str(Path(sys.executable).parent / "wandb"), *cmd[1:], "--dry-run"], capture_output=True,
                             text=True, timeout=120, check=False)
        assert dry.returncode == 0 and "Would sync 1 run(s)" in dry.stdout + dry.stderr, dry.stdout + dry.stderr


def test_where_logged_names_an_offline_run_s_folder_and_sync_command(tmp_path):
    import wandb

    from base.run.logger import where_logged

    offline = wandb.init(project="t", dir=str(tmp_path), mode="offline")
    offline.finish()
    hint = where_logged(offline)
    assert hint.startswith("[wandb] logged offline to ") and "`wandb sync " in hint and "offline-run-" in hint
    disabled = wandb.init(project="t", dir=str(tmp_path), mode="disabled")
    disabled.finish()
    assert where_logged(disabled) is None and where_logged(None) is None
