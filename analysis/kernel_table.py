"""The tables of a kernel benchmark JSON (written by `python -m tools.bench_kernels` on a GPU): the
four-launch expert FFN's µs (and share of copy bandwidth) per (tokens, budget) beside grouped_mm's,
and the selection's extra µs a layer over the plain router.

    python -m analysis.kernel_table benchmarks/kernels/NVIDIA_H200.json [--out <prefix>]

Prints them; with --out, also writes <prefix>.md. A file that is not such a JSON is refused (exit 2).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from analysis.load import fail

KEYS = ("device", "copy_GBps", "experts", "select")


def experts_table(bench: dict, model: str = "qwen3_30b_a3b", routing: str = "random") -> pd.DataFrame:
    """us (fraction of copy bandwidth) of our expert FFN per (T, M), with grouped_mm's time."""
    df = pd.DataFrame(bench["experts"])
    df = df[(df["model"] == model) & (df["routing"] == routing)].copy()
    df["M"] = df["M"].astype(str)
    df["cell"] = df.apply(lambda r: f"{r.base_triton_us:.1f} ({100 * r.base_triton_frac:.0f}%)", axis=1)
    piv = df.pivot(index="T", columns="M", values="cell")[["8", "16", "32", "64", "dense"]]
    dense = df[df["M"] == "dense"].set_index("T")
    piv["union"] = dense["union"]
    piv["grouped_mm dense"] = dense["grouped_mm_us"].map("{:.1f}".format)
    piv["grouped_mm M=16"] = df[df["M"] == "16"].set_index("T")["grouped_mm_us"].map("{:.1f}".format)
    return piv.reset_index()


def select_table(bench: dict) -> pd.DataFrame:
    """Extra us per layer over the plain router (GEMM + softmax + top-k), M=16."""
    df = pd.DataFrame(bench["select"])
    cols = {"router_sum_extra_us": "select_reassign (router_sum)", "base_fused_extra_us": "select_reassign (base)",
            "route_rsum_extra_us": "route_select (router_sum)", "route_base_extra_us": "route_select (base)",
            "base_torch_extra_us": "PyTorch reference (base)"}
    return df[["model", "T", "plain_router_us", *cols]].rename(columns=cols).round(1)


def read(path: Path) -> dict:
    if not path.is_file():
        fail(f"{path}: no such file (a kernel benchmark JSON: `python -m tools.bench_kernels --out DIR` writes DIR/<gpu>.json)")
    try:
        bench = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        fail(f"{path}: not JSON ({e})")
    missing = [k for k in KEYS if not isinstance(bench, dict) or k not in bench]
    if missing:
        fail(f"{path}: not a kernel benchmark JSON (no {', '.join(missing)})")
    return bench


def text(bench: dict) -> str:
    return (f"copy bandwidth {bench['copy_GBps']:.0f} GB/s; {bench['device']}, torch {bench.get('torch')}, "
            f"triton {bench.get('triton')}, transformers {bench.get('transformers')}\n\n"
            f"{experts_table(bench).to_markdown(index=False)}\n\n{select_table(bench).to_markdown(index=False)}\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench", type=Path, help="the benchmark's <gpu>.json")
    ap.add_argument("--out", type=Path, default=None, help="also write <out>.md")
    args = ap.parse_args(argv)
    out = text(read(args.bench))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(f"Made by `python -m analysis.kernel_table {args.bench}` "
                                               f"(analysis/kernel_table.py).\n\n{out}")
    print(out)


if __name__ == "__main__":
    main()
