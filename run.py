"""The one entry point. Hydra is read here only: it builds a typed RunConfig and hands it down.

    python run.py model=qwen3_30b method=base budget=16
    python run.py -m method=dense,router_sum,count,base budget=4,8,16
    python run.py model=qwen3_30b model.init=random model.device=meta stage=describe logger=none

Each run writes outputs/<exp_name>/<run name from overrides>/ (config.yaml, report.json, CSVs);
a sweep also keeps outputs/<exp_name>/sweep_summary.csv (base/run/sweep.py). Launchers
(docs/cluster.md): hydra/launcher=local_gpus | joblib | submitit_local | slurm | ray.
"""
from __future__ import annotations

import hashlib
import os
import socket
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import MISSING, DictConfig, OmegaConf

from base.checks import check_folder
from base.config import (
    CalibConfig,
    ConfigError,
    DescribeConfig,
    EvalConfig,
    LoggerConfig,
    MethodConfig,
    ModelConfig,
    PredictorConfig,
    RunConfig,
    SchedulerConfig,
    ServeConfig,
    StatsConfig,
    StreamConfig,
    TaskConfig,
    ThroughputConfig,
)
from base.run.gpu_pool import job_gpu, launcher_jobs, lock_dir, visible_gpus
from base.run.sweep import error_line, record_job

ROOT = Path(__file__).resolve().parent

# Set when the command starts and inherited by every job a launcher starts (worker processes,
# SLURM tasks): force=true recomputes a shared artifact once per sweep (base/run/artifacts.py).
STARTED_ENV = "BASE_SWEEP_STARTED"
MAX_RUN_NAME = 120  # file systems allow 255 bytes per name; leave room for Hydra's own suffixes


def run_name(overrides: str) -> str:
    """A run folder's name: its sorted overrides, "default" for none; a long one keeps a readable
    prefix and a hash of the whole (every override is in config.yaml and report.json). A path in an
    override value (model.path=/data/m) cannot lead the folder elsewhere: separators become '_'."""
    if not overrides:
        return "default"
    overrides = overrides.replace("/", "_").replace("\\", "_")
    if len(overrides) <= MAX_RUN_NAME:
        return overrides
    digest = hashlib.sha1(overrides.encode()).hexdigest()[:10]
    return f"{overrides[: MAX_RUN_NAME - 12].rstrip(',')}-{digest}"


