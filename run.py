"""The one entry point. Hydra is read here only: it builds a typed RunConfig and hands it down.

    python run.py model=qwen3_30b method=base budget=16
    python run.py -m method=dense,router_sum,count,base budget=4,8,16
    python run.py model=qwen3_30b model.init=random model.device=meta stage=describe logger=none

Each run writes outputs/<exp_name>/<run name from overrides>/ (config.yaml, report.json, CSVs).
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from base.config import (
    CalibConfig,
    ConfigError,
    EvalConfig,
    LoggerConfig,
    MethodConfig,
    ModelConfig,
    PredictorConfig,
    RunConfig,
    StatsConfig,
    TaskConfig,
    ThroughputConfig,
)

ROOT = Path(__file__).resolve().parent

MAX_RUN_NAME = 120  # file systems allow 255 bytes per name; leave room for Hydra's own suffixes


def run_name(overrides: str) -> str:
    """A run folder's name: its sorted overrides, "default" for none; a long one keeps a readable
    prefix and a hash of the whole (every override is in config.yaml and report.json)."""
    if not overrides:
        return "default"
    if len(overrides) <= MAX_RUN_NAME:
        return overrides
    digest = hashlib.sha1(overrides.encode()).hexdigest()[:10]
    return f"{overrides[: MAX_RUN_NAME - 12].rstrip(',')}-{digest}"


OmegaConf.register_new_resolver("run_name", run_name, replace=True)


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
    )


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> dict | None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        run_cfg = build_config(cfg, out_dir, ",".join(HydraConfig.get().overrides.task))
    except (ConfigError, TypeError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    from base.pipeline import run

    try:
        report = run(run_cfg, OmegaConf.to_yaml(cfg, resolve=True))
    except ConfigError as err:  # e.g. budget above the model's expert count
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    if report is not None:
        from base.report import print_report

        print_report(report, out_dir)
    return report


if __name__ == "__main__":
    main()
