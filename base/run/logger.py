"""Experiment logging: wandb (offline by default, no account needed), or nothing with logger=none.
One wandb run per run folder, finished at its end, grouped by experiment (exp_name), tagged with
its axes (model, method, budget, stage) and named by them. Offline runs of every experiment collect
in one folder, logger.dir (outputs/wandb by default; wandb keeps each run one folder deeper, in
<logger.dir>/wandb/offline-run-*), so one command uploads them all (wandb 0.2x/0.3x: `--sync-all`
is gone; a folder of runs syncs those not synced yet, without asking):

    wandb sync outputs/wandb/wandb             # one run: wandb sync outputs/wandb/wandb/offline-run-<time>-<id>

A run that logged offline names its own command at its end (its report's `wandb`; where_logged for
other commands that log).

A run that finished without wandb (logger=none, or before an account existed) is logged afterwards
from its folder, without running it again: `python -m base.run.log_run outputs/<exp>/<run> ...`.
The per-layer selection statistics (evaluate) and the timings (throughput) go in as tables and as
line charts. wandb is imported only when a run logs to it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from base.config import LoggerConfig

AXES = ("model", "method", "budget", "exp_name")  # in a run's name and tags already


@dataclass(frozen=True)
class RunIdentity:
    """How a run shows in wandb."""
    name: str  # e.g. "qwen3_30b base M=16 [batch_size=32]"
    group: str  # the experiment: every run of a sweep in one group
    tags: tuple[str, ...]  # model:<m>, method:<m>, budget:<M|dense>, stage:<s>


def run_identity(experiment: str, model: str, method: str, budget: int | None, stage: str,
                 overrides: str = "") -> RunIdentity:
    """Readable and distinct within a sweep: the axes, then the other overrides that tell its runs apart."""
    rest = [o for o in split_overrides(overrides) if o.split("=", 1)[0].lstrip("+~") not in AXES]
    name = " ".join([model, method, *([f"M={budget}"] if budget is not None else []),
                     *([stage] if stage != "evaluate" else []), *([f"[{','.join(rest)}]"] if rest else [])])
    tags = (f"model:{model}", f"method:{method}", f"budget:{'dense' if budget is None else budget}", f"stage:{stage}")
    return RunIdentity(name=name, group=experiment, tags=tags)


def split_overrides(overrides: str) -> list[str]:
    """Hydra's comma-joined overrides, split at the commas outside brackets (list values stay whole)."""
    out, depth, cur = [], 0, ""
    for ch in overrides:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [o for o in [*out, cur] if o]


class Logger:
    def __init__(self, cfg: LoggerConfig, identity: RunIdentity, config: dict[str, Any]) -> None:
        self.run = None
        if cfg.name == "none":
            return
        import wandb

        directory = Path(cfg.dir)
        directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=cfg.project, name=identity.name, group=identity.group, tags=list(identity.tags),
                              dir=str(directory), mode=cfg.mode, config=config, reinit="finish_previous")

    def metrics(self, values: dict[str, float]) -> None:
        if self.run is not None:
            self.run.log(values)

    def table(self, name: str, rows: list[dict[str, Any]]) -> None:
        """The rows as a wandb table; `selection` and `throughput` also as charts (PLOTS)."""
        if self.run is not None and rows:
            import wandb

            self.run.log({name: wandb.Table(dataframe=pd.DataFrame(rows))})
            if name in PLOTS:
                try:
                    self.run.log(PLOTS[name](rows))
                except Exception as err:  # noqa: BLE001  (a chart must never fail a finished run)
                    print(f"[logger] {name} charts skipped: {err}")

    def lm_eval(self, raw: dict[str, Any]) -> None:
        """lm-eval's own WandbLogger where it fits (per-task result tables)."""
        if self.run is None or not raw.get("results"):
            return
        try:
            from lm_eval.loggers import WandbLogger

            wl = WandbLogger()  # attaches to the active run
            wl.post_init(raw)
            wl.log_eval_result()
        except Exception as err:  # noqa: BLE001  (logging must never fail a finished evaluation)
            print(f"[logger] lm-eval WandbLogger skipped: {err}")

    def offline(self) -> dict[str, str] | None:
        """An offline run's folder and the command that uploads it (None: online, or no run)."""
        return offline_sync(self.run)

    def finish(self, ok: bool = True) -> None:
        """End the wandb run; a run that raised is finished with exit code 1 (shown as failed)."""
        if self.run is not None:
            self.run.finish(exit_code=0 if ok else 1)
            self.run = None


def offline_sync(run) -> dict[str, str] | None:
    """{"dir": the offline wandb run's folder, "sync": the command that uploads it, "all": the one
    that uploads every offline run beside it}; None for an online or disabled run."""
    if run is None or not getattr(run, "offline", False):
        return None
    folder = Path(run.settings.sync_dir)
    shown = os.path.relpath(folder) if not os.path.relpath(folder).startswith("..") else str(folder)
    return {"dir": shown, "sync": f"wandb sync {shown}", "all": f"wandb sync {Path(shown).parent}"}


def where_logged(run) -> str | None:
    """One line for the end of a command that logged `run` (a finished wandb run): offline, its folder
    and the `wandb sync` command that uploads it; online, its page; None when nothing was logged.

        print(where_logged(run))   # e.g. analysis/report.py log_wandb, after run.finish()
    """
    done = offline_sync(run)
    if done is not None:
        return (f"[wandb] logged offline to {done['dir']}: upload it with `{done['sync']}` "
                f"(every offline run there: `{done['all']}`)")
    url = getattr(run, "url", None) if run is not None and not getattr(run, "disabled", False) else None
    return f"[wandb] logged online: {url}" if url else None


def selection_plots(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """selection.csv's rows (one per MoE layer) as line charts against the layer: expert counts
    (union before selection, kept, executed) and the retained shares (weight, energy, output error)."""
    import wandb

    df = pd.DataFrame(rows).sort_values("layer")
    layers = df["layer"].tolist()
    charts = {}
    for key, cols, title in (
            ("selection/experts", ("union_mean", "kept_mean", "executed_mean"),
             "distinct experts per layer (mean over decode steps)"),
            ("selection/retained", ("weight_retained", "energy_retained", "out_error", "tokens_lost_frac"),
             "share per layer: routing weight and energy retained, output error, tokens that lost an expert")):
        have = [c for c in cols if c in df and df[c].notna().any()]
        if have:
            charts[key] = wandb.plot.line_series(xs=layers, ys=[df[c].tolist() for c in have], keys=have,
                                                 title=title, xname="MoE layer")
    return charts


def throughput_plots(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """throughput.csv's CUDA-graph rows (eager where a run has none) as line charts against batch
    size, one line per variant and budget: tokens/s and speed-up over dense."""
    import wandb

    df = pd.DataFrame(rows)
    df = df[df["mode"] == "graph"] if (df["mode"] == "graph").any() else df
    label = [v if pd.isna(b) else f"{v}@{int(b)}" for v, b in zip(df["variant"], df["budget"])]
    groups = list(df.assign(label=label).sort_values("batch_size").groupby("label", sort=True))
    charts = {}
    for col, title in (("tokens_per_s", "decode tokens/s"), ("speedup_vs_dense", "speed-up over dense")):
        if col in df and df[col].notna().any():
            charts[f"throughput/{col}"] = wandb.plot.line_series(
                xs=[g["batch_size"].tolist() for _, g in groups], ys=[g[col].tolist() for _, g in groups],
                keys=[k for k, _ in groups], title=f"{title} vs batch size", xname="batch size")
    return charts


PLOTS = {"selection": selection_plots, "throughput": throughput_plots}
