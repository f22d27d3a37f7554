"""Where a decode step's GPU time goes, by kernel class: attention, norms, router/selection, expert
FFN (routed and shared), LM head, embedding, other.

Each class's modules get a profiler range (forward pre/post hooks); a few eager decode steps of the
engine run under torch.profiler. On a GPU every kernel of the trace is attributed to the innermost
class range open on the host when it was launched: the kernel's launch is found through the
trace's ids (its `External id`, the operator or range it was launched in, else its `correlation`,
the runtime or driver call that launched it), so kernels that Triton launches directly (expert FFN,
route_select, decode attention) count like those of PyTorch operators. A kernel whose launch is
not in the trace is `unlinked`, so `total` is always the sum of every kernel. Kernel time only:
launch gaps, which a CUDA graph shrinks, are not in it, so `total` is below an eager step's wall
time and close to a graph replay's. On a CPU the split is of operators' host time.

History: the first H200 run attributed by each event's self device time, which counted kernels
twice (an operator and its runtime launch call). The second (the committed grid's profile.csv)
went through PyTorch's FunctionEvents, which attach kernels to operators only: Triton's direct
launches were missing (total 3.9 of a 13.8 ms step). A fix that looked for kernels on the class
ranges' FunctionEvents found none on the H200; hence the trace.
"""
from __future__ import annotations

import bisect
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

# (class, attribute names of the modules it covers)
CLASSES = (
    # a decoder layer's compiled attention half (base/runtime/regional.py), tagged by its own range:
    # attention, the norms around it and the residual add, which Inductor fuses across
    ("attention + norms", ()),
    ("attention", ("self_attn",)),
    ("norms", ("input_layernorm", "post_attention_layernorm", "norm")),
    ("router/selection", ("gate", "router")),
    ("expert FFN", ("experts",)),
    ("shared experts", ("shared_expert", "shared_experts", "shared_expert_gate")),
    ("dense MLP", ("mlp",)),  # dense layers (DeepSeek's first); MoE blocks named mlp are covered by parts
    ("LM head", ("lm_head",)),
    ("embedding", ("embed_tokens",)),
)


class _Shadow:
    """Profiling-only wrapper of an owned MoE block's method (an instance attribute that shadows it)."""

    def __init__(self, module: nn.Module, method: str, cls: str) -> None:
        self.module, self.method = module, method
        inner = getattr(module, method)

        def wrapped(*args, **kwargs):
            with torch.profiler.record_function(f"cls:{cls}"):
                return inner(*args, **kwargs)

        module.__dict__[method] = wrapped

    def remove(self) -> None:
        self.module.__dict__.pop(self.method, None)


# The owned MoE block (base/hf/moe_block.py) runs the fused route, the two-launch experts and the
# shared experts' kernel itself, outside its router, experts and shared modules: its three methods
# get the classes' ranges.
OWNED_METHODS = (("route", "router/selection"), ("run_experts", "expert FFN"), ("run_shared", "shared experts"))


def _tag(model: nn.Module) -> list:
    """Install a profiler range around every module of a class; returns the hook handles."""
    handles = []
    for name, module in model.named_modules():
        if all(callable(getattr(module, m, None)) for m, _ in OWNED_METHODS) and hasattr(module, "family"):
            handles += [_Shadow(module, m, cls) for m, cls in OWNED_METHODS]
        attr = name.rsplit(".", 1)[-1]
        for cls, attrs in CLASSES:
            if attr not in attrs:
                continue
            if cls == "dense MLP" and hasattr(module, "experts"):
                break  # an MoE block: its gate and experts are tagged themselves
            if cls == "norms" and attr == "norm" and name.count(".") > 1:
                break  # q_norm/k_norm live inside attention
            state: dict = {}

            def pre(mod, args, cls=cls, state=state):
                state["r"] = torch.profiler.record_function(f"cls:{cls}")
                state["r"].__enter__()

            def post(mod, args, out, state=state):
                state.pop("r").__exit__(None, None, None)

            handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
            break
    return handles


