"""Kernel benchmark: GPU tests, copy bandwidth, tuning, expert FFN and selection timings.

    python -m tools.bench_kernels --out DIR            # on a CUDA machine; ~6 min on an H200
    python -m tools.bench_kernels --smoke --out DIR    # CPU: tiny shapes through the interpreter

Writes DIR/<gpu>.json (all numbers), DIR/configs_<gpu>.json (tuned launch configs, also
installed in kernels/configs/), DIR/gpu_tests.log and DIR/table.txt; prints the summary tables.
Copy DIR/<gpu>.json to benchmarks/kernels/ and the configs to kernels/configs/ to keep them.

Expert FFN rows: per model, routing (random router / skewed), T and budget M (or the dense union):
time of base_triton (our kernels), transformers grouped_mm, batched_mm and the eager loop on
identical (idx_TK, w_TK) after router_sum selection; bytes = kept experts' weights + x + out;
GB/s and fraction of the device-to-device copy bandwidth measured in the same run.
Selection rows: the plain router (GEMM, softmax, top-k) alone and followed by our selection
paths, and the PyTorch reference of base/ (all CUDA-graph timed, 20 steps per graph).
Every measurement is wrapped so one failure leaves the rest; an internal deadline keeps the
run inside the device call's limit.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

from base.hf.experts_impl import register_base_triton
from kernels import (
    fuse_router_predictor,
    fused_router_logits,
    prepare_predictor,
)
from kernels.experts import V3_MAX_TOKENS, device_name, fused_experts, get_config
from kernels.score import score_experts
from kernels.select import (
    arrival_counter,
    route_select,
    route_select_gemv,
    select_reassign,
)
from tools.timing import (
    MODELS,
    SMOKE_MODELS,
    copy_bandwidth,
    expert_bytes,
    experts_module,
    make_routing,
    make_weight_sets,  # fmt: skip
    set_impl,
    time_eager,
    time_graph,
)

TS = [1, 8, 16, 32, 64, 128]
BUDGETS = [8, 16, 32, 64, None]
IMPLS = ["base_triton_v3", "base_triton", "grouped_mm", "batched_mm", "eager"]  # v3: the kept list, two launches
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def guarded(what: str, fn, *args, **kwargs):
    """fn(*args) or None; a failure is logged and the run goes on."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        log(f"FAILED {what}: {type(e).__name__}: {str(e)[:300]}")
        traceback.print_exc(limit=3)
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        return None


def run_gpu_tests(out: Path, timeout_s: int) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/test_kernels.py", "tests/test_route_kernel.py", "-p", "no:cacheprovider"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        text, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = f"TIMEOUT after {timeout_s}s\n{e.stdout or ''}", -1
    (out / "gpu_tests.log").write_text(text)
    summary = [line for line in text.splitlines() if "passed" in line or "failed" in line or "error" in line.lower()]
    return {"returncode": rc, "summary": summary[-5:]}


# ----------------------------------------------------------------------------- expert FFN


