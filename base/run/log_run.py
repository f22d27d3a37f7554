"""Log finished runs to wandb from their folders, without running them again.

    python -m base.run.log_run outputs/<exp>/<run> [more folders] [--mode online|offline] [--dir D]

For a run made with logger=none, or offline before an account existed and since deleted from the
sync folder. Each folder becomes one wandb run named, grouped and tagged as a live run would be
(base/run/logger.py), with the report's summary and the folder's tables (metrics, selection,
throughput, stream, predictor). Only finished folders (report.json) are accepted.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
import yaml

from base.config import ConfigError, LoggerConfig
from base.run.logger import Logger, run_identity
from base.run.outputs import REPORT

TABLES = {"metrics.csv": "metrics", "selection.csv": "selection", "throughput.csv": "throughput",
          "stream.csv": "stream", "predictor.csv": "predictor_r2"}  # as the pipeline names them


def log_folder(folder: Path, mode: str, directory: str | None = None) -> dict:
    """Log one finished run folder; returns what was logged (name, group, tags, tables)."""
    report_path, config_path = folder / REPORT, folder / "config.yaml"
    if not report_path.is_file() or not config_path.is_file():
        raise ConfigError(f"{folder} is not a finished run folder (it needs {REPORT} and config.yaml)")
    report = json.loads(report_path.read_text())
    config = yaml.safe_load(config_path.read_text())
    logger_cfg = config.get("logger") or {}
    cfg = LoggerConfig(name="wandb", mode=mode, project=logger_cfg.get("project", "base-moe"),
                       dir=directory or logger_cfg.get("dir") or "outputs/wandb")
    identity = run_identity(config.get("exp_name", "default"), report["model"], report["method"], report["budget"],
                            report["stage"], report.get("overrides", ""))
    logger = Logger(cfg, identity, config)
    tables = []
    ok = False
    try:
        logger.metrics({k: v for k, v in report.get("summary", {}).items() if isinstance(v, (int, float))})
        for file, name in TABLES.items():
            if (folder / file).is_file():
                rows = pd.read_csv(folder / file).to_dict("records")
                logger.table(name, rows)
                tables.append(name)
        ok = True
        offline = logger.offline()
    finally:
        logger.finish(ok)
    return {"name": identity.name, "group": identity.group, "tags": list(identity.tags), "tables": tables,
            "dir": cfg.dir, "mode": mode, "sync": offline["sync"] if offline else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", type=Path, help="finished run folders (outputs/<exp>/<run>)")
    ap.add_argument("--mode", default="offline", choices=("offline", "online"),
                    help="online uploads now (needs `wandb login`); offline writes for `wandb sync` (default)")
    ap.add_argument("--dir", default=None, help="wandb's folder (default: the run's logger.dir, outputs/wandb)")
    args = ap.parse_args(argv)
    try:  # every folder checked before anything is logged
        for folder in args.folders:
            if not (folder / REPORT).is_file() or not (folder / "config.yaml").is_file():
                raise ConfigError(f"{folder} is not a finished run folder (it needs {REPORT} and config.yaml)")
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for folder in args.folders:
        done = log_folder(folder, args.mode, args.dir)
        print(f"[log_run] {folder} -> wandb run '{done['name']}' (group {done['group']}, {done['mode']}, "
              f"tables: {', '.join(done['tables']) or 'none'}) in {done['dir']}"
              + (f"; upload it with `{done['sync']}`" if done["sync"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
