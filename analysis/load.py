"""Read finished runs from outputs/ into pandas. analysis/ only reads outputs/, never runs models."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


def reports(root: str | Path) -> list[dict]:
    """Every finished run (a folder with report.json) under root, with its folder as `run`."""
    out = []
    for path in sorted(Path(root).rglob("report.json")):
        rep = json.loads(path.read_text())
        rep["run"] = str(path.parent.relative_to(root)) if path.parent != Path(root) else "."
        out.append(rep)
    return out


def runs_frame(root: str | Path) -> pd.DataFrame:
    """One row per finished evaluate run: method, budget, batch size, accuracy and selection summary."""
    rows = []
    for rep in reports(root):
        if rep["stage"] != "evaluate":
            continue
        mc = rep.get("method_config", {})
        rows.append({"run": rep["run"], "model": rep["model"], "method": rep["method"], "budget": rep["budget"],
                     "batch_size": rep["batch_size"], "reassign": mc.get("reassign"), "k0": mc.get("k0"),
                     "order": rep.get("eval", {}).get("order"),
                     "batch_seed": rep.get("eval", {}).get("batch_seed", rep.get("seed")), **rep.get("summary", {})})
    return pd.DataFrame(rows)


def metrics_frame(root: str | Path) -> pd.DataFrame:
    """One row per (run, task, metric) from each run's metrics.csv."""
    frames = []
    for rep in reports(root):
        csv = Path(root) / rep["run"] / "metrics.csv"
        if rep["stage"] == "evaluate" and csv.exists():
            df = pd.read_csv(csv)
            df.insert(0, "run", rep["run"])
            df.insert(1, "method", rep["method"])
            df.insert(2, "budget", rep["budget"])
            frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def throughput_frame(root: str | Path) -> pd.DataFrame:
    rows = []
    for rep in reports(root):
        for r in rep.get("throughput", []):
            rows.append({"run": rep["run"], "model": rep["model"], "routing": rep.get("routing", "uniform"), **r})
    return pd.DataFrame(rows)
