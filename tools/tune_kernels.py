"""Tune the expert FFN's launch configs per (H, I, T) on this GPU -> kernels/configs/<gpu>.json.

    python -m tools.tune_kernels                                  # every model of tools/timing.py, all T
    python -m tools.tune_kernels --models qwen3_30b_a3b --ts 16 64 --out /tmp/cfg.json
    python -m tools.tune_kernels --models qwen3_30b_a3b --ts 1 16 64 --paths reduce   # the fold alone

Objective per shape: the mean over three routings (budgets 16 and 32 after router_sum selection,
and the dense union) of time / memory floor, so one config serves budgeted and dense decoding.
(Run v2 also had budget 8: its gain at T=128 picked TB=128, which cost 1.3-1.4x at M >= 32.)
Search: coordinate descent from the installed entry's pair (the table's launches for that T, or the
nearest T's, else the defaults), timed first in the same run: gate_up candidates with its down,
then down candidates with the best gate_up, so a re-tune installs nothing slower by its own objective
than what it replaces (a search from the first down did: on an H100 its 16-token pick timed 1.174
against the installed pair's 1.121 and made the step 3-5 % slower, results/roofline/tables_2026-12-07);
then the reduce inside the down launch with those two
(`reduce_in_down`: three launches, the same sums), kept where it beat the four launches in each of
three alternations. With both paths tuned, `kept_max`: the largest kept bound (budget 16, 32,
dense) up to which v3 beat the four launches in each of three alternations (kernels/experts.py takes
v3 for kept lists no longer than it). Every candidate's output is first checked against `experts_reference` on
this GPU (largest error within 2 % of the largest output); one that differs, or fails to compile or
launch, is logged and never chosen, so no entry this tool installs is unchecked. Timed as
tools/bench_kernels.py times (CUDA graphs, weight sets
rotated). Entries not tuned fall back to the nearest T, then to configs/default.json. The table is
keyed by (H, I, T): of models sharing an expert shape, the first listed is tuned and the others are
skipped with a line saying so.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from kernels.experts import (
    CONFIG_DIR,
    ExpertsConfig,
    _load_configs,
    config_key,
    device_name,
    experts_reference,
    fused_experts,
)
from kernels.select import select_reassign
from tools.timing import (
    MODELS,
    expert_bytes,
    make_routing,
    make_weight_sets,
    time_graph,
)

# PER_SM <= the CTAs an SM holds at once (registers and shared memory, read off an sm_90 build),
# so every persistent program starts at once and none trails the others.
# (TB pairs per tile, BI intermediate rows, BH hidden per step, num_warps, num_stages, PER_SM)
GATE_UP = [(16, 32, 128, 4, 4, 3), (16, 64, 128, 4, 3, 2), (16, 32, 256, 4, 3, 2), (16, 16, 256, 4, 4, 3),
           (32, 32, 128, 4, 4, 2), (64, 32, 64, 4, 4, 2), (16, 64, 64, 4, 5, 2), (16, 32, 128, 8, 4, 2),
           (64, 64, 64, 8, 3, 2), (32, 64, 64, 4, 4, 2), (128, 32, 64, 8, 3, 2)]  # fmt: skip
# (TB, BHO hidden outputs per work item, BI intermediate per step, num_warps, num_stages, PER_SM)
DOWN = [(16, 32, 128, 4, 4, 4), (16, 64, 128, 4, 4, 3), (16, 128, 64, 4, 4, 2), (16, 64, 256, 4, 3, 2),
        (32, 64, 128, 4, 4, 2), (64, 64, 64, 4, 4, 2), (16, 32, 256, 4, 3, 4), (16, 128, 128, 8, 3, 1),
        (64, 128, 64, 8, 3, 2), (32, 128, 64, 4, 4, 2), (128, 64, 64, 8, 3, 2)]  # fmt: skip
TS = [1, 8, 16, 32, 64, 128]
# v3 (kernels/experts.py, a kept list; T <= V3_MAX_TOKENS): gate_up over (kept slot, I block),
# down with one program per BHO output columns walking every kept expert.
# (BI, BH, num_warps, num_stages, PER_SM)
GATE_UP_KEPT = [(32, 128, 4, 4, 3), (64, 128, 4, 3, 2), (32, 256, 4, 3, 2), (16, 256, 4, 4, 3), (64, 64, 4, 4, 2),
                (32, 128, 8, 4, 2)]  # fmt: skip
# (BHO, BI, num_warps, num_stages)
DOWN_KEPT = [(16, 128, 4, 4), (16, 256, 4, 3), (16, 256, 4, 4), (32, 128, 4, 4), (32, 256, 4, 3), (16, 128, 4, 5),
             (16, 512, 4, 3), (32, 128, 8, 4)]  # fmt: skip


def gate_up_kept_cfg(c: tuple) -> dict:
    return {"BI": c[0], "BH": c[1], "num_warps": c[2], "num_stages": c[3], "PER_SM": c[4]}


def down_kept_cfg(c: tuple) -> dict:
    return {"BHO": c[0], "BI": c[1], "num_warps": c[2], "num_stages": c[3]}


def gate_up_cfg(c: tuple) -> dict:
    return {"TB": c[0], "BI": c[1], "BH": c[2], "num_warps": c[3], "num_stages": c[4], "PER_SM": c[5]}


def down_cfg(c: tuple) -> dict:
    return {"TB": c[0], "BHO": c[1], "BI": c[2], "num_warps": c[3], "num_stages": c[4], "PER_SM": c[5]}


def as_candidate(cfg: dict, to_cfg) -> tuple | None:
    """An installed launch (a table's dict) as a candidate tuple of `to_cfg`'s list (gate_up_cfg, ...),
    None where it lacks one of the candidates' fields (an older table's entry)."""
    keys = list(to_cfg(tuple(range(16))))
    return tuple(cfg[k] for k in keys) if all(k in cfg for k in keys) else None


def installed_pair(gate_up: dict, down: dict, to_gate_up, to_down) -> tuple | None:
    """The installed (gate_up, down) launches as the search's start pair, None unless both convert."""
    pair = (as_candidate(gate_up, to_gate_up), as_candidate(down, to_down))
    return pair if all(pair) else None


