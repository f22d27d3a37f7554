"""Decode throughput: dense and every configured selector in one process, over batch x budget.

Each (batch size, method, budget) decodes `gen_tokens` tokens after `prompt_len` random prompt
tokens, EOS ignored (as in the paper), through base/runtime/engine.py: on CUDA the decode step is one CUDA
graph, replayed and timed step by step with CUDA events; on a CPU the same engine runs eagerly (a
smoke test of the bookkeeping, not a speed figure). Per configuration:
  timed pass    statistics off (recording adds kernels to the step), every replay timed:
                median / p90 step latency, tokens/s = batch / median step
  stats pass    `stats_steps` steps with selection statistics on: mean union before selection,
                experts kept
  non-expert    the same step with the expert FFN skipped (base_skip experts): its median is the
                time of everything else, so moe_share = 1 - non_expert / step
  memory        peak GPU memory of the configuration
  profile       at `profile_batch`, for dense, oea and the first budget: device ms per step by
                kernel class (attention, norms, router/selection, expert FFN, LM head, ...)
Speed-up is against the dense row of the same batch size, measured in the same process. The first
configuration is also decoded eagerly once (mode=eager: no graph, no compiled regions) to put the
effect of both on record. `compile=false` times the graph without compiled regions.

Shapes: B batch, P prompt length, N new tokens.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn

from base.config import ThroughputConfig
from base.hf.budget import MoeBudget
from base.hf.placement import model_devices
from base.progress import progress, say
from base.runtime.engine import DecodeEngine

SKIP_EXPERTS = "base_skip"


@dataclass(frozen=True)
class Variant:
    """One timed configuration of a method: dense, a selector at a budget, or oea at its k0."""

    method: str
    budget: int | None = None
    k0: int | None = None
    experts_impl: str | None = None  # None: the model's own

    @property
    def label(self) -> str:
        name = self.method if self.k0 is None else f"{self.method}(k0={self.k0})"
        name = name if self.experts_impl is None else f"{name}[{self.experts_impl}]"
        return name


def register_skip_experts() -> str:
    """An experts implementation that returns zeros: the step without its expert FFN."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(SKIP_EXPERTS, lambda self, x, idx, w: torch.zeros_like(x))
    return SKIP_EXPERTS


def copy_gbps(device: torch.device, gib: float = 1.0, reps: int = 10) -> float:
    """The device's copy bandwidth, GB/s counting bytes read plus written: the median of `reps`
    device-to-device copies of `gib` GiB (the expert FFN's bandwidth is reported as a share of it)."""
    n = int(gib * 2**30) // 4
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    del src, dst
    return 2 * n * 4 / statistics.median(times) / 1e9


def expert_bytes(layer: nn.Module) -> int:
    """Bytes of one expert's weights in a budgeted MoE layer (all its experts' parameters over E)."""
    return sum(p.numel() * p.element_size() for p in layer.experts.parameters()) // layer.num_experts


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def _peak_reset(devices: list[torch.device]) -> None:
    for d in devices:
        if d.type == "cuda":
            torch.cuda.reset_peak_memory_stats(d)


def _peak_gb(devices: list[torch.device]) -> float | None:
    """Peak GPU memory, summed over the GPUs of a model spread over several."""
    cuda = [d for d in devices if d.type == "cuda"]
    return sum(torch.cuda.max_memory_allocated(d) for d in cuda) / 1e9 if cuda else None


def _sync(devices: list[torch.device]) -> None:
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


class _ExpertsImpl:
    """Temporarily switch the model's experts implementation (restored on exit)."""

    def __init__(self, model: nn.Module, impl: str | None) -> None:
        self.model, self.impl = model, impl
        self.before = getattr(model.config, "_experts_implementation", None)

    def __enter__(self) -> None:
        if self.impl is not None:
            self.model.set_experts_implementation(self.impl)

    def __exit__(self, *exc) -> None:
        if self.impl is not None:
            self.model.set_experts_implementation(self.before or "eager")


