"""Issue 42's decode-step targets against what a throughput grid measured: one table, from the runs.

    python -m analysis.targets results/roofline/<grid>/runs [more run folders] \
        --gpu-tests results/gpu_tests/<log>.xml > results/roofline/<grid>/targets.md

Reads the throughput runs under a folder (each run's report.json: its graph-timed rows, its eager
profile by kernel class, the expert size and copy bandwidth it recorded) as analysis/throughput.py
does, and optionally a `make gpu-test` JUnit XML. Every target is on the Qwen3-30B-A3B shape
(`qwen3_30b`); a target whose configuration the runs lack says "not measured". The issue set the
millisecond targets for an H200: on another GPU they are shown and marked "other GPU". Ratios are
same-run ratios (each run times dense and the selectors in one process, interleaved); where
several runs timed one configuration, the median over them, which must share a commit and a GPU
(runs of two commits or GPUs for one configuration are refused, naming them).
Reads outputs/ and results/ only.
"""
from __future__ import annotations

import argparse
import json
import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.engines import one_engine
from analysis.throughput import collect, profile_rows

MODEL = "qwen3_30b"
TARGET_GPU = "H200"


@dataclass(frozen=True)
class Target:
    name: str
    bound: float
    upper: bool  # True: measured <= bound; False: measured >= bound
    unit: str
    absolute: bool = False  # milliseconds: compare only on the GPU the target was set for


TARGETS = {
    "base_ms": Target("base M=16 step, batch 16, uniform (stretch 3.6 ms)", 4.2, True, "ms", absolute=True),
    "base_x": Target("base M=16 over dense, batch 16, uniform (stretch 3.3×)", 2.9, False, "×"),
    "skewed_x": Target("base M=16 over dense, batch 16, skewed routing", 1.9, False, "×"),
    "b64_x": Target("base M=16 over dense, batch 64, uniform", 3.2, False, "×"),
    "dense_ms": Target("dense step, batch 16, uniform", 11.5, True, "ms", absolute=True),
    "kernels": Target("kernels per decoder layer (base M=16, batch 16, eager profile)", 9, True, ""),
    "router_ms": Target("router + selection per step (base M=16, batch 16, eager kernel time)", 0.35, True, "ms",
                        absolute=True),
    "ffn_copy": Target("expert FFN's bandwidth over copy bandwidth (base M=16, batch 16)", 0.80, False, ""),
    **{f"near_{v}": Target(f"`{v}` M=16 step over base's, batch 16 (within 3 %)", 1.03, True, "")
       for v in ("oea(k0=1)", "base_anchor(k0=1)", "router_sq")},
}


def _graph_rows(df: pd.DataFrame, routing: str, batch: int, variant: str) -> pd.DataFrame:
    """The graph-timed rows of one configuration (one per run that timed it)."""
    sel = df[(df["model"] == MODEL) & (df["routing"] == routing) & (df["batch_size"] == batch)
             & (df["mode"] == "graph") & (df["variant"] == variant)]
    if variant != "dense" and not variant.startswith("oea"):
        sel = sel[sel["budget"] == 16]
    return sel


def _profile(prof: pd.DataFrame, cls: str, col: str) -> float | None:
    if prof.empty:
        return None
    sel = prof[(prof["model"] == MODEL) & (prof["routing"] == "uniform") & (prof["batch_size"] == 16)
               & (prof["variant"] == "base") & (prof["class"] == cls)]
    vals = sel[col].dropna() if col in sel else pd.Series(dtype=float)
    return float(vals.median()) if len(vals) else None


def measured(df: pd.DataFrame, prof: pd.DataFrame) -> dict[str, float | None]:
    """Each target's measured value (None: the runs lack its configuration)."""
    def at(routing: str, batch: int, variant: str, col: str) -> float | None:
        """The median over the runs that timed the configuration (several runs of one grid can)."""
        vals = _graph_rows(df, routing, batch, variant)[col].dropna()
        return float(vals.median()) if len(vals) else None

    base_ms = at("uniform", 16, "base", "ms_per_step")
    out = {
        "base_ms": base_ms, "base_x": at("uniform", 16, "base", "speedup_vs_dense"),
        "skewed_x": at("skewed", 16, "base", "speedup_vs_dense"), "b64_x": at("uniform", 64, "base", "speedup_vs_dense"),
        "dense_ms": at("uniform", 16, "dense", "ms_per_step"),
        "kernels": _profile(prof, "total", "kernels_per_layer"),
        "router_ms": _profile(prof, "router/selection", "ms_per_step"),
        "ffn_copy": _profile(prof, "expert FFN", "expert_of_copy"),
    }
    for v in ("oea(k0=1)", "base_anchor(k0=1)", "router_sq"):
        ms = at("uniform", 16, v, "ms_per_step")
        out[f"near_{v}"] = None if ms is None or base_ms is None else ms / base_ms
    return out


