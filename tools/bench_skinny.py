"""Time kernels/skinny.py's launches against cuBLAS (F.linear) on a decode step's dense projections.

    python -m tools.bench_skinny --csv /tmp/skinny.csv      # on a CUDA machine, about a minute
    python -m tools.bench_skinny --smoke                    # CPU check of the harness

Shapes (Qwen3-30B-A3B's layer, bf16): the attention's output projection (N=2048, K=4096), its
fused q/k/v projection (N=5120, K=2048) and the router's GEMM (N=256 with the predictor's rows,
128 without; K=2048), at T = 1, 16 and 64 tokens. Each timing is a CUDA graph of
one call per weight set, S sets rotated so that L2 never holds the next call's weights (as the 48
layers of a step do not), replayed `--reps` times (tools/timing.time_graph: median per call).
Every candidate and cuBLAS run in `--rounds` interleaved rounds (order rotated each round); the
table gives the median over rounds, the range, GB/s of weights read, and each candidate's time over
cuBLAS's in the same round (median and range). cuBLAS's time includes its split-K reduce launch
where it splits; the graph's launch gaps are in both. A launch that needs more shared memory than
the GPU has, or whose product differs from F.linear's, is left out. `--install` writes, per shape and token bucket, the fastest launch and
whether it beat cuBLAS in every round ("use") into kernels/configs/<gpu>.json, where
kernels.skinny.skinny_launch reads it (the router's GEMM, and the attention's projections in the
compiled layer halves, base/runtime/regional.py).
"""
from __future__ import annotations

import argparse
import itertools
from functools import partial
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from triton.runtime.errors import OutOfResources

from analysis.kernel_ab import LAUNCH, medians, ratios
from kernels.skinny import SkinnyLaunch, skinny_linear
from kernels.tuned import token_bucket
from tools.timing import time_graph
from tools.tune_kernels import install as install_table

# (N, K); the router's GEMM (over [router; predictor] rows for base, the router alone for the other
# rules) runs on the kernel wherever its installed entry says "use" (base/method/backends.py)
SHAPES = {"o_proj": (2048, 4096), "qkv": (5120, 2048), "router+pred": (256, 2048), "router": (128, 2048)}
SMOKE_SHAPES = {"smoke": (48, 64)}
LAUNCH_COLUMNS = sorted(LAUNCH)  # SkinnyLaunch's fields, one column each
BLOCK_N = (16, 32)
BLOCK_K = (128, 256, 512)
STAGES = (3, 5)
# K in shares, summed by the last share (wider column blocks; each program reads only its share of x)
SPLITS = ((32, 256, 4, 2), (32, 256, 4, 4), (64, 128, 4, 2), (64, 128, 4, 4), (64, 128, 4, 8))  # (BN, BK, st, split)


