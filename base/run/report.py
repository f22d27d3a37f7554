"""Human-readable summary of a finished run, printed at its end and kept at the end of its run.log;
and its headline numbers, one row of a sweep's summary (base/run/sweep.py)."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

HEADLINE = ("accuracy", "kept_mean", "union_mean", "tokens_per_s")


def report_text(report: dict[str, Any], out_dir: Path) -> str:
    """The summary print_report prints (a run's stage, its tables and its summary line)."""
    import pandas as pd  # here: run.py refuses a bad command line before pandas loads

    rule = "" if report["stage"] in ("describe", "calibrate") else f" method={report['method']} budget={report['budget']}"
    lines = [f"[{report['stage']}] model={report['model']}{rule} -> {out_dir}"]
    if "describe" in report:
        for k, v in report["describe"].items():
            if k != "memory":
                lines.append(f"  {k:>26}: {v:,}" if isinstance(v, int) else f"  {k:>26}: {v}")
        mem = report["describe"].get("memory")
        if mem:
            lines.append(f"  memory: weights {mem['weights_gb']:.1f} GB + KV cache of {mem['cache_len']} tokens per "
                         f"sequence (throughput.prompt_len + gen_tokens, at each of throughput.batch_sizes and "
                         f"batch_size); GPUs of {mem['gpu_gb']:g} GB (describe.gpu_gb), {mem['usable_share']:.0%} usable:")
            lines.append(pd.DataFrame(mem["by_batch"]).round(2).to_string(index=False))
    if "metrics" in report:
        df = pd.DataFrame(report["metrics"])
        if not df.empty:
            lines.append(df[["task", "metric", "value"]].to_string(index=False))
    if report.get("selection"):
        lines.append(pd.DataFrame(report["selection"]).round(3).to_string(index=False))
    if "throughput" in report:
        lines.append(pd.DataFrame(report["throughput"]).round(2).to_string(index=False))
    if "predictor" in report:
        lines.append(f"  held-out R^2 per layer: {[round(r, 3) for r in report['predictor']['r2']]}")
    for w in report.get("predictor", {}).get("warnings", []) + report.get("artifacts", {}).get("predictor_warnings", []):
        lines.append(f"  WARNING predictor fit: {w}")
    if "summary" in report:
        lines.append("  summary: " + ", ".join(f"{k}={v:.4g}" for k, v in report["summary"].items()
                                               if isinstance(v, (int, float))))
    if (report.get("wandb") or {}).get("sync"):  # logged offline (base/run/logger.py offline_sync)
        w = report["wandb"]
        lines.append(f"  wandb: logged offline to {w['dir']}: upload it with `{w['sync']}` (every offline run "
                     f"there: `{w['all']}`)")
    return "\n".join(lines) + "\n"


def print_report(report: dict[str, Any], out_dir: Path) -> None:
    print("\n" + report_text(report, out_dir), end="")


def headline(report: dict[str, Any]) -> dict[str, float | None]:
    """A run's headline numbers: an evaluation's summary accuracy and its mean kept and union experts
    (per MoE layer and decode step); a throughput run's tokens/s, kept and union experts of its
    first budgeted variant (else dense) at its largest batch size (throughput.mode=steps: a CUDA-graph
    row where there is one; stream: the stream's tokens/s; serve: the median over repeats of the burst
    stream's output tokens/s). None where the run has no such number."""
    summary = report.get("summary") or {}
    out = {k: summary.get(k) for k in HEADLINE}
    rows = report.get("throughput") or report.get("stream")
    if rows:
        rows = [r for r in rows if r.get("mode") == "graph"] or rows
        size = "batch_size" if "batch_size" in rows[0] else "slots"
        row = _first_budgeted([r for r in rows if r[size] == max(r[size] for r in rows)])
        out.update({k: row.get(k) for k in ("tokens_per_s", "kept_mean", "union_mean")})
    streams = [s for s in report.get("serve") or [] if s.get("rate") is None and s.get("arrivals") == "burst"]
    if streams:
        top = max(s["slots"] for s in streams)
        first = _first_budgeted([s for s in streams if s["slots"] == top])
        same = [s["output_throughput"] for s in streams if s["slots"] == top and s["variant"] == first["variant"]
                and s["budget"] == first["budget"]]
        out["tokens_per_s"] = statistics.median(same)
    return {k: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None for k, v in out.items()}


def _first_budgeted(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return next((r for r in rows if r.get("budget") is not None), rows[0])