def bench_experts(name: str, m: dict, dev, copy_gbps: float, deadline: float, reps: int, ts, budgets,
                  impls=tuple(IMPLS)) -> list:  # fmt: skip
    H, I, E, K = m["H"], m["I"], m["E"], m["K"]
    sets = make_weight_sets(E, H, I, 3, dev)
    mods = [experts_module(gu, dn, K) for gu, dn in sets]
    rows = []
    for routing in ["random", "skewed"]:
        for T in ts:
            if time.time() > deadline:
                log(f"  experts: out of time at {name} {routing} T={T}")
                return rows
            r = make_routing(H, E, K, T, m["norm"], routing == "skewed", dev, seed=T)
            union = int(torch.unique(r.idx_TK).numel())
            dense_row = None
            for M in budgets:
                sel = select_reassign(r.probs_TE, r.idx_TK, r.w_TK, r.active_T, M, kind="router_sum")
                keep = sel.keep_M  # M None: the union, nobody rerouted
                idx, w = (r.idx_TK, r.w_TK) if M is None else (sel.topk_idx_TK, sel.topk_w_TK)
                n_run = int(torch.unique(idx[w != 0]).numel())
                nbytes = expert_bytes(n_run, H, I, T)
                row = {"model": name, "routing": routing, "T": T, "M": M if M is not None else "dense", "union": union,
                           "kept": n_run, "bytes": nbytes, "floor_us": nbytes / (copy_gbps * 1e3),
                           "gflop": 2 * 3 * H * I * int((w != 0).sum()) / 1e9}  # fmt: skip
                if M is not None and M >= union and dense_row is not None:
                    row.update({k: v for k, v in dense_row.items() if k.startswith(tuple(IMPLS))})
                    rows.append(row)
                    continue
                for impl in impls:
                    if impl == "base_triton_v3" and T > V3_MAX_TOKENS:
                        continue
                    if impl == "batched_mm" and T > 32:
                        continue  # gathers a weight copy per pair: T*K*9 MB, GBs per call
                    if impl == "eager" and not (routing == "random" and T in (1, 16, 64) and M in (16, None)):
                        continue  # host-bound loop with syncs; a few rows suffice
                    if impl == "base_triton_v3":  # forced, whatever the table picks for the shape
                        v3 = dataclasses.replace(get_config(H, I, T, dev), use_kept=True, kept_max=None)
                        calls = [lambda gu=gu, dn=dn, x=r.x_TH, idx=idx, w=w, k=keep, c=v3: fused_experts(
                                 x, gu, dn, idx, w, keep_M=k, config=c) for gu, dn in sets]  # fmt: skip
                    else:
                        for mod in mods:
                            set_impl(mod, impl)
                        calls = [lambda mod=mod, x=r.x_TH, idx=idx, w=w: mod(x, idx, w) for mod in mods]
                    if impl == "eager":
                        res = guarded(f"{name} {impl} T={T} M={M}", lambda c=calls: (time_eager(c, 6, dev), "eager"))
                    else:
                        res = guarded(f"{name} {impl} T={T} M={M}", time_graph, calls, reps, dev)
                    if res is None:
                        continue
                    us, mode = res
                    row[f"{impl}_us"] = round(us, 2)
                    row[f"{impl}_GBps"] = round(nbytes / (us * 1e3), 1)
                    row[f"{impl}_frac"] = round(nbytes / (us * 1e3) / copy_gbps, 3)
                    row[f"{impl}_mode"] = mode
                rows.append(row)
                if M is None:
                    dense_row = row
                log(f"  {name} {routing} T={T} M={row['M']} kept={n_run}/{union} "
                    + " ".join(f"{i}={row.get(i + '_us', '-')}" for i in impls))  # fmt: skip
            if M is None and dense_row is None:
                pass
    del mods, sets
    torch.cuda.empty_cache() if dev.type == "cuda" else None
    return rows


# ----------------------------------------------------------------------------- selection