class WrongOutput(ValueError):
    """A candidate config whose output is not the reference's: never timed, never installed."""


def matches_reference(out_TH, ref_TH) -> bool:
    """The kernel's output against experts_reference's (float64): the largest error within 2 % of
    the largest output (bf16 weights and outputs; a wrong tile or mask is off by the output's size)."""
    return bool((out_TH.double() - ref_TH).abs().max() <= 2e-2 * ref_TH.abs().max())


def check_output(run, ref_TH, what: str) -> None:
    """Raise WrongOutput unless run() (one call of the candidate) gives the reference's output."""
    if not matches_reference(run(), ref_TH):
        raise WrongOutput(f"{what}: its output differs from experts_reference's")


def tune_shape(model: dict, T: int, sets: list, copy_gbps: float, reps: int = 10, log=print,
               given: ExpertsConfig | None = None, start: ExpertsConfig | None = None) -> dict:
    """Best {gate_up, down} for one model and T; also the normalised objective it reached and
    whether the reduce inside the down launch is faster with them. `given`: no search, that
    config's gate_up and down (the installed ones: path `reduce` checks the fold alone); `start`:
    the installed ones, where the search starts (timed first, kept unless a candidate beats them)."""
    H, I, E, K = model["H"], model["I"], model["E"], model["K"]
    dev = sets[0][0].device
    r = make_routing(H, E, K, T, model["norm"], skew=False, device=dev, seed=T, dtype=sets[0][0].dtype)
    cases = []
    routings = [(r.idx_TK, r.w_TK)]
    for M in (16, 32):
        sel = select_reassign(r.probs_TE, r.idx_TK, r.w_TK, r.active_T, M, kind="router_sum")
        routings.append((sel.topk_idx_TK, sel.topk_w_TK))
    gu0, dn0 = sets[0]
    for idx, w in routings:
        n_run = int(torch.unique(idx[w != 0]).numel())
        floor_us = expert_bytes(n_run, H, I, T) / (copy_gbps * 1e3)
        cases.append((idx, w, floor_us, experts_reference(r.x_TH, gu0, dn0, idx, w)))

    def objective(cfg: ExpertsConfig) -> float:  # the four-launch path (no kept list)
        total = 0.0
        for idx, w, floor_us, ref in cases:  # checked on this GPU before it is timed
            check_output(lambda idx=idx, w=w: fused_experts(r.x_TH, gu0, dn0, idx, w, config=cfg, fit=False), ref, "four-launch")
            calls = [lambda gu=gu, dn=dn, x=r.x_TH, idx=idx, w=w: fused_experts(x, gu, dn, idx, w, config=cfg, fit=False)
                     for gu, dn in sets]  # fmt: skip
            us, _ = time_graph(calls, reps, dev)
            total += us / floor_us
        return total

    if given is not None:
        return _reduce_in_down(objective, given.gate_up, given.down, float("inf"), len(cases), log)
    first = start and installed_pair(start.gate_up, start.down, gate_up_cfg, down_cfg)
    best_g, best_d, best = _search_pair(objective, lambda g, d: ExpertsConfig(gate_up_cfg(g), down_cfg(d)),
                                        GATE_UP, DOWN, ("gate_up", "down"), log, first)
    if best == float("inf"):
        raise RuntimeError(f"H={H}, I={I}, T={T}: no four-launch candidate launched and matched experts_reference")
    return _reduce_in_down(objective, gate_up_cfg(best_g), down_cfg(best_d), best, len(cases), log)


