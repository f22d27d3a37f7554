"""README.md's headline table, generated from the newest committed results (one row each for
speed in static batches, speed when serving, quality, and scale), each with its command, its
engine and a link to the folder whose README reads it.

    python -m analysis.headline                    # print the table (analysis/claims.py writes it into README.md)
    python -m analysis.headline --demo outputs/demo   # the Quick start line from `make demo`'s runs

Sources (newest committed of each kind; change them here when a newer grid is committed):
  STATIC     the H200 decode-step grid (Qwen3-30B-A3B shape, random bf16 weights, uniform routing, batch 16
             and 64, CUDA graphs; one run at one commit)
  SERVE      the serving burst (64 requests, 16 slots) and SUSTAINED the request-rate search at the SLOs
  QUALITY    the pre-registered replication's primary family (results/replication_paired.csv)
  SCALE      the largest model run: gpt-oss-120b over two H200s (results/multi_gpu/)
Reads results/ only.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis import replication_files

ROOT = Path(__file__).resolve().parents[1]
STATIC = "results/roofline/grid_2026-12-06l/throughput_qwen3.csv"
SERVE = "results/serve/grid_2026-12-04b/summary.csv"
SUSTAINED = "results/serve/grid_2026-12-02d/summary_sustained.csv"
QUALITY = replication_files.PAIRED
QUALITY_RUNS = replication_files.TABLE
SCALE = "results/multi_gpu/describe.json"


def _static(root: Path) -> str:
    t = pd.read_csv(root / STATIC)
    t = t[(t["mode"] == "graph") & (t["routing"] == "uniform")]

    def row(batch: int, variant: str, budget: float | None = None) -> pd.Series:
        g = t[(t["batch_size"] == batch) & (t["variant"] == variant)]
        g = g[g["budget"].isna()] if budget is None else g[g["budget"] == budget]
        (i,) = g.index
        return g.loc[i]

    def rounds(batch: int) -> tuple[float, float, int]:
        """dense over base per interleaved round (ms_runs: one value per round, same order)."""
        d, b = (np.array([float(x) for x in str(r["ms_runs"]).split(";")])
                for r in (row(batch, "dense"), row(batch, "base", 16.0)))
        ratio = d / b
        return float(ratio.min()), float(ratio.max()), len(ratio)

    dense, base = float(row(16, "dense")["ms_per_step"]), float(row(16, "base", 16.0)["ms_per_step"])
    b64 = float(row(64, "dense")["ms_per_step"]) / float(row(64, "base", 16.0)["ms_per_step"])
    lo, hi, n = rounds(16)
    return (f"base M=16 {base:.2f} ms per decode step against dense's {dense:.2f} ms: {dense / base:.2f}× "
            f"(per round {lo:.3f}–{hi:.3f}× over {n} interleaved rounds; {b64:.2f}× at batch 64)")


def _serve(root: Path) -> str:
    t = pd.read_csv(root / SERVE)
    burst = t[t["rate"].isna()].set_index("variant")
    s = pd.read_csv(root / SUSTAINED).set_index("variant")
    base, dense = burst.loc["base", "tok_s"], burst.loc["dense", "tok_s"]
    reps = int(burst.loc["base", "repeats"])
    return (f"64-request burst: base M=16 {base:,.0f} output tokens/s against dense's {dense:,.0f} "
            f"({base / dense:.2f}×; medians of {reps} repeats, base {burst.loc['base', 'tok_s_min']:,.1f}–"
            f"{burst.loc['base', 'tok_s_max']:,.1f}); at the SLOs it sustains {s.loc['base', 'over_dense']:.2f}× "
            f"dense's request rate ({int(s.loc['base', 'repeats'])} repeats)")


def _quality(root: Path) -> tuple[str, str]:
    p = pd.read_csv(root / QUALITY)
    prim = p[p["family"] == "primary"]
    n, models = int(prim["n"].iloc[0]), list(dict.fromkeys(prim["model"]))
    parts = []
    for rule, g in prim.groupby("method", sort=False):
        up, down = int((g["call"] == "higher").sum()), int((g["call"] == "lower").sum())
        parts.append(f"`{rule}` {up}↑ {down}↓")
    engine = ", ".join(dict.fromkeys(prim["engine"].astype(str))) if "engine" in prim else "unknown"
    text = (f"each rule against `base` at 3 budgets on {len(models)} models ({n:,} fresh prompts each; exact McNemar, "
            f"Holm over {len(prim)}): " + ", ".join(parts) + f" (of {len(prim) // len(set(prim['method']))} points)")
    return text, engine


def _scale(root: Path) -> str:
    import json

    d = json.loads((root / SCALE).read_text())
    describe = d.get("describe", d)
    gb = describe.get("memory", {}).get("weights_gb") if isinstance(describe.get("memory"), dict) else None
    weights = f", {gb:.1f} GB of bf16 weights" if gb else ""
    return (f"six transformers MoE families through one owned block; {describe.get('model', 'gpt_oss_120b')} "
            f"({describe.get('num_experts')} experts, top-{describe.get('top_k')}{weights}) over two H200s")


def rows(root: Path = ROOT) -> list[dict[str, str]]:
    quality, engine = _quality(root)
    return [
        {"what": "Speed, static batches (H200, Qwen3-30B-A3B shape, batch 16)", "result": _static(root),
         "engine": "`t1-cuda`", "reproduce": "`bash experiments/gpu/roofline.sh`",
         "read": "[results/roofline/](results/roofline/README.md)"},
        {"what": "Speed, serving (H200, Qwen3-30B-A3B shape, 16 slots)", "result": _serve(root), "engine": "`t1-cuda`",
         "reproduce": "`bash experiments/gpu/serve_grid.sh`", "read": "[results/serve/](results/serve/README.md)"},
        {"what": "Quality (the pre-registered replication, continuous batching, CPU)", "result": quality,
         "engine": f"`{engine}`", "reproduce": "`make replication`",
         "read": "[results/replication.md](results/replication.md)"},
        {"what": "Scale", "result": _scale(root), "engine": "eager, 2 GPUs",
         "reproduce": "`bash experiments/gpu/multi_gpu.sh`", "read": "[results/multi_gpu/](results/multi_gpu/README.md)"},
    ]


def table(root: Path = ROOT) -> str:
    out = ["| | result | engine | reproduce | read |", "| --- | --- | --- | --- | --- |"]
    out += [f"| {r['what']} | {r['result']} | {r['engine']} | {r['reproduce']} | {r['read']} |" for r in rows(root)]
    return "\n".join(out) + "\n"


def demo_line(demo_dir: Path) -> str:
    """The Quick start's sentence from `make demo`'s own runs (outputs/demo): dense and base's
    accuracy, the experts base keeps against the dense union, the requests decoding per step."""
    import json

    reports = {}
    for path in sorted(Path(demo_dir).rglob("report.json")):
        rep = json.loads(path.read_text())
        if rep.get("stage") == "evaluate":
            reports[rep["method"]] = rep
    if not {"dense", "base"} <= set(reports):
        raise SystemExit(f"error: {demo_dir} holds no dense and base evaluation: run `make demo` first")
    dense, base = reports["dense"]["summary"], reports["base"]["summary"]
    prompts = (reports["base"].get("files") or {}).get("samples.jsonl")
    tasks = ", ".join(f"`{t}`" for t in reports["base"]["eval"]["tasks"])
    return (f"dense accuracy {dense['accuracy']:.3f} and `base` at M={reports['base']['budget']} "
            f"{base['accuracy']:.3f} on {tasks}" + (f" ({prompts:,} prompts)" if prompts else "")
            + f"; `base` keeps {base['kept_mean']:.1f} experts per layer and decode step where the dense union is "
              f"{dense['union_mean']:.1f}, with {base['occupancy_mean']:.1f} requests decoding per step.\n")


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--demo"]:
        print(demo_line(Path(sys.argv[2])), end="")
    else:
        print(table())
