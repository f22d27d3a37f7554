"""The sweep summary: one row per run of a sweep folder, its latest status and error line.

    record_job(sweep_dir, "budget=4,method=base", status="started", job=0, ...)
    read_summary(sweep_dir)          # -> list of row dicts, in the order runs first appeared

Every job writes its own row, under a lock and atomically, whatever launcher ran it (the basic
one, joblib workers, SLURM or Ray jobs on other hosts sharing the folder), so the file is right
even when the launcher's parent process dies. Status: started (still running, or killed: a rerun
of the sweep redoes it), finished, skipped (finished before with the same config), failed (with
`error`, the exception's type and first line), interrupted (Ctrl-C or a termination signal). Two
sweeps of one experiment at once share the file: a run one of them finished stays `finished`
when the other then finds it done (`skipped` never replaces `finished`). A finished or skipped
run's row carries its headline numbers (base/run/report.py headline): accuracy, kept_mean and
union_mean of an evaluation, tokens_per_s (with kept and union) of a throughput run.
"""
from __future__ import annotations

import csv
import io
import os
import socket
from pathlib import Path
from typing import Any

from base.files import atomic_write_text, file_lock
from base.run.report import HEADLINE

SUMMARY = "sweep_summary.csv"
COLUMNS = ("run", "status", "error", "job", "overrides", "config_hash", "host", "pid", "gpu", "launcher",
           "started", "ended", "wall_s", *HEADLINE)
STATUSES = ("started", "finished", "skipped", "failed", "interrupted")


def error_line(err: BaseException) -> str:
    """`Type: first line of the message` (a summary row stays one line)."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def read_summary(sweep_dir: Path) -> list[dict[str, str]]:
    path = sweep_dir / SUMMARY
    if not path.exists():
        return []
    return list(csv.DictReader(io.StringIO(path.read_text())))


def record_job(sweep_dir: Path, run: str, **fields: Any) -> None:
    """Create or update the row of `run` with `fields` (columns of COLUMNS)."""
    unknown = set(fields) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown sweep summary columns {sorted(unknown)}; valid: {', '.join(COLUMNS)}")
    if fields.get("status") not in (None, *STATUSES):
        raise ValueError(f"status={fields['status']!r}; valid: {', '.join(STATUSES)}")
    with file_lock(sweep_dir, ".sweep_summary.lock"):
        rows = {r["run"]: r for r in read_summary(sweep_dir)}
        row = rows.setdefault(run, {"run": run})
        if fields.get("status") == "skipped" and row.get("status") == "finished":
            return  # another sweep finished it while this one waited: its row stays
        if fields.get("status") == "started":  # a new attempt: the last one's outcome no longer holds
            for key in ("error", "ended", "wall_s", *HEADLINE):
                row.pop(key, None)
        row.update({k: "" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v) for k, v in fields.items()})
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=COLUMNS, restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows.values())
        atomic_write_text(sweep_dir / SUMMARY, out.getvalue())


def host_info() -> dict[str, str | int | None]:
    """Where a run ran: host, process, the GPUs it could see, the SLURM job (for cluster runs)."""
    return {"hostname": socket.gethostname(), "pid": os.getpid(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID")}