def _search_pair(objective, config, gate_ups: list, downs: list, names: tuple[str, str], log,
                 start: tuple | None = None) -> tuple:
    """(best gate_up, best down, its objective) of objective(config(gate_up, down)), one launch at a
    time: every gate_up with the first down, then the other downs with the best gate_up. `start`:
    a (gate_up, down) pair timed first (the installed one, in or outside the lists), whose down the
    gate_ups are timed with; it stays the best unless a candidate's objective is lower. A candidate
    that fails to compile or launch is logged and passed over."""

    def value(g, d, candidate: str) -> float:
        try:
            return objective(config(g, d))
        except Exception as e:  # noqa: BLE001 - a candidate that fails to compile or launch
            log(f"    {candidate} failed: {type(e).__name__}: {str(e)[:120]}")
            return float("inf")

    best_g, best_d, best = gate_ups[0], downs[0], float("inf")
    timed = set()
    if start is not None:
        best_g, best_d = start
        best = value(best_g, best_d, f"installed {start}")
        timed.add(start)
    first_d = best_d
    for g in gate_ups:
        if (g, first_d) not in timed and (v := value(g, first_d, f"{names[0]} {g}")) < best:
            best, best_g = v, g
        timed.add((g, first_d))
    for d in downs:
        if (best_g, d) not in timed and (v := value(best_g, d, f"{names[1]} {d}")) < best:
            best, best_d = v, d
        timed.add((best_g, d))
    return best_g, best_d, best


def _reduce_in_down(objective, gate_up: dict, down: dict, best: float, n_cases: int, log) -> dict:
    """The entry for these gate_up and down configs, with the reduce inside the down launch (three
    launches, the same sums) where it beat the four launches in each of three alternations (one
    pair would be noise); `best`: the four launches' objective found by the search."""
    plain = ExpertsConfig(gate_up, down, use_kept=False)
    folded = ExpertsConfig(gate_up, down, use_kept=False, reduce_in_down=True)
    try:
        pairs = [(objective(plain), objective(folded)) for _ in range(3)]
    except WrongOutput as e:
        log(f"    reduce in down: not kept ({e})")
        return {"gate_up": gate_up, "down": down, "objective": round(best / n_cases, 3), "reduce_in_down": False}
    fold = all(f < p for p, f in pairs)
    log(f"    reduce in down: {'kept' if fold else 'not kept'} ({', '.join(f'{f / p:.3f}' for p, f in pairs)} of the "
        f"four-launch time)")
    best = min(f for _, f in pairs) if fold else min(best, *(p for p, _ in pairs))
    return {"gate_up": gate_up, "down": down, "objective": round(best / n_cases, 3), "reduce_in_down": fold}