def _decode(model: nn.Module, make_budget: Callable[[Variant, bool], MoeBudget | None], v: Variant, bs: int,
            cfg: ThroughputConfig, ids_BP: torch.Tensor, stats: bool, steps: int,
            graph: bool | None = None) -> tuple[list[float], float, list[dict], float]:
    """Decode `steps` steps of variant v with a cache for gen_tokens; (per-step ms of the timed
    replays after `warmup` untimed ones, wall s, stats rows, warm-up s: compilation of regions
    not compiled before at this shape, capture and the untimed replays)."""
    budget = make_budget(v, stats)
    engine = DecodeEngine(model, bs, cfg.prompt_len + cfg.gen_tokens, budget=budget, graph=graph,
                          compile=None if (cfg.compile and graph is None) else False)
    try:
        mask_BP = torch.ones_like(ids_BP)
        engine.prefill(ids_BP, mask_BP, cfg.gen_tokens, stop_at_eos=False)
        # warm-up: the capture (one eager step) and untimed replays; the cache holds gen_tokens
        warm = cfg.warm_steps(engine.graph_enabled)
        steps = max(1, min(steps, cfg.gen_tokens - 1 - warm))
        t0 = time.perf_counter()
        if warm:
            engine.decode(warm)
        _sync(engine.devices)
        warm_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ms, _ = engine.decode(steps, timed=True)
        _sync(engine.devices)
        wall = time.perf_counter() - t0
        rows = [r for r in budget.stats_rows() if r["decode"]] if (budget is not None and stats) else []
    finally:
        engine.release()
        if budget is not None:
            budget.remove()
    return ms, wall, rows, warm_s


def static_step_ms(model: nn.Module, make_budget: Callable[[Variant, bool], MoeBudget | None], v: Variant,
                   batch: int, prompt_len: int, cfg: ThroughputConfig, steps: int = 32, seed: int = 0) -> float:
    """The static engine's decode step of variant v for `batch` rows after prompts of `prompt_len`
    random tokens, timed as the grid times it (the median of `steps` graph replays on CUDA; host
    time per step on a CPU): what the serving benchmark sets beside its stream's steps."""
    one = replace(cfg, prompt_len=prompt_len, gen_tokens=cfg.warmup + steps + 3, timed_steps=steps)
    device = next(model.parameters()).device
    ids_BP = torch.randint(model.config.vocab_size, (batch, prompt_len),
                           generator=torch.Generator().manual_seed(seed)).to(device)
    ms, wall, _, _ = _decode(model, make_budget, v, batch, one, ids_BP, False, steps)
    return statistics.median(ms) if ms else 1e3 * wall / steps


def _profile(model: nn.Module, make_budget: Callable[[Variant, bool], MoeBudget | None], v: Variant, bs: int,
             cfg: ThroughputConfig, ids_BP: torch.Tensor, by_kernel: list[dict]) -> dict[str, tuple[float, float]]:
    """(ms, kernels) per step by kernel class over `stats_steps` eager steps (base/runtime/profile.py)."""
    from base.runtime.profile import profile_steps

    budget = make_budget(v, False)
    # the graph's kernels, run eagerly: compiled regions as in the timed pass
    engine = DecodeEngine(model, bs, cfg.prompt_len + cfg.gen_tokens, budget=budget, graph=False,
                          compile=cfg.compile and ids_BP.device.type == "cuda")
    try:
        engine.prefill(ids_BP, torch.ones_like(ids_BP), cfg.gen_tokens, stop_at_eos=False)
        engine.decode(1)  # warm
        steps = min(cfg.stats_steps, cfg.gen_tokens - 2)
        return profile_steps(model, lambda: engine.decode(steps), steps, by_kernel)
    finally:
        engine.release()
        if budget is not None:
            budget.remove()