def bench_select(name: str, m: dict, dev, deadline: float, reps: int, ts, budget: int = 16) -> list:
    H, E, K, norm = m["H"], m["E"], m["K"], m["norm"]
    g = torch.Generator(device="cpu").manual_seed(7)
    router_EH = (torch.randn(E, H, generator=g) / H**0.5).to(dev, torch.bfloat16)
    pred_w_HE = (torch.randn(H, E, generator=g) * 0.02).to(dev)
    pred_b_E = (torch.randn(E, generator=g) * 0.1).to(dev)
    pred_w_EH = prepare_predictor(pred_w_HE)
    wcat_CH = fuse_router_predictor(router_EH, pred_w_HE)
    def one_row(T: int) -> dict:
        z_TH = torch.randn(T, H, generator=g).to(dev, torch.bfloat16)
        active_T = torch.ones(T, dtype=torch.bool, device=dev)

        def topk(logits_TE):
            probs_TE = logits_TE.float().softmax(-1)
            w_TK, idx_TK = probs_TE.topk(K, dim=-1)
            if norm:
                w_TK = w_TK / w_TK.sum(-1, keepdim=True)
            return probs_TE, idx_TK, w_TK.to(torch.bfloat16)

        def plain():
            return topk(F.linear(z_TH, router_EH))

        def router_sum():
            p, i, w = plain()
            return select_reassign(p, i, w, active_T, budget, kind="router_sum")

        def base_gather():
            p, i, w = plain()
            s = score_experts("base", i, w, active_T, E, z_TH=z_TH, pred_w_EH=pred_w_EH, pred_b_E=pred_b_E)
            return select_reassign(p, i, w, active_T, budget, s)

        def base_fused():
            logits_TE, g_TE = fused_router_logits(z_TH, wcat_CH)
            p, i, w = topk(logits_TE)
            return select_reassign(p, i, w, active_T, budget, kind="base", g_TE=g_TE, pred_b_E=pred_b_E)

        def route_rsum():  # the model's GEMM, then softmax/top-k/selection in one launch
            return route_select(F.linear(z_TH, router_EH), K, active_T, budget, norm_topk=norm, kind="router_sum")

        def route_base():  # one GEMM over [router; predictor], then one launch
            logits_TE, g_TE = fused_router_logits(z_TH, wcat_CH)
            return route_select(logits_TE, K, active_T, budget, norm_topk=norm, kind="base", g_TE=g_TE,
                                pred_b_E=pred_b_E)  # fmt: skip

        counter = arrival_counter(dev)

        def gemv_rsum():  # the router's GEMM, softmax/top-k and selection in ONE launch
            return route_select_gemv(z_TH, router_EH, E, K, active_T, budget, norm_topk=norm, kind="router_sum",
                                     counter=counter)  # fmt: skip

        def gemv_base():  # the same over [router; predictor] rows, BASE's score
            return route_select_gemv(z_TH, wcat_CH, E, K, active_T, budget, norm_topk=norm, kind="base",
                                     pred_b_E=pred_b_E, counter=counter)  # fmt: skip

        def base_torch():
            from base.method.routing import RoutedBatch, reassign
            from base.method.selectors import Artifacts, build_selector

            p, i, w = plain()
            b = RoutedBatch(z_TH=z_TH, probs_TE=p, topk_idx_TK=i, topk_w_TK=w, active_T=active_T, layer=0)
            sel = build_selector("base", Artifacts(pred_w_LHE=pred_w_HE[None], pred_b_LE=pred_b_E[None]))
            keep_E, score_E = sel.keep(b, budget)
            return reassign(b, keep_E, score_E)

        row = {"model": name, "T": T, "M": budget}
        for label, fn in [("plain_router", plain), ("router_sum", router_sum), ("base_gather", base_gather),
                          ("base_fused", base_fused), ("route_rsum", route_rsum), ("route_base", route_base),
                          ("gemv_rsum", gemv_rsum), ("gemv_base", gemv_base), ("base_torch", base_torch)]:  # fmt: skip
            res = guarded(f"select {name} {label} T={T}", time_graph, [fn] * 20, reps, dev)
            if res is not None:
                row[f"{label}_us"] = round(res[0], 2)
        for label in ["router_sum", "base_gather", "base_fused", "route_rsum", "route_base", "gemv_rsum", "gemv_base",
                      "base_torch"]:  # fmt: skip
            if f"{label}_us" in row and "plain_router_us" in row:
                row[f"{label}_extra_us"] = round(row[f"{label}_us"] - row["plain_router_us"], 2)
        log(f"  select {name} T={T}: " + " ".join(f"{k}={v}" for k, v in row.items() if k.endswith("_us")))
        return row

    rows = []
    for T in ts:
        if time.time() > deadline:
            log(f"  select: out of time at {name} T={T}")
            break
        rows.append(one_row(T))
    return rows


