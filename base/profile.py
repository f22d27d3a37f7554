"""Where a decode step's GPU time goes, by kernel class: attention, norms, router/selection, expert
FFN (routed and shared), LM head, embedding, other.

Each class's modules get a profiler range (forward pre/post hooks); a few eager decode steps of the
engine run under torch.profiler, and the device time of the kernels launched inside each range is
summed (a kernel belongs to the innermost tagged module that launched it; untagged: `other`).
Kernel time only: launch gaps, which a CUDA graph shrinks, are not in it, so `total` is below an
eager step's wall time and close to a graph replay's.

History: the first H200 run attributed by each event's self device time, which counted kernels
twice (an operator and its runtime launch call). The second (results/throughput/runs/*/profile.csv)
counted each operator's kernels once but skipped the class ranges themselves, and with them every
Triton kernel launched directly inside a range (its total: 3.9 of a 13.8 ms step). This version
also counts a range's own kernels; it has not been run on a GPU yet.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

# (class, attribute names of the modules it covers)
CLASSES = (
    ("attention", ("self_attn",)),
    ("norms", ("input_layernorm", "post_attention_layernorm", "norm")),
    ("router/selection", ("gate", "router")),
    ("expert FFN", ("experts",)),
    ("shared experts", ("shared_expert", "shared_experts", "shared_expert_gate")),
    ("dense MLP", ("mlp",)),  # dense layers (DeepSeek's first); MoE blocks named mlp are covered by parts
    ("LM head", ("lm_head",)),
    ("embedding", ("embed_tokens",)),
)


def _tag(model: nn.Module) -> list:
    """Install a profiler range around every module of a class; returns the hook handles."""
    handles = []
    for name, module in model.named_modules():
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


def profile_steps(model: nn.Module, run_steps: Callable[[], None], steps: int) -> dict[str, float]:
    """ms per step by class over `run_steps()` (which runs `steps` eager decode steps): kernel time
    on a GPU, operator CPU time on a CPU (there the split is of host work, not of device work)."""
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
    per_class, total = attribute(prof.events(), cuda)
    out = {cls: ms / steps for cls, ms in sorted(per_class.items(), key=lambda kv: -kv[1])}
    out["total"] = total / steps
    return out


def attribute(events, cuda: bool) -> tuple[dict[str, float], float]:
    """ms by class over profiler events (FunctionEvent-like: name, kernels, self_cpu_time_total,
    cpu_parent), and their total."""
    per_class: dict[str, float] = {}
    total = 0.0
    for ev in events:
        own = ev.name.startswith("cls:")
        # The profiler attaches each GPU kernel once, to the innermost PyTorch operator or
        # record_function range open at its launch (ev.kernels): a Triton kernel launched
        # directly inside a class's range (expert FFN, selection, decode attention) is attached
        # to the range itself, so ranges count their own kernels too.
        if cuda:
            t = sum(k.duration for k in ev.kernels) / 1e3
        else:
            t = 0.0 if own else ev.self_cpu_time_total / 1e3
        if t <= 0:
            continue
        total += t
        if own:
            per_class[ev.name[4:]] = per_class.get(ev.name[4:], 0.0) + t
            continue
        parent, cls = ev.cpu_parent, "other"
        while parent is not None:
            if parent.name.startswith("cls:"):
                cls = parent.name[4:]
                break
            parent = parent.cpu_parent
        per_class[cls] = per_class.get(cls, 0.0) + t
    return per_class, total
