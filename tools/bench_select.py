"""Time the selection kernel alone, rule by rule, against an earlier version of it (an A/B of one file).

    python -m tools.bench_select --csv /tmp/select.csv                          # this tree's kernel
    python -m tools.bench_select --baseline /tmp/select_old.py --csv ...        # and another kernels/select.py
    python -m tools.bench_select --smoke                                        # CPU check of the harness

Each case is `route_select` as the budgeted model calls it after the router's GEMM (Qwen3-30B-A3B's
layer: 128 experts, top-8, hidden 2048), one of the rules below at one token count T; each is timed
as a CUDA graph of 20 launches (a step's worth of layers is 48) by tools/timing.time_graph, whose
figure is the median per launch. The implementations (this tree's, and the baseline file loaded as a
module of its own) run in interleaved rounds, the order rotated each round, `--rounds` rounds (at
least 5); the table gives each case's median over the rounds and the range. Each implementation
uses its own tuned launch (kernels/configs/<gpu>.json) unless `--warps` names warp counts to time.

`--forms route,after,empty` adds, to locate the time inside the launch without counters: `after`,
the same rules through `select_reassign` (the selection after the model's own router: softmax and
top-k given, so its time less route_select's is the routing's share), and `empty`, a launch that
stores one value (the graph's floor for one kernel).

`--forms gemv` (alone) times instead the router's GEMM with the selection, this tree's two forms as
the two implementations: `gemm`, what the budgeted model runs (base/method/backends.py `_fused_call`:
the GEMM on the skinny kernel where this GPU's table says it beat cuBLAS, else cuBLAS, then
`route_select`: two launches) and `gemv`, `route_select_gemv` (the GEMM's programs and the selection
in one launch); the table gives gemv over gemm per round.
"""
from __future__ import annotations

import argparse
import dataclasses
from functools import partial
from pathlib import Path

import pandas as pd
import torch
import triton
import triton.language as tl

from analysis.kernel_ab import medians, ratios, stages
from tools.timing import (
    check_ab_arguments,
    interleaved_rounds,
    load_module,
    select_layer,
)

MODEL = {"H": 2048, "E": 128, "K": 8}
SMOKE = {"H": 32, "E": 16, "K": 4}
# (name, kind, tier, k0, static score, budget): dense is the union (budget None, nothing dropped)
RULES = (
    ("dense", "router_sum", "none", 1, False, None),
    ("fixed", "router_sum", "none", 1, True, 16),
    ("base", "base", "none", 1, False, 16),
    ("base_anchor", "base", "anchor", 1, False, 16),
    ("top1_union", "router_sum", "top1_union", 1, False, 16),
    ("oea", "router_sum", "oea", 1, False, None),
)


@triton.jit
def _empty_kernel(out_ptr):
    tl.store(out_ptr, 1.0)


def cases(mod, dev: torch.device, model: dict, ts, budget: int, warps,
          forms=("route",)) -> list[tuple[dict, object]]:
    """(labels, a call of `mod.route_select` or `mod.select_reassign`) for every form, rule, token
    count and launch; `empty` a one-store launch."""
    H, E, K = model["H"], model["E"], model["K"]
    g = torch.Generator(device="cpu").manual_seed(7)
    layer = select_layer(H, E, dev, g)  # the router and predictor tools/tune_step_kernels.py tunes on
    pred_b_E, dtype = layer.pred_b_E, layer.dtype
    score_E = torch.rand(E, generator=g).to(dev)
    out = []
    for T in ts:
        logits_TE, g_TE, active_T = layer.inputs(T, g)
        for name, kind, tier, k0, static, m in RULES:
            m = None if m is None else min(m, budget, E)
            rule = mod.Rule(tier=tier, k0=k0)
            for nw in warps:
                launch = None if nw is None else dataclasses.replace(mod.select_launch(E, T, dev), num_warps=nw)
                common = dict(kind=kind, g_TE=g_TE if kind == "base" else None,  # noqa: C408
                              pred_b_E=pred_b_E if kind == "base" else None, score_E=score_E if static else None,
                              rule=rule, launch=launch)
                labels = {"rule": name, "T": T, "num_warps": nw if nw is not None else "tuned"}
                if "route" in forms:
                    fn = partial(mod.route_select, logits_TE, K, active_T, m, norm_topk=True, **common)
                    out.append(({**labels, "form": "route_select"}, fn))
                if "after" in forms:
                    probs_TE = logits_TE.float().softmax(-1)
                    w_TK, idx_TK = probs_TE.topk(K, dim=-1)
                    w_TK = (w_TK / w_TK.sum(-1, keepdim=True)).to(dtype)
                    fn = partial(mod.select_reassign, probs_TE, idx_TK, w_TK, active_T, m, **common)
                    out.append(({**labels, "form": "select_reassign"}, fn))
    if "empty" in forms and dev.type == "cuda":
        one = torch.zeros(1, device=dev)
        out.append(({"rule": "(empty launch)", "T": 0, "num_warps": 4, "form": "empty"},
                    partial(lambda o: _empty_kernel[(1,)](o), one)))
    return out


