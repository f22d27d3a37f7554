"""Benchmark fixtures shared by tools/bench_kernels.py and tools/tune_kernels.py: model shapes, routing,
weight sets, experts modules, and timers.

Shapes: T tokens, H hidden, I expert intermediate, E experts, K top-k, S weight sets.
Timing: CUDA graphs of one call per weight set (S sets rotated so L2, 60 MB on an H200, never
holds the next call's weights), replayed many times; each replay timed with CUDA events; median.
Non-capturable implementations (transformers' eager loop syncs the host) are timed eagerly per call.
On CPU (smoke runs of the harness) host timers stand in for events.
"""
from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

# One MoE layer of each model: hidden, expert intermediate, routed experts, top-k, renormalised top-k.
MODELS = {
    "qwen3_30b_a3b": {"H": 2048, "I": 768, "E": 128, "K": 8, "norm": True},
    "qwen15_moe_a27b": {"H": 2048, "I": 1408, "E": 60, "K": 4, "norm": False},
    "deepseek_v2_lite": {"H": 2048, "I": 1408, "E": 64, "K": 6, "norm": False},
    "olmoe": {"H": 2048, "I": 1024, "E": 64, "K": 8, "norm": False},
}
SMOKE_MODELS = {"smoke": {"H": 40, "I": 24, "E": 16, "K": 4, "norm": True}}  # CPU check of the harness
SKEW = 2.0  # skewed routing: fixed per-expert logit offsets ~ SKEW * N(0, 1)


@dataclass
class Routing:
    x_TH: Tensor
    probs_TE: Tensor
    idx_TK: Tensor
    w_TK: Tensor
    active_T: Tensor


def make_routing(H: int, E: int, K: int, T: int, norm: bool, skew: bool, device, seed: int = 0,
                 dtype=torch.bfloat16) -> Routing:  # fmt: skip
    """Router of a random-weight layer (logit std ~1, as a trained router's), optionally skewed."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    x_TH = torch.randn(T, H, generator=g).to(device, dtype)
    router_EH = (torch.randn(E, H, generator=g) / H**0.5).to(device, dtype)
    logits_TE = torch.nn.functional.linear(x_TH, router_EH).float()
    if skew:
        logits_TE = logits_TE + SKEW * torch.randn(E, generator=g).to(device)
    probs_TE = logits_TE.softmax(-1)
    w_TK, idx_TK = probs_TE.topk(K, dim=-1)
    if norm:
        w_TK = w_TK / w_TK.sum(-1, keepdim=True)
    active_T = torch.ones(T, dtype=torch.bool, device=device)
    return Routing(x_TH, probs_TE, idx_TK, w_TK.to(dtype), active_T)


def make_weight_sets(E: int, H: int, I: int, S: int, device, dtype=torch.bfloat16) -> list[tuple[Tensor, Tensor]]:
    """S independent (gate_up (E, 2I, H), down (E, H, I)) sets, random (never zeros)."""
    sets = []
    for s in range(S):
        g = torch.Generator(device=device).manual_seed(100 + s)
        gu = torch.randn(E, 2 * I, H, generator=g, device=device, dtype=dtype).mul_(H**-0.5)
        dn = torch.randn(E, H, I, generator=g, device=device, dtype=dtype).mul_(I**-0.5)
        sets.append((gu, dn))
    return sets


@dataclass
class SelectLayer:
    """One MoE layer's router with BASE's predictor folded into its GEMM, as the budgeted model
    runs the selection kernel (kernels/score.py)."""

    wcat_CH: Tensor  # [router; predictor] rows
    pred_b_E: Tensor
    dtype: torch.dtype

    def inputs(self, T: int, g: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        """(logits_TE, g_TE, active_T) of T random tokens, every one active."""
        from kernels.score import fused_router_logits

        device = self.wcat_CH.device
        z_TH = torch.randn(T, self.wcat_CH.shape[1], generator=g).to(device, self.dtype)
        logits_TE, g_TE = fused_router_logits(z_TH, self.wcat_CH)
        return logits_TE, g_TE, torch.ones(T, dtype=torch.bool, device=device)


def select_layer(H: int, E: int, device, g: torch.Generator) -> SelectLayer:
    """A random router (logit std ~1) and predictor (bf16 on a GPU, fp32 elsewhere), drawn from g."""
    from kernels.score import fuse_router_predictor

    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    router_EH = (torch.randn(E, H, generator=g) / H**0.5).to(device, dtype)
    pred_w_HE = (torch.randn(H, E, generator=g) * 0.02).to(device)
    pred_b_E = (torch.randn(E, generator=g) * 0.1).to(device)
    return SelectLayer(fuse_router_predictor(router_EH, pred_w_HE), pred_b_E, dtype)


def experts_module(gate_up: Tensor, down: Tensor, K: int) -> torch.nn.Module:
    """A transformers Qwen3MoeExperts over the given weights (no copy); pick the implementation
    with `set_impl(module, name)`."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    E, twoI, H = gate_up.shape
    cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=twoI // 2, num_experts=E, num_experts_per_tok=K)
    with torch.device("meta"):
        mod = Qwen3MoeExperts(cfg)
    mod.gate_up_proj = torch.nn.Parameter(gate_up, requires_grad=False)
    mod.down_proj = torch.nn.Parameter(down, requires_grad=False)
    return mod


def set_impl(module: torch.nn.Module, name: str) -> None:
    module.config._experts_implementation = name