def bench_breakdown(name: str, m: dict, dev, copy_gbps: float, reps: int) -> list:
    """Time the first n launches of fused_experts (route, +gate_up, +down, +reduce); a launch's
    cost is the difference of consecutive rows."""
    H, I, E, K = m["H"], m["I"], m["E"], m["K"]
    sets = make_weight_sets(E, H, I, 3, dev)
    rows = []
    for T, M in [(1, 16), (16, 16), (64, 16), (16, None), (128, 16)]:
        r = make_routing(H, E, K, T, m["norm"], False, dev, seed=T)
        idx, w = r.idx_TK, r.w_TK
        if M is not None:
            sel = select_reassign(r.probs_TE, idx, w, r.active_T, M, kind="router_sum")
            idx, w = sel.topk_idx_TK, sel.topk_w_TK
        n_run = int(torch.unique(idx[w != 0]).numel())
        floor_us = expert_bytes(n_run, H, I, T) / (copy_gbps * 1e3)
        row = {"model": name, "T": T, "M": M or "dense", "kept": n_run, "floor_us": floor_us}
        prev = 0.0
        for n, label in enumerate(["route", "gate_up", "down", "reduce"], start=1):
            calls = [lambda gu=gu, dn=dn, n=n, x=r.x_TH, idx=idx, w=w: fused_experts(x, gu, dn, idx, w, _stages=n)
                     for gu, dn in sets]  # fmt: skip
            res = guarded(f"breakdown {label}", time_graph, calls, reps, dev)
            if res is None:
                break
            row[f"upto_{label}_us"] = round(res[0], 2)
            row[f"{label}_us"] = round(res[0] - prev, 2)
            prev = res[0]
        rows.append(row)
        log(f"  breakdown {name} T={T} M={row['M']} kept={n_run} floor={row['floor_us']:.1f} "
            + " ".join(f"{k}={v}" for k, v in row.items() if k.endswith("_us") and not k.startswith("upto")))  # fmt: skip
    return rows


# ----------------------------------------------------------------------------- report


