"""Experiment logging: wandb (offline by default, no account needed; `wandb sync` uploads later),
or nothing with logger=none. One wandb run per run folder, finished at its end."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from base.config import LoggerConfig


class Logger:
    def __init__(self, cfg: LoggerConfig, out_dir: Path, run_name: str, config: dict[str, Any]) -> None:
        self.run = None
        if cfg.name == "none":
            return
        import wandb

        self.run = wandb.init(project=cfg.project, name=run_name, dir=str(out_dir), mode=cfg.mode,
                              config=config, reinit="finish_previous")

    def metrics(self, values: dict[str, float]) -> None:
        if self.run is not None:
            self.run.log(values)

    def table(self, name: str, rows: list[dict[str, Any]]) -> None:
        if self.run is not None and rows:
            import wandb

            self.run.log({name: wandb.Table(dataframe=pd.DataFrame(rows))})

    def lm_eval(self, raw: dict[str, Any]) -> None:
        """lm-eval's own WandbLogger where it fits (per-task result tables)."""
        if self.run is None or not raw.get("results"):
            return
        try:
            from lm_eval.loggers import WandbLogger

            wl = WandbLogger()  # attaches to the active run
            wl.post_init(raw)
            wl.log_eval_result()
        except Exception as err:  # logging must never fail a finished evaluation
            print(f"[logger] lm-eval WandbLogger skipped: {err}")

    def finish(self, ok: bool = True) -> None:
        """End the wandb run; a run that raised is finished with exit code 1 (shown as failed)."""
        if self.run is not None:
            self.run.finish(exit_code=0 if ok else 1)
            self.run = None