def _measure_one(model: nn.Module, make_budget: Callable[[Variant, bool], MoeBudget | None], v: Variant,
                 bs: int, cfg: ThroughputConfig, ids_BP: torch.Tensor, extra_passes: bool) -> dict:
    """The timed pass, the statistics pass and (CUDA, extra_passes) the non-expert pass of one
    configuration: its row of throughput.csv (speed-up added later)."""
    device = ids_BP.device
    devices = model_devices(model)
    _peak_reset(devices)
    steps = cfg.timed_steps or cfg.gen_tokens - 1  # the prefill makes the first token
    ms, wall, _, warm_s = _decode(model, make_budget, v, bs, cfg, ids_BP, False, steps)
    step_ms = statistics.median(ms) if ms else 1e3 * wall / steps
    row = {
        "batch_size": bs, "method": v.method, "budget": v.budget, "k0": v.k0, "variant": v.label,
        "experts_impl": v.experts_impl or getattr(model.config, "_experts_implementation", None),
        "mode": "graph" if ms else "eager", "compiled": bool(ms) and cfg.compile,
        "warmup_s": warm_s, "steps": len(ms) if ms else steps,
        "ms_per_step": step_ms, "p90_ms": _quantile(ms, 0.9) if ms else None,
        "tokens_per_s": 1e3 * bs / step_ms, "peak_gb": _peak_gb(devices), "gpus": len(devices),
    }
    _, _, stats_rows, _ = _decode(model, make_budget, v, bs, cfg, ids_BP, True, cfg.stats_steps)
    n = max(1, len(stats_rows))
    row["union_mean"] = sum(r["union"] for r in stats_rows) / n
    row["kept_mean"] = sum(r["kept"] for r in stats_rows) / n
    if device.type == "cuda" and cfg.non_expert and extra_passes:
        with _ExpertsImpl(model, SKIP_EXPERTS):
            ne, _, _, _ = _decode(model, make_budget, v, bs, cfg, ids_BP, False, cfg.stats_steps)
        row["non_expert_ms"] = statistics.median(ne) if ne else None
        row["moe_share"] = 1 - row["non_expert_ms"] / step_ms if ne else None
    return row


Tables = tuple[list[dict], list[dict], list[dict]]  # (rows, profile, kernels)