def fmt(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def table_experts(rows: list, copy_gbps: float) -> str:
    head = (f"{'model':18} {'route':6} {'T':>4} {'M':>5} {'kept':>9} {'MB':>6} {'floor':>7} | {'v3 us':>8} "
            f"{'%copy':>5} | {'v2 us':>8} "
            f"{'%copy':>5} | {'grouped':>8} {'%copy':>5} | {'batched':>8} | {'eager':>8} | {'x grp':>5}")  # fmt: skip
    lines = [f"expert FFN, bf16; copy bandwidth {copy_gbps:.0f} GB/s; times in us (CUDA graph, median)", head]
    for r in rows:
        o, gm, v3 = r.get("base_triton_us"), r.get("grouped_mm_us"), r.get("base_triton_v3_us")
        lines.append(
            f"{r['model'][:18]:18} {r['routing'][:6]:6} {r['T']:>4} {r['M']!s:>5} "
            f"{str(r['kept']) + '/' + str(r['union']):>9} {r['bytes'] / 1e6:6.0f} {r['floor_us']:7.1f} | "
            f"{fmt(v3):>8} {r.get('base_triton_v3_frac', 0) * 100:5.0f} | "
            f"{fmt(o):>8} {r.get('base_triton_frac', 0) * 100:5.0f} | {fmt(gm):>8} "
            f"{r.get('grouped_mm_frac', 0) * 100:5.0f} | {fmt(r.get('batched_mm_us')):>8} | "
            f"{fmt(r.get('eager_us')):>8} | {(gm / o) if (o and gm) else 0:5.1f}"
        )
    return "\n".join(lines)


def table_select(rows: list) -> str:
    cols = ["plain_router", "router_sum", "base_gather", "base_fused", "route_rsum", "route_base", "gemv_rsum",
            "gemv_base", "base_torch"]  # fmt: skip
    lines = ["selection step per layer (M=16), us per step; extra = minus the plain router",
             f"{'model':18} {'T':>4} " + " ".join(f"{c[:13]:>13}" for c in cols)]  # fmt: skip
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(f"{c}_us")
            x = r.get(f"{c}_extra_us")
            cells.append((fmt(v) + ("" if x is None else f"({x:+.1f})")).rjust(13))
        lines.append(f"{r['model'][:18]:18} {r['T']:>4} " + " ".join(cells))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/kernels"))
    ap.add_argument("--budget-s", type=float, default=360, help="internal deadline for the whole run")
    ap.add_argument("--tune-s", type=float, default=100, help="time allowed for tuning")
    ap.add_argument("--tests-s", type=int, default=150, help="time allowed for the GPU tests")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--skip-tune", action="store_true")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="CPU run of the harness on tiny shapes")
    ap.add_argument("--models", nargs="*", default=None, choices=list(MODELS), metavar="MODEL",
                    help=f"subset of tools/timing.py's MODELS: {', '.join(MODELS)}")
    ap.add_argument("--ts", nargs="*", type=int, default=None)
    ap.add_argument("--impls", nargs="*", default=None, help=f"subset of {IMPLS}")
    ap.add_argument("--tune-paths", nargs="*", default=["v2", "v3"],
                    help="expert paths to tune: v2, v3; reduce (alone): the reduce inside v2's down launch, checked "
                         "with the installed configs")
    args = ap.parse_args()
    if not args.smoke and not torch.cuda.is_available():  # before --out is made: each section would fail in turn
        ap.error("no CUDA device here: the benchmark times a GPU (--smoke checks the harness on a CPU)")
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = T0 + args.budget_s
    dev = torch.device("cpu" if args.smoke else "cuda")
    models = SMOKE_MODELS if args.smoke else {k: v for k, v in MODELS.items() if not args.models or k in args.models}
    ts, budgets = ([1, 16], [2, None]) if args.smoke else (args.ts or TS, BUDGETS)
    impls = tuple(args.impls or IMPLS)
    register_base_triton()
    import transformers
    import triton

    gpu = device_name(dev)
    report = {"device": gpu, "torch": torch.__version__, "triton": triton.__version__,
                  "transformers": transformers.__version__, "python": platform.python_version(),
                  "started": time.strftime("%Y-%m-%d %H:%M:%S")}  # fmt: skip
    out_json = args.out / f"{gpu}.json"

    def save():
        out_json.write_text(json.dumps(report, indent=1) + "\n")

    log(f"device {gpu}; torch {torch.__version__}, triton {triton.__version__}, transformers {transformers.__version__}")
    copy_gbps = guarded("copy bandwidth", copy_bandwidth, dev, 0.01 if args.smoke else 2.0) or 4180.0
    report["copy_GBps"] = round(copy_gbps, 1)
    log(f"copy bandwidth {copy_gbps:.0f} GB/s")
    save()
    if not args.smoke and not args.skip_tests:
        report["gpu_tests"] = guarded("gpu tests", run_gpu_tests, args.out, args.tests_s)
        log(f"gpu tests: {report['gpu_tests']}")
        save()
    if not args.smoke and not args.skip_tune:
        from tools.tune_kernels import install, tune

        table = guarded("tune", tune, models, ts, copy_gbps, time.time() + args.tune_s, log=log,
                        paths=tuple(args.tune_paths)) or {}  # fmt: skip
        if table:
            guarded("install configs", install, table, dev, args.out / f"configs_{gpu}.json")
        report["configs"] = table
        save()
    # most important first: the Qwen3 rows and the selection step; then the other models
    order = list(models)
    report["experts"], report["select"] = [], []
    for i, name in enumerate(order):
        # leave ~15% of the remaining time for each later section
        budget_left = deadline - time.time()
        rows = guarded(f"experts {name}", bench_experts, name, models[name], dev, copy_gbps,
                       time.time() + budget_left * (0.6 if i == 0 else 0.8 / (len(order) - i)), args.reps, ts, budgets,
                       impls)  # fmt: skip
        report["experts"] += rows or []
        save()
        if i == 0:
            report["breakdown"] = guarded("breakdown", bench_breakdown, name, models[name], dev, copy_gbps, args.reps) or []
            save()
            for sname in order:
                report["select"] += guarded(f"select {sname}", bench_select, sname, models[sname], dev,
                                            time.time() + 40, args.reps, ts) or []  # fmt: skip
            save()
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    report["wall_s"] = round(time.time() - T0, 1)
    save()
    text = table_experts(report["experts"], copy_gbps) + "\n\n" + table_select(report["select"])
    (args.out / "table.txt").write_text(text + "\n")
    # the reply shows the tail of the output: Qwen3 random-routing rows and the selection table
    short = [r for r in report["experts"] if r["routing"] == "random" and r["model"] == order[0]]
    bd = "\n".join(
        f"breakdown {b['model']} T={b['T']} M={b['M']} kept={b['kept']} floor={b['floor_us']:.1f}: "
        + " ".join(f"{k[:-3]}={v}" for k, v in b.items() if k.endswith("_us") and k != "floor_us" and not k.startswith("upto"))
        for b in report.get("breakdown", [])
    )  # fmt: skip
    (args.out / "table.txt").write_text(text + "\n\n" + bd + "\n")
    print("\n" + table_experts(short, copy_gbps) + "\n\n" + table_select(report["select"]) + "\n\n" + bd, flush=True)
    log(f"wrote {out_json}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