def same_product(y, ref) -> bool:
    """A launch's product against F.linear in fp32, to the tolerance of the output dtype's rounding."""
    return bool(torch.allclose(y.float(), ref, rtol=2e-2, atol=2e-2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", default=None)
    ap.add_argument("--ts", default="1,16,64")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sets", type=int, default=8, help="weight sets rotated in a graph")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--install", action="store_true", help="write the chosen launches into kernels/configs/<gpu>.json")
    args = ap.parse_args()
    if args.rounds < 5 and not args.smoke:
        ap.error(f"--rounds must be >= 5, got {args.rounds}")
    if args.sets < 1:
        ap.error(f"--sets must be >= 1, got {args.sets}")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    smoke = args.smoke or dev.type != "cuda"
    if args.install and smoke:  # before any timing: smoke shapes, or a CPU's timings, tune no GPU's launches
        ap.error("--install writes this GPU's table from the real shapes: not with --smoke or without a CUDA device")
    shapes = SMOKE_SHAPES if smoke else SHAPES
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    launches = ([SkinnyLaunch(block_n=16, block_k=32, num_stages=2),
                 SkinnyLaunch(block_n=16, block_k=16, num_stages=1, split=2)] if smoke else
                [SkinnyLaunch(block_n=bn, block_k=bk, num_stages=st)
                 for bn, bk, st in itertools.product(BLOCK_N, BLOCK_K, STAGES)]
                + [SkinnyLaunch(block_n=bn, block_k=bk, num_stages=st, split=sp) for bn, bk, st, sp in SPLITS])
    ts = [int(t) for t in args.ts.split(",")]
    g = torch.Generator(device="cpu").manual_seed(0)
    work = []  # (labels, calls)
    for (name, (N, K)), T in itertools.product(shapes.items(), ts):
        x = torch.randn(T, K, generator=g).to(dev, dtype)
        ws = [(torch.randn(N, K, generator=g) / K**0.5).to(dev, dtype) for _ in range(args.sets)]
        base = {"shape": name, "N": N, "K": K, "T": T, "MB": N * K * ws[0].element_size() / 1e6}
        work.append(({**base, "impl": "cublas"}, [partial(F.linear, x, w) for w in ws]))
        ref = F.linear(x.float(), ws[0].float())
        for la in launches:
            try:  # compile (and size) it now: a launch over the GPU's shared memory is left out
                y = skinny_linear(x, ws[0], la, fit=False)
            except OutOfResources:
                print(f"left out: {name} T={T} {la} (shared memory)", flush=True)
                continue
            if not same_product(y, ref):  # checked on this GPU, so no launch that --install writes is unchecked
                print(f"left out: {name} T={T} {la} (its product differs from F.linear's)", flush=True)
                continue
            work.append(({**base, "impl": f"skinny BN={la.block_n} BK={la.block_k} st={la.num_stages} split={la.split}",
                          **{c: getattr(la, c) for c in LAUNCH_COLUMNS}}, [partial(skinny_linear, x, w, la, fit=False) for w in ws]))
    rows = []
    for r in range(args.rounds):
        shift = r % len(work)
        for labels, calls in work[shift:] + work[:shift]:
            us, how = time_graph(calls, args.reps, dev)
            rows.append({**labels, "round": r, "us": round(us, 3), "timing": how})
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    t = pd.DataFrame(rows)
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        t.to_csv(args.csv, index=False)
    # one definition of the medians and the per-round ratios: analysis/kernel_ab.py
    keys = ["shape", "N", "K", "T", "impl"]
    s = medians(t).rename(columns={"median": "us"}).merge(
        ratios(t, "cublas").rename(columns={"median": "over_cublas", "lo": "over_lo", "hi": "over_hi"}), how="left")
    s = s.merge(t.groupby(keys, sort=False)[["MB", *LAUNCH_COLUMNS]].first().reset_index(), on=keys)
    s["GB/s"] = (s["MB"] * 1e3 / s["us"]).round(0)
    pd.set_option("display.width", 200)
    for _, part in s.groupby(["shape", "T"], sort=False):
        print(part.drop(columns=LAUNCH_COLUMNS).sort_values("us").head(6).round(3).to_string(index=False))
    print(f"us per call: median [min, max] over {args.rounds} interleaved rounds; over_cublas per round")
    if args.install:
        table = {}
        for (N, K, T), part in s.groupby(["N", "K", "T"]):
            sk = part[part.impl != "cublas"]
            if sk.empty:
                continue
            best = sk.loc[sk["us"].idxmin()]
            table[f"skinny:N={N},K={K},T={token_bucket(int(T))}"] = {
                **{c: int(best[c]) for c in LAUNCH_COLUMNS}, "us": float(best.us),
                "cublas_us": float(part[part.impl == "cublas"]["us"].iloc[0]),
                "use": bool(best.over_hi < 1.0)}  # faster than cuBLAS in every round
        print("installed:", install_table(table, dev), table, flush=True)

if __name__ == "__main__":
    main()
