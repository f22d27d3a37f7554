"""README tables from a kernel benchmark JSON (written by `python -m tools.bench_kernels` on a GPU).

    python -m analysis.kernel_table benchmarks/kernels/NVIDIA_H200.json
"""
from __future__ import annotations

import json
import sys

import pandas as pd


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


if __name__ == "__main__":
    bench = json.load(open(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/kernels/NVIDIA_H200.json"))
    print(f"copy bandwidth {bench['copy_GBps']:.0f} GB/s; {bench['device']}, torch {bench['torch']}, "
          f"triton {bench['triton']}, transformers {bench['transformers']}\n")
    print(experts_table(bench).to_markdown(index=False))
    print()
    print(select_table(bench).to_markdown(index=False))
