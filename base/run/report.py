"""Human-readable summary of a finished run, printed at its end."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd


def print_report(report: dict[str, Any], out_dir: Path) -> None:
    head = f"[{report['stage']}] model={report['model']} method={report['method']} budget={report['budget']}"
    print(f"\n{head} -> {out_dir}")
    if "describe" in report:
        for k, v in report["describe"].items():
            if k != "memory":
                print(f"  {k:>26}: {v:,}" if isinstance(v, int) else f"  {k:>26}: {v}")
        mem = report["describe"].get("memory")
        if mem:
            print(f"  memory: weights {mem['weights_gb']:.1f} GB + KV cache of {mem['cache_len']} tokens per sequence; "
                  f"GPUs of {mem['gpu_gb']:g} GB, {mem['usable_share']:.0%} usable:")
            print(pd.DataFrame(mem["by_batch"]).round(2).to_string(index=False))
    if "metrics" in report:
        df = pd.DataFrame(report["metrics"])
        if not df.empty:
            print(df[["task", "metric", "value"]].to_string(index=False))
    if report.get("selection"):
        df = pd.DataFrame(report["selection"])
        print(df.round(3).to_string(index=False))
    if "throughput" in report:
        print(pd.DataFrame(report["throughput"]).round(2).to_string(index=False))
    if "predictor" in report:
        print(f"  held-out R^2 per layer: {[round(r, 3) for r in report['predictor']['r2']]}")
    for w in report.get("predictor", {}).get("warnings", []) + report.get("artifacts", {}).get("predictor_warnings", []):
        print(f"  WARNING predictor fit: {w}")
    if "summary" in report:
        print("  summary: " + ", ".join(f"{k}={v:.4g}" for k, v in report["summary"].items()))