def tune_kept_shape(model: dict, T: int, sets: list, copy_gbps: float, reps: int = 10, log=print,
                    start: ExpertsConfig | None = None) -> dict:
    """Best {gate_up_kept, down_kept} (the v3 path) for one model and T, same objective as tune_shape;
    `start`: the installed launches, timed first (as tune_shape's)."""
    H, I, E, K = model["H"], model["I"], model["E"], model["K"]
    dev = sets[0][0].device
    r = make_routing(H, E, K, T, model["norm"], skew=False, device=dev, seed=T, dtype=sets[0][0].dtype)
    cases = []
    gu0, dn0 = sets[0]
    for M in (None, 16, 32):
        sel = select_reassign(r.probs_TE, r.idx_TK, r.w_TK, r.active_T, M, kind="router_sum")
        n_run = int(torch.unique(sel.topk_idx_TK[sel.topk_w_TK != 0]).numel())
        cases.append((sel, expert_bytes(n_run, H, I, T) / (copy_gbps * 1e3),
                      experts_reference(r.x_TH, gu0, dn0, sel.topk_idx_TK, sel.topk_w_TK)))

    def objective(cfg: ExpertsConfig) -> float:
        total = 0.0
        for sel, floor_us, ref in cases:  # checked on this GPU before it is timed
            check_output(lambda s=sel: fused_experts(r.x_TH, gu0, dn0, s.topk_idx_TK, s.topk_w_TK, config=cfg,
                                                     keep_M=s.keep_M, fit=False), ref, "kept-list")
            calls = [lambda gu=gu, dn=dn, s=sel: fused_experts(r.x_TH, gu, dn, s.topk_idx_TK, s.topk_w_TK, config=cfg,
                                                               keep_M=s.keep_M, fit=False) for gu, dn in sets]  # fmt: skip
            us, _ = time_graph(calls, reps, dev)
            total += us / floor_us
        return total

    base = ExpertsConfig()
    first = start and installed_pair(start.gate_up_kept, start.down_kept, gate_up_kept_cfg, down_kept_cfg)
    best_g, best_d, best = _search_pair(
        objective, lambda g, d: ExpertsConfig(base.gate_up, base.down, gate_up_kept_cfg(g), down_kept_cfg(d), True),
        GATE_UP_KEPT, DOWN_KEPT, ("gate_up_kept", "down_kept"), log, first)
    if best == float("inf"):
        raise RuntimeError(f"H={H}, I={I}, T={T}: no kept-list candidate launched and matched experts_reference")
    return {"gate_up_kept": gate_up_kept_cfg(best_g), "down_kept": down_kept_cfg(best_d),
            "objective_kept": round(best / len(cases), 3)}


def kept_bound(model: dict, T: int, sets: list, entry: dict, reps: int = 10, log=print) -> dict:
    """{"kept_max": b}: v3 (the kept list) against the four-launch path with this entry's configs,
    per kept bound in increasing order (the budgets 16 and 32, then dense, whose kept list is E
    long), three alternations each; b is the largest bound up to which v3 won every alternation
    at every bound (0: not even at 16). kernels/experts.py then takes v3 only for kept lists of at
    most b experts, a bound the host knows (keep_M's length), so dense keeps the path that is
    faster for it."""
    H, E, K = model["H"], model["E"], model["K"]
    dev = sets[0][0].device
    r = make_routing(H, E, K, T, model["norm"], skew=False, device=dev, seed=T, dtype=sets[0][0].dtype)
    four = ExpertsConfig(entry["gate_up"], entry["down"], use_kept=False,
                         reduce_in_down=bool(entry.get("reduce_in_down", False)))
    kept = ExpertsConfig(entry["gate_up"], entry["down"], entry["gate_up_kept"], entry["down_kept"], use_kept=True)
    kept_max = 0
    for M in (16, 32, None):
        sel = select_reassign(r.probs_TE, r.idx_TK, r.w_TK, r.active_T, M, kind="router_sum")

        def timed(cfg: ExpertsConfig, sel=sel) -> float:
            calls = [lambda gu=gu, dn=dn: fused_experts(r.x_TH, gu, dn, sel.topk_idx_TK, sel.topk_w_TK, config=cfg,
                                                        keep_M=sel.keep_M, fit=False) for gu, dn in sets]  # fmt: skip
            return time_graph(calls, reps, dev)[0]

        bound = int(sel.keep_M.shape[0])
        pairs = [(timed(four), timed(kept)) for _ in range(3)]
        log(f"    kept bound {bound}: v3 {', '.join(f'{k / f:.3f}' for f, k in pairs)} of the four-launch time")
        if not all(k < f for f, k in pairs):
            break
        kept_max = bound
    return {"kept_max": kept_max}