def expert_bytes(n_experts: int, H: int, I: int, T: int, elt: int = 2) -> int:
    """Fewest bytes a step must move: the experts' weights once, x read, out written."""
    return n_experts * 3 * H * I * elt + 2 * T * H * elt


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_eager(calls: list[Callable], reps: int, device) -> float:
    """Median microseconds of one call (calls rotated), host launch overhead included."""
    for c in calls:
        c()
    _sync(device)
    times = []
    for r in range(reps):
        c = calls[r % len(calls)]
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            c()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3)
        else:
            t0 = time.perf_counter()
            c()
            times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def time_graph(calls: list[Callable], reps: int, device) -> tuple[float, str]:
    """(median microseconds per call, "graph"); one graph holds every call once (weight sets
    rotated); falls back to eager timing where capture is impossible (CPU, host syncs)."""
    if device.type != "cuda":
        return time_eager(calls, max(reps, len(calls)), device), "eager"
    for c in calls:  # compile / autotune outside the capture
        c()
    torch.cuda.synchronize()
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for c in calls:
                c()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for c in calls:
                c()
    except Exception:  # noqa: BLE001 - e.g. a host sync inside the implementation
        torch.cuda.synchronize()
        return time_eager(calls, max(reps, len(calls)) * 2, device), "eager"
    graph.replay()
    graph.replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in events:
        a.record()
        graph.replay()
        b.record()
    torch.cuda.synchronize()
    us = statistics.median(a.elapsed_time(b) * 1e3 for a, b in events) / len(calls)
    del graph
    return us, "graph"


def load_module(path: str, name: str):
    """A kernel file from elsewhere (an older commit's kernels/select.py, experts.py, ...) as a module
    of its own name: the A/B tools' baseline."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def check_ab_arguments(ap, args) -> None:
    """An A/B tool's shared refusals (tools/bench_select.py, bench_attention.py, bench_experts.py),
    through its parser's error: fewer than 5 rounds outside a smoke run, fewer than 1 replay, a
    --baseline file that is not there."""
    if args.rounds < 5 and not args.smoke:
        ap.error(f"--rounds must be >= 5 (median and range over interleaved rounds), got {args.rounds}")
    if args.reps < 1:
        ap.error(f"--reps must be >= 1, got {args.reps}")
    if args.baseline and not Path(args.baseline).is_file():
        ap.error(f"--baseline {args.baseline}: no such file")


def interleaved_rounds(work: list[tuple[dict, dict[str, Callable]]], names: list[str], rounds: int, reps: int,
                       device, calls_of: Callable[[object], list[Callable]] = lambda fn: [fn] * 20) -> list[dict]:
    """An A/B's timings: each case of `work`, (labels, {implementation: what to time}), timed for every
    implementation in `names` by `time_graph(calls_of(what), reps)` (default: a graph of 20 calls of
    one callable), in `rounds` rounds with the implementations' order rotated each round, so none
    always runs first. One row per case, implementation and round: the labels, impl, round, us, timing
    (what analysis/kernel_ab.py reads)."""
    rows = []
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for labels, calls in work:
            for name in order:
                us, how = time_graph(calls_of(calls[name]), reps, device)
                rows.append({**labels, "impl": name, "round": r, "us": round(us, 3), "timing": how})
        print(f"round {r + 1}/{rounds} done", flush=True)
    return rows


def compile_side_by_side(calls: list[Callable], workers: int) -> list[Exception | None]:
    """Call each of `calls` once, `workers` at a time in threads, and wait for all; the exceptions
    they raised, in order (None for those that returned).

    For a tuner's candidates before they are timed: each call's first launch compiles its Triton
    kernel, seconds each (tuning 48 selection candidates at 64 tokens took 99 s, one after another,
    on an H100: results/roofline/branches_2026-12-06k/tune_step_call1_tail.txt). Triton's compiler
    (its C++ passes, ptxas in a subprocess) runs outside the GIL, so threads compile candidates side
    by side (`python -m tools.aot_check --threads 2`: 1.9x on 2 cores); the launches go to the
    device's one stream and their outputs are thrown away. A candidate that fails here fails again
    when it is timed, where the tuner logs it. `workers` 1: one after another, no thread (the CPU's
    interpreter patches Triton's call globally while it runs, so CPU callers pass 1)."""
    def attempt(call: Callable) -> Exception | None:
        try:
            call()
        except Exception as e:  # noqa: BLE001 - reported to the caller, who times and logs the candidate
            return e
        return None

    if workers <= 1 or len(calls) <= 1:
        return [attempt(c) for c in calls]
    with ThreadPoolExecutor(max_workers=min(workers, len(calls))) as pool:
        return list(pool.map(attempt, calls))


def compile_workers(device) -> int:
    """Threads for `compile_side_by_side` on this device: the host's cores on a GPU, 1 on the CPU."""
    return min(16, os.cpu_count() or 1) if torch.device(device).type == "cuda" else 1


def copy_bandwidth(device, gib: float = 2.0, reps: int = 20) -> float:
    """Device-to-device copy, GB/s counting bytes read plus bytes written (what a throughput run
    records as report.json's copy_gbps: base/runtime/throughput.py)."""
    if torch.device(device).type != "cuda":  # a smoke run: the host's copy, timed eagerly
        n = int(gib * 2**30) // 4
        src = torch.randn(n, device=device)
        dst = torch.empty_like(src)
        us = time_eager([lambda: dst.copy_(src)], reps, device)
        return 2 * n * 4 / (us * 1e-6) / 1e9
    from base.runtime.throughput import copy_gbps

    return copy_gbps(torch.device(device), gib, reps)