def router_cases(dev: torch.device, model: dict, ts, budget: int) -> list[tuple[dict, dict]]:
    """(labels, {"gemm": call, "gemv": call}) per rule and token count: the router's GEMM over
    [router; predictor] rows for `base` (router rows alone for the others and wherever the union
    fits, as TritonSelection.route chooses), then the selection, in the model's two launches and
    in route_select_gemv's one."""
    from base.method.backends import SoftmaxTopK, _fused_call
    from kernels.select import Rule, arrival_counter, route_select_gemv, union_fits

    H, E, K = model["H"], model["E"], model["K"]
    g = torch.Generator(device="cpu").manual_seed(7)
    layer = select_layer(H, E, dev, g)
    router = SoftmaxTopK(layer.wcat_CH[:E].contiguous(), K, norm_topk=True)
    score_E = torch.rand(E, generator=g).to(dev)
    counter = arrival_counter(dev)  # one per layer in the model; here one launch at a time
    out = []
    for T in ts:
        z_TH = torch.randn(T, H, generator=g).to(dev, layer.dtype)
        active_T = torch.ones(T, dtype=torch.bool, device=dev)
        for name, kind, tier, k0, static, m in RULES:
            m = None if m is None else min(m, budget, E)
            rule = Rule(tier=tier, k0=k0)
            fits = union_fits(rule, m, T, K, E)
            base = kind == "base" and not static and not fits
            weight = layer.wcat_CH if base else router.weight_EH
            kw = dict(kind=kind if not fits else "router_sum", rule=rule,  # noqa: C408
                      pred_b_E=layer.pred_b_E if base else None, score_E=score_E if static and not fits else None)
            calls = {"gemm": partial(_fused_call, router, weight, None, z_TH, active_T, m, 0, **kw),
                     "gemv": partial(route_select_gemv, z_TH, weight, E, K, active_T, m, norm_topk=True,
                                     counter=counter, **kw)}
            out.append(({"rule": name, "T": T, "num_warps": "tuned", "form": "router+select"}, calls))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", help="another kernels/select.py to time against this tree's")
    ap.add_argument("--csv", default=None, help="every round's timing (a table per round and case)")
    ap.add_argument("--ts", default="1,16,64", help="token counts")
    ap.add_argument("--warps", default="", help="warp counts to time (default: each launch as tuned)")
    ap.add_argument("--rounds", type=int, default=7,
                    help="interleaved rounds (>= 5; 7 let analysis.kernel_ab call a difference among ~80 cases after Holm)")
    ap.add_argument("--reps", type=int, default=20, help="graph replays per timing (tools/timing.time_graph)")
    ap.add_argument("--forms", default="route",
                    help="route (route_select), after (select_reassign), empty; or gemv alone (the router's GEMM too)")
    ap.add_argument("--smoke", action="store_true", help="a tiny model on this machine's device")
    args = ap.parse_args()
    check_ab_arguments(ap, args)
    try:
        ts = [int(t) for t in args.ts.split(",")]
        warps = [int(w) for w in args.warps.split(",")] if args.warps else [None]
    except ValueError:
        ap.error(f"--ts and --warps take comma-separated integers, got {args.ts!r} / {args.warps!r}")
    if any(t < 1 for t in ts) or any(w not in (1, 2, 4, 8, 16) for w in warps if w is not None):
        ap.error("--ts must be >= 1 and --warps in 1, 2, 4, 8, 16")
    forms = tuple(args.forms.split(","))
    if forms != ("gemv",) and (not forms or not set(forms) <= {"route", "after", "empty"}):
        ap.error(f"--forms takes route, after and/or empty, or gemv alone, got {args.forms!r}")
    if forms == ("gemv",) and args.baseline:
        ap.error("--forms gemv compares this tree's two forms; it takes no --baseline")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = SMOKE if args.smoke or dev.type != "cuda" else MODEL
    import kernels.select as current

    impls = {"current": current}
    if args.baseline:
        impls["baseline"] = load_module(args.baseline, "_select_baseline")
    budget = 4 if model is SMOKE else 16
    if forms == ("gemv",):
        work, names = router_cases(dev, model, ts, budget), ["gemm", "gemv"]
    else:
        per_impl = {name: cases(mod, dev, model, ts, budget, warps, forms) for name, mod in impls.items()}
        names = list(impls)
        work = [(per_impl[names[0]][i][0], {name: per_impl[name][i][1] for name in names})
                for i in range(len(per_impl[names[0]]))]
    t = pd.DataFrame(interleaved_rounds(work, names, args.rounds, args.reps, dev))
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        t.to_csv(args.csv, index=False)
    pd.set_option("display.width", 200)
    print(medians(t).round(3).to_string(index=False))
    if len(names) == 2:
        ref, other = ("gemm", "gemv") if forms == ("gemv",) else ("baseline", "current")
        print(f"\n{other} over {ref} in the same round: median [min, max]")
        print(ratios(t, ref).round(3).to_string(index=False))
    split = stages(t)
    if not split.empty:
        print("\nthe launch by difference (analysis/kernel_ab.py), µs")
        print(split.round(3).to_string(index=False))
    print(f"us per launch: median [min, max] over {args.rounds} interleaved rounds, one process")


if __name__ == "__main__":
    main()