def one_model_per_key(models: dict, log=print) -> dict:
    """The models whose expert shape (H, I) no earlier one has: the table is keyed by (H, I, T), so a
    second model of the same shape (DeepSeek-V2-Lite and Qwen1.5-MoE-A2.7B are both 2048 x 1408)
    would overwrite the first's entries after the time spent tuning it; the first listed keeps them."""
    kept: dict = {}
    for name, m in models.items():
        twin = next((k for k, v in kept.items() if (v["H"], v["I"]) == (m["H"], m["I"])), None)
        if twin is None:
            kept[name] = m
        else:
            log(f"  tune: {name} skipped: its H={m['H']}, I={m['I']} entries would replace {twin}'s (tuned first)")
    return kept


def tune(models: dict, ts: list[int], copy_gbps: float, deadline: float, reps: int = 10, log=print,
         device: str = "cuda", paths: tuple[str, ...] = ("v2", "v3")) -> dict:  # fmt: skip
    """Tuned table {config_key: entry} for every (model, T) reached before `deadline`; `paths`:
    which expert paths to tune (v3 only at T <= V3_MAX_TOKENS); `reduce` (without v2): only
    whether the reduce inside the down launch beats the four launches with the installed configs."""
    from kernels.experts import V3_MAX_TOKENS, get_config

    table: dict = {}
    for name, m in one_model_per_key(models, log).items():
        sets = make_weight_sets(m["E"], m["H"], m["I"], 3, device)
        for T in ts:
            if time.time() > deadline:
                log(f"  tune: out of time before {name} T={T}")
                return table
            t0 = time.time()
            entry = {}
            installed = get_config(m["H"], m["I"], T, torch.device(device))
            if "v2" in paths or "reduce" in paths:
                entry = tune_shape(m, T, sets, copy_gbps, reps, log, None if "v2" in paths else installed, installed)
            if "v3" in paths and T <= V3_MAX_TOKENS:
                entry.update(tune_kept_shape(m, T, sets, copy_gbps, reps, log, installed))
                if "v2" in paths:  # both paths tuned: which one each kept bound takes
                    entry.update(kept_bound(m, T, sets, entry, reps, log))
            table[config_key(m["H"], m["I"], T)] = entry
            log(f"  tune {name} T={T}: {entry} ({time.time() - t0:.1f}s)")
        del sets
        if device == "cuda":
            torch.cuda.empty_cache()
    return table


def install(table: dict, device: torch.device, out: Path | None = None) -> Path:
    """Merge `table` into configs/<gpu>.json (and copy it to `out`); later launches use it."""
    return install_named(table, device_name(device), out)


def install_named(table: dict, name: str, out: Path | None = None) -> Path:
    """`install` into configs/<name>.json (a table made from another machine's timings)."""
    if name == "cpu":  # the CPU's launches are the interpreter's: a table there would change CPU runs for nothing
        raise ValueError("kernels/configs/ holds GPUs' tables: a CPU's timings install nothing")
    path = CONFIG_DIR / f"{name}.json"
    merged = json.loads(path.read_text()) if path.exists() else {}
    for key, entry in table.items():  # per path: tuning v3 alone keeps an entry's v2 configs
        merged[key] = {**merged.get(key, {}), **entry}
    text = json.dumps(dict(sorted(merged.items())), indent=1) + "\n"
    path.write_text(text)
    if out is not None:
        Path(out).write_text(text)
    _load_configs.cache_clear()
    return path


def main() -> None:
    from tools.timing import copy_bandwidth

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS), metavar="MODEL",
                    help=f"expert shapes of tools/timing.py (default all): {', '.join(MODELS)}")
    ap.add_argument("--ts", nargs="*", type=int, default=TS)
    ap.add_argument("--budget-s", type=float, default=600)
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    ap.add_argument("--paths", nargs="*", default=["v2", "v3"],
                    help="expert paths to tune: v2 (four launches), v3; reduce (alone): whether the reduce inside "
                         "v2's down launch beats it with the installed configs")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device here: tools.tune_kernels times a GPU's expert launches")
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev)
    print(f"copy bandwidth {bw:.0f} GB/s")
    table = tune({k: MODELS[k] for k in args.models}, args.ts, bw, time.time() + args.budget_s, paths=tuple(args.paths))
    print(f"wrote {install(table, dev, args.out)}")


if __name__ == "__main__":
    main()