@dataclass
class RunSchema:
    """conf/config.yaml's shape, registered with Hydra's ConfigStore (conf/config.yaml's defaults list
    starts with it): every key has a type, so a value of the wrong type (`force=maybe`, `budget=abc`)
    or an unknown key fails when Hydra composes the configuration, naming the key, and on/off
    switches are booleans (`no` is false). Ranges and cross-field rules are checked after
    composition, in the dataclasses' __post_init__ (base/config.py)."""

    model: ModelConfig = MISSING
    method: MethodConfig = MISSING
    task: TaskConfig = MISSING
    logger: LoggerConfig = MISSING
    budget: int | None = 8
    batch_size: int = 16
    seed: int = 0
    stage: str = "evaluate"
    force: bool = False
    exp_name: str = "default"
    outputs_dir: str = "outputs"
    artifacts_dir: str = "outputs/artifacts"
    eval: EvalConfig = field(default_factory=EvalConfig)
    calibration: CalibConfig = MISSING
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    throughput: ThroughputConfig = field(default_factory=ThroughputConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    stats: StatsConfig = field(default_factory=StatsConfig)
    describe: DescribeConfig = field(default_factory=DescribeConfig)


ConfigStore.instance().store(name="run_schema", node=RunSchema)


def folder_name(name: str) -> str:
    """exp_name as the folder it names under outputs_dir: a plain name, nothing that leaves it."""
    name = str(name)
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise ConfigError(f"exp_name={name!r} must be a plain folder name (no '/', '\\', '..'): runs go to "
                          f"<outputs_dir>/<exp_name>/")
    return name


OmegaConf.register_new_resolver("run_name", run_name, replace=True)
OmegaConf.register_new_resolver("folder", folder_name, replace=True)
# hydra/launcher=local_gpus: one joblib worker per GPU (resolved in the launching process)
OmegaConf.register_new_resolver("gpu_count", launcher_jobs, replace=True)
# hydra/launcher=ray_jobs: a GPU per task where there are GPUs (num_gpus=1 on a CPU host never schedules)
OmegaConf.register_new_resolver("one_gpu_if_any", lambda: min(1, len(visible_gpus())), replace=True)


def calibration(c: dict, overrides: str) -> dict:
    """The calibration settings: a model's own files replace the default calibration.files, and a
    calibration.files given on the command line replaces both."""
    calib = dict(c["calibration"])
    if c["model"].get("calib_files") and "calibration.files=" not in overrides:
        calib["files"] = list(c["model"]["calib_files"])
    return calib


def build_config(cfg: DictConfig, out_dir: Path, overrides: str = "") -> RunConfig:
    """DictConfig -> validated RunConfig. Raises ValueError with the valid choices or range."""
    c = OmegaConf.to_container(cfg, resolve=True)
    def resolve(p: str) -> Path:
        return Path(p) if Path(p).is_absolute() else ROOT / p

    return RunConfig(
        model=ModelConfig(**c["model"]),
        method=MethodConfig(**c["method"]),
        task=TaskConfig(**c["task"]),
        budget=c["budget"],
        batch_size=c["batch_size"],
        seed=c["seed"],
        stage=c["stage"],
        out_dir=out_dir,
        artifacts_dir=resolve(c["artifacts_dir"]),
        root=ROOT,
        overrides=overrides,
        force=bool(c["force"]),
        experiment=c["exp_name"],
        eval=EvalConfig(**c["eval"]),
        calibration=CalibConfig(**calibration(c, overrides)),
        predictor=PredictorConfig(**c["predictor"]),
        throughput=ThroughputConfig(**c["throughput"]),
        stats=StatsConfig(**c["stats"]),
        logger=LoggerConfig(**c["logger"]),
        describe=DescribeConfig(**c["describe"]),
        stream=StreamConfig(**c["stream"]),
        serve=ServeConfig(**c["serve"]),
        scheduler=SchedulerConfig(**c["scheduler"]),
        started=float(os.environ.get(STARTED_ENV, time.time())),
    )


# The launcher settings conf/hydra/launcher/*.yaml read from the environment, with their minimum:
# checked before Hydra resolves them (its message for a bad one is a traceback).
LAUNCHER_ENV = {"BASE_SLURM_GPUS": 0, "BASE_SLURM_TIME_MIN": 1, "BASE_SLURM_MEM_GB": 1, "BASE_SLURM_CPUS": 1,
                "BASE_SLURM_REQUEUE": 0,
                "BASE_RAY_GPUS": 0, "BASE_RAY_CPUS": 0}


def check_launcher_env() -> None:
    for key, low in LAUNCHER_ENV.items():
        value = os.environ.get(key)
        if value is None:
            continue
        whole = key.startswith("BASE_SLURM")  # Ray takes fractions of a GPU or CPU
        try:
            number = int(value) if whole else float(value)
        except ValueError:
            number = None
        if number is None or number < low:
            kind = "a whole number" if whole else "a number"
            raise ConfigError(f"{key}={value!r} must be {kind} >= {low} (read by hydra/launcher="
                              f"{'slurm' if whole else 'ray_jobs'})")


def sweep_note(cfg: DictConfig, gpu: str | None) -> Callable[..., None]:
    """note(status=..., error=...) writes this job's row of the sweep summary (base/run/sweep.py)."""
    hc = HydraConfig.get()
    sweep_dir, run = Path(hc.sweep.dir), str(hc.sweep.subdir)
    from base.run.outputs import config_hash

    fixed = {"job": hc.job.num, "overrides": ",".join(hc.overrides.task), "host": socket.gethostname(),
             "config_hash": config_hash(OmegaConf.to_yaml(cfg, resolve=True)), "pid": os.getpid(), "gpu": gpu,
             "launcher": str(hc.launcher.get("_target_", "")).rsplit(".", 1)[-1]}
    t0 = time.time()

    def note(status: str, error: str | None = None) -> None:
        now = datetime.now().isoformat(timespec="seconds")
        if status == "started":
            record_job(sweep_dir, run, status=status, started=now, **fixed)
        else:
            record_job(sweep_dir, run, status=status, error=error, ended=now, wall_s=f"{time.time() - t0:.1f}")

    return note


def run_job(cfg: DictConfig, out_dir: Path, overrides: str) -> dict | None:
    """One run; raises ConfigError for a bad input (before the run writes anything)."""
    try:
        run_cfg = build_config(cfg, out_dir, overrides)
    except TypeError as err:  # an unknown key reaching a config dataclass
        raise ConfigError(str(err)) from None
    from base.run.pipeline import run

    return run(run_cfg, OmegaConf.to_yaml(cfg, resolve=True))


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> dict | None:
    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    sweep = hc.mode == RunMode.MULTIRUN
    # joblib workers share this host's GPUs: each job holds one (base/run/gpu_pool.py)
    local_parallel = sweep and "joblib" in str(hc.launcher.get("_target_", ""))
    with job_gpu(visible_gpus(), lock_dir()) if local_parallel else nullcontext() as gpu:
        note = sweep_note(cfg, gpu) if sweep else lambda status, error=None: None
        note("started")
        try:
            report = run_job(cfg, out_dir, ",".join(hc.overrides.task))
        except ConfigError as err:  # e.g. budget above the model's expert count
            note("failed", error_line(err))
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        except Exception as err:
            note("failed", error_line(err))
            raise
        note("skipped" if report is None else "finished")
    if report is not None:
        from base.run.report import print_report

        print_report(report, out_dir)
    return report


def check_command_line(argv: list[str]) -> None:
    """What must be refused before Hydra makes the run folder (it creates it before any of the
    project's code runs): an exp_name that would leave outputs_dir, an outputs_dir blocked by a file."""
    outputs_dir = "outputs"  # conf/config.yaml's default, relative to where run.py is started
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        if key == "exp_name":
            for name in value.split(","):  # a sweep over names
                folder_name(name)
        if key == "outputs_dir":
            outputs_dir = value
    check_folder("outputs_dir", Path(outputs_dir))


if __name__ == "__main__":
    try:
        check_launcher_env()
        check_command_line(sys.argv[1:])
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    os.environ.setdefault(STARTED_ENV, repr(time.time()))
    main()