def gpu_tests(xml: Path) -> tuple[int, int, int]:
    """(passed, failed or errored, skipped) of a JUnit XML."""
    root = ET.parse(xml).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = sum(int(s.get("tests", 0)) for s in suites)
    bad = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return total - bad - skipped, bad, skipped


def table(df: pd.DataFrame, prof: pd.DataFrame, gpu: str, xml: Path | None) -> pd.DataFrame:
    rows = []
    values = measured(df, prof)
    for key, t in TARGETS.items():
        v = values[key]
        bound = f"{'≤' if t.upper else '≥'} {t.bound:g}{' ' + t.unit if t.unit in ('ms',) else t.unit}"
        if v is None or math.isnan(v):
            rows.append({"target": t.name, "bound": bound, "measured": "not measured", "met": "—"})
            continue
        met = v <= t.bound if t.upper else v >= t.bound
        verdict = "yes" if met else "no"
        if t.absolute and TARGET_GPU not in gpu:
            verdict = f"{verdict} (other GPU: set for an {TARGET_GPU})"
        shown = f"{v:.2f}{' ms' if t.unit == 'ms' else t.unit}" if key != "kernels" else f"{v:.2f}"
        rows.append({"target": t.name, "bound": bound, "measured": shown, "met": verdict})
    if xml is not None:
        passed, bad, skipped = gpu_tests(xml)
        rows.append({"target": f"every GPU test passes ({xml.name})", "bound": "0 failed",
                     "measured": f"{passed} passed, {bad} failed, {skipped} skipped",
                     "met": "yes" if bad == 0 and passed > 0 else "no"})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path, nargs="+",
                    help="folders of throughput run folders (each with report.json); one engine among them")
    ap.add_argument("--gpu-tests", type=Path, default=None, help="a `make gpu-test` JUnit XML")
    args = ap.parse_args(argv)
    for runs in args.runs:
        if not runs.is_dir():
            raise SystemExit(f"error: {runs} is not a folder of throughput runs")
    if args.gpu_tests is not None and not args.gpu_tests.is_file():
        raise SystemExit(f"error: {args.gpu_tests} is not a file (a JUnit XML from `make gpu-test`)")
    mixed = mixed_cells(args.runs)
    if mixed:
        raise SystemExit(f"error: runs of different commits or GPUs time one configuration ({'; '.join(mixed)}): "
                         "a target's median would pool them; pass runs of one commit and GPU per configuration")
    df = pd.concat([collect(runs, one_run_per_cell=False) for runs in args.runs], ignore_index=True)
    one_engine(df, "the targets table")
    prof = pd.concat([profile_rows(runs) for runs in args.runs], ignore_index=True)
    gpus = sorted(set(df["gpu"].astype(str)))
    where = ", ".join(f"`{runs}`" for runs in args.runs)
    commits = sorted({c for runs in args.runs for c in _commits(runs)})
    print(f"Issue 42's targets (Qwen3-30B-A3B shape) against the runs under {where}: GPU {', '.join(gpus)}; "
          f"engine `{df['engine'].iloc[0]}`; commits {', '.join(commits)}. "
          "Made by `python -m analysis.targets` (analysis/targets.py).\n")
    print(table(df, prof, " ".join(gpus), args.gpu_tests).to_markdown(index=False))


def mixed_cells(folders: list[Path]) -> list[str]:
    """Each (routing, batch size) of the model that runs of more than one (commit, GPU) timed: their
    median would mix two engines' code or two machines (several runs of one commit on one GPU are
    the median the module doc describes)."""
    seen: dict[tuple[str, int], set[tuple[str, str]]] = {}
    for runs in folders:
        for path in sorted(runs.glob("*/report.json")):
            report = json.loads(path.read_text())
            if report.get("model") != MODEL:
                continue
            who = (str((report.get("provenance") or {}).get("commit", "unknown")), str(report.get("gpu", "unknown")))
            for batch in {int(r["batch_size"]) for r in report.get("throughput", [])}:
                seen.setdefault((str(report.get("routing")), batch), set()).add(who)
    return [f"{routing} batch {batch}: " + ", ".join(f"{c} on {g}" for c, g in sorted(who))
            for (routing, batch), who in sorted(seen.items()) if len(who) > 1]


def _commits(runs: Path) -> list[str]:
    return [str((json.loads(p.read_text()).get("provenance") or {}).get("commit", "unknown"))
            for p in sorted(runs.glob("*/report.json"))]


if __name__ == "__main__":
    main()