def measure(model: nn.Module, make_budget: Callable[[Variant, bool], MoeBudget | None],
            variants: list[Variant], cfg: ThroughputConfig, seed: int, earlier: Tables | None = None,
            emit: Callable[[list[dict], list[dict], list[dict]], None] | None = None) -> Tables:
    """One row per (batch size, variant), see the module doc for the columns; at cfg.profile_batch,
    one row per (variant, kernel class) with ms per step (base/runtime/profile.py), and on a GPU
    one per (variant, class, kernel name).

    Resuming, by batch size: `emit(rows, profile, kernels)` gets the tables after each batch size
    is done (every variant and every interleaved repeat); a stopped run's (`earlier`) batch sizes
    are taken as they were, and the others measured whole. Why not finer: a batch size's variants
    are timed in interleaved rounds, and rounds split over two processes would not pair up."""
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    if cuda:
        register_skip_experts()
    # the non-expert pass and the profile: dense, oea and the first budget (each is another capture)
    first_budget = next((v.budget for v in variants if v.budget is not None), None)
    rows: list[dict] = []
    profile: list[dict] = []
    kernels: list[dict] = []
    bar = progress(total=len(cfg.batch_sizes) * len(variants) * cfg.repeats, desc="throughput", unit="pass")
    done_rows, done_profile, done_kernels = earlier or ([], [], [])
    for bs in cfg.batch_sizes:
        if any(r.get("batch_size") == bs for r in done_rows):  # measured whole by a stopped attempt
            rows += [r for r in done_rows if r.get("batch_size") == bs]
            profile += [r for r in done_profile if r.get("batch_size") == bs]
            kernels += [r for r in done_kernels if r.get("batch_size") == bs]
            bar.update(len(variants) * cfg.repeats)
            continue
        timed: dict[Variant, dict] = {}  # the graph-timed row of each variant (not the eager reference)
        gen = torch.Generator().manual_seed(seed + bs)
        ids_BP = torch.randint(0, model.config.vocab_size, (bs, cfg.prompt_len), generator=gen).to(device)
        for i, v in enumerate(variants):
            t0 = time.perf_counter()
            extra = v.budget is None or v.budget == first_budget
            with _ExpertsImpl(model, v.experts_impl):
                row = _measure_one(model, make_budget, v, bs, cfg, ids_BP, extra)
                rows.append(row)
                if cuda and cfg.eager_reference and bs == cfg.batch_sizes[0] and i == 0:
                    _, wall, _, _ = _decode(model, make_budget, v, bs, cfg, ids_BP, False, cfg.stats_steps, graph=False)
                    eager_ms = 1e3 * wall / cfg.stats_steps
                    rows.append({**row, "mode": "eager", "compiled": False, "warmup_s": None,
                                 "steps": cfg.stats_steps, "ms_per_step": eager_ms,
                                 "p90_ms": None, "tokens_per_s": 1e3 * bs / eager_ms, "non_expert_ms": None,
                                 "moe_share": None})
                if bs == cfg.profile_batch and extra:
                    layers = model.config.num_hidden_layers
                    names: list[dict] = []
                    for cls, (ms, n) in _profile(model, make_budget, v, bs, cfg, ids_BP, names).items():
                        profile.append({"batch_size": bs, "variant": v.label, "budget": v.budget, "class": cls,
                                        "ms_per_step": ms, "kernels_per_step": n, "kernels_per_layer": n / layers,
                                        "graph_ms_per_step": row["ms_per_step"]})
                    kernels += [{"batch_size": bs, "variant": v.label, "budget": v.budget, **k,
                                 "kernels_per_layer": k["kernels_per_step"] / layers} for k in names]
            row["config_s"] = time.perf_counter() - t0
            row["ms_runs"] = [row["ms_per_step"]]
            timed[v] = row
            bar.update()
            say(f"[throughput] batch {bs} {v.label} budget={v.budget}: {row['ms_per_step']:.2f} ms/step "
                f"({row['config_s']:.1f} s)")
        _repeat(model, make_budget, variants, bs, cfg, ids_BP, timed, bar.update)
        if emit is not None:
            emit(rows, profile, kernels)
    bar.close()
    _speedups(rows)
    return rows, profile, kernels


def _repeat(model: nn.Module, make_budget: Callable[[Variant, bool], MoeBudget | None], variants: list[Variant],
            bs: int, cfg: ThroughputConfig, ids_BP: torch.Tensor, timed: dict[Variant, dict],
            tick: Callable[[], object] = lambda: None) -> None:
    """cfg.repeats - 1 more timed passes of every variant, each round in a rotated order (round r
    starts at variant r), so no configuration always runs first or after the same neighbour; each
    row's ms_per_step becomes the median of its passes, with their spread and the passes themselves
    (in round order, so two variants' passes pair up by round)."""
    steps = cfg.timed_steps or cfg.gen_tokens - 1
    for r in range(1, cfg.repeats):
        k = r % len(variants)
        for v in variants[k:] + variants[:k]:
            with _ExpertsImpl(model, v.experts_impl):
                ms, wall, _, _ = _decode(model, make_budget, v, bs, cfg, ids_BP, False, steps)
            timed[v]["ms_runs"].append(statistics.median(ms) if ms else 1e3 * wall / steps)
            tick()
    for row in timed.values():
        runs = row["ms_runs"]
        row["ms_per_step"] = statistics.median(runs)
        row["tokens_per_s"] = 1e3 * bs / row["ms_per_step"]
        row["repeats"], row["ms_min"], row["ms_max"] = len(runs), min(runs), max(runs)
        row["ms_runs"] = ";".join(f"{x:.4f}" for x in runs)


def _speedups(rows: list[dict]) -> None:
    """speedup = tokens/s over the dense row (model's own experts implementation) of the same batch."""
    dense = {(r["batch_size"], r["mode"]): r["tokens_per_s"] for r in rows
             if r["method"] == "dense" and r["variant"] == "dense"}
    for r in rows:
        base = dense.get((r["batch_size"], r["mode"]))
        r["speedup_vs_dense"] = r["tokens_per_s"] / base if base else None