def profile_steps(model: nn.Module, run_steps: Callable[[], None], steps: int,
                  by_kernel: list[dict] | None = None) -> dict[str, tuple[float, float]]:
    """(ms, kernels) per step by class over `run_steps()` (which runs `steps` eager decode steps):
    kernel time and kernel launches on a GPU; operator CPU time and operator count on a CPU (there
    the split is of host work, not of device work)."""
    cuda = next(model.parameters()).device.type == "cuda"
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    handles = _tag(model)
    try:
        with torch.profiler.profile(activities=acts) as prof:
            run_steps()
            if cuda:
                torch.cuda.synchronize()
    finally:
        for h in handles:
            h.remove()
    if cuda:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(path))
            per_class, total, count, names = attribute_trace(json.loads(path.read_text())["traceEvents"])
        if by_kernel is not None:  # each kernel name's share, within its class, largest first
            for (cls, name), (ms, n) in sorted(names.items(), key=lambda kv: -kv[1][0]):
                by_kernel.append({"class": cls, "kernel": name, "ms_per_step": ms / steps, "kernels_per_step": n / steps})
    else:
        per_class, total, count = attribute_cpu(prof.events())
    out = {cls: (ms / steps, count[cls] / steps) for cls, ms in sorted(per_class.items(), key=lambda kv: -kv[1])}
    out["total"] = (total / steps, sum(count.values()) / steps)
    return out


def attribute_cpu(events) -> tuple[dict[str, float], float, dict[str, int]]:
    """ms of operator self CPU time by class over profiler FunctionEvents (name,
    self_cpu_time_total, cpu_parent), their total, and operators by class."""
    per_class: dict[str, float] = {}
    count: dict[str, int] = {}
    total = 0.0
    for ev in events:
        t = 0.0 if ev.name.startswith("cls:") else ev.self_cpu_time_total / 1e3
        if t <= 0:
            continue
        total += t
        parent, cls = ev.cpu_parent, "other"
        while parent is not None:
            if parent.name.startswith("cls:"):
                cls = parent.name[4:]
                break
            parent = parent.cpu_parent
        per_class[cls] = per_class.get(cls, 0.0) + t
        count[cls] = count.get(cls, 0) + 1
    return per_class, total, count


def attribute_trace(trace: list[dict]) -> tuple[dict[str, float], float, dict[str, int],
                                                dict[tuple[str, str], list[float]]]:
    """ms of GPU kernel time by class over a chrome trace's events (torch.profiler's
    export_chrome_trace), their total, kernels by class, and [ms, kernels] by (class, kernel name):
    each kernel goes to the innermost `cls:` range that was open on its launching thread when it
    was launched (none: `other`; launch not found: `unlinked`)."""
    ranges: dict[int, list[tuple[float, float, str]]] = {}  # tid -> (start, end, class)
    by_ext: dict[int, tuple[int, float]] = {}  # External id -> (tid, host ts) of an op or range
    by_corr: dict[int, tuple[int, float]] = {}  # correlation -> (tid, host ts) of a launch call
    kernels = []
    for ev in trace:
        if ev.get("ph") != "X":
            continue
        cat, args = ev.get("cat", ""), ev.get("args") or {}
        if cat == "kernel":
            kernels.append(ev)
        elif cat in ("cpu_op", "user_annotation"):
            if cat == "user_annotation" and ev["name"].startswith("cls:"):
                ranges.setdefault(ev["tid"], []).append((ev["ts"], ev["ts"] + ev["dur"], ev["name"][4:]))
            if "External id" in args:
                by_ext[args["External id"]] = (ev["tid"], ev["ts"])
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            by_corr[args["correlation"]] = (ev["tid"], ev["ts"])

    for spans in ranges.values():
        spans.sort()
    starts = {tid: [s for s, _, _ in spans] for tid, spans in ranges.items()}
    longest = {tid: max(e - s for s, e, _ in spans) for tid, spans in ranges.items()}

    def innermost(tid: int, ts: float) -> str:
        # ranges nest, so the innermost open one is the latest-starting range that contains ts
        spans = ranges.get(tid, [])
        i = bisect.bisect_right(starts.get(tid, []), ts) - 1
        while i >= 0 and spans[i][0] >= ts - longest[tid]:
            if spans[i][1] >= ts:
                return spans[i][2]
            i -= 1
        return "other"

    per_class: dict[str, float] = {}
    count: dict[str, int] = {}
    names: dict[tuple[str, str], list[float]] = {}
    total = 0.0
    for k in kernels:
        args = k.get("args") or {}
        launch = by_corr.get(args.get("correlation")) or by_ext.get(args.get("External id"))
        cls = innermost(*launch) if launch is not None else "unlinked"
        t = k["dur"] / 1e3
        per_class[cls] = per_class.get(cls, 0.0) + t
        count[cls] = count.get(cls, 0) + 1
        name = names.setdefault((cls, k["name"][:_NAME_CHARS]), [0.0, 0])
        name[0] += t
        name[1] += 1
        total += t
    return per_class, total, count, names


_NAME_CHARS = 120  # kernel names (C++ templates) cut to this length
