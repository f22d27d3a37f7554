"""Time the expert FFN's kernels against an earlier version of them (an A/B of one file).

    python -m tools.bench_experts --baseline /tmp/experts_old.py --csv /tmp/experts.csv   # on a CUDA machine
    python -m tools.bench_experts --smoke                                                  # CPU check of the harness

Each case is `fused_experts` as the budgeted model calls it for one MoE layer (default Qwen3-30B-A3B's:
128 experts, top-8, hidden 2048, intermediate 768, bf16) at T tokens, on the (idx_TK, w_TK) that
`router_sum` selection leaves at budget M, or on the router's own top-k (`dense`: the union), random
routing (tools/timing.make_routing). Each implementation (this tree's kernels/experts.py, and the
baseline file loaded as a module of its own) reads the same tuned table (kernels/configs/<gpu>.json)
and runs the path it picks; each case is a CUDA graph of one call per weight set (3 sets, so L2 never
holds the next call's weights), timed by tools/timing.time_graph (median per call). The
implementations run in interleaved rounds, the order rotated each round, `--rounds` rounds (at least
5). The table gives each case's median µs over the rounds with its range, the fraction of the copy
bandwidth measured in the same process (the kept experts' bytes: tools/timing.expert_bytes), and
this tree's µs over the baseline's per round with an exact Mann-Whitney test, Holm-corrected over
the cases (analysis/kernel_ab.py). Before any timing, the implementations' outputs must agree
(bf16 rounding apart), else it stops: a fast wrong kernel is no result.
"""
from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import pandas as pd
import torch

from analysis.kernel_ab import medians, tested
from tools.timing import (
    MODELS,
    SMOKE_MODELS,
    check_ab_arguments,
    copy_bandwidth,
    expert_bytes,
    interleaved_rounds,
    load_module,
    make_routing,
    make_weight_sets,
)


def cases(mods: dict, dev: torch.device, name: str, m: dict, ts, budgets) -> list[tuple[dict, dict]]:
    """(labels, {impl: call}) per token count and budget: every implementation's call on the same
    weight sets and routing."""
    from kernels.select import select_reassign

    H, I, E, K = m["H"], m["I"], m["E"], m["K"]
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32  # the interpreter runs fp32
    sets = make_weight_sets(E, H, I, 3, dev, dtype=dtype)
    out = []
    for T in ts:
        r = make_routing(H, E, K, T, m["norm"], False, dev, seed=T, dtype=dtype)
        for M in budgets:
            if M is None:
                idx, w = r.idx_TK, r.w_TK
            else:
                sel = select_reassign(r.probs_TE, r.idx_TK, r.w_TK, r.active_T, M, kind="router_sum")
                idx, w = sel.topk_idx_TK, sel.topk_w_TK
            kept = int(torch.unique(idx[w != 0]).numel())
            labels = {"model": name, "T": T, "M": "dense" if M is None else M, "kept": kept,
                      "MB": round(expert_bytes(kept, H, I, T) / 1e6, 3)}
            calls = {impl: [partial(mod.fused_experts, r.x_TH, gu, dn, idx, w) for gu, dn in sets]
                     for impl, mod in mods.items()}
            out.append((labels, calls))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", help="another kernels/experts.py to time against this tree's")
    ap.add_argument("--csv", default=None, help="every round's timing (a row per round, case and implementation)")
    ap.add_argument("--models", default="qwen3_30b_a3b", help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--ts", default="1,16,64", help="token counts")
    ap.add_argument("--budgets", default="16,dense", help="budgets M, and `dense` for the router's own top-k")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (>= 5)")
    ap.add_argument("--reps", type=int, default=20, help="graph replays per timing (tools/timing.time_graph)")
    ap.add_argument("--smoke", action="store_true", help="a tiny model on this machine's device")
    args = ap.parse_args()
    check_ab_arguments(ap, args)
    models = args.models.split(",")
    if not args.smoke and not set(models) <= set(MODELS):
        ap.error(f"--models takes {', '.join(MODELS)}, got {args.models!r}")
    try:
        ts = [int(t) for t in args.ts.split(",")]
        budgets = [None if b == "dense" else int(b) for b in args.budgets.split(",")]
    except ValueError:
        ap.error(f"--ts takes integers and --budgets integers or `dense`, got {args.ts!r} / {args.budgets!r}")
    if any(t < 1 for t in ts) or any(b is not None and b < 1 for b in budgets):
        ap.error("--ts and --budgets must be >= 1")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = SMOKE_MODELS if args.smoke or dev.type != "cuda" else {k: MODELS[k] for k in models}
    import kernels.experts as current

    mods = {"current": current}
    if args.baseline:
        mods["baseline"] = load_module(args.baseline, "_experts_baseline")
    names = list(mods)
    work = [c for name, m in shapes.items() for c in cases(mods, dev, name, m, ts, budgets)]
    for labels, calls in work:  # a fast wrong kernel is no win: the implementations must agree first
        outs = {name: calls[name][0]() for name in names}
        for name in names[1:]:
            if not torch.allclose(outs[name].float(), outs[names[0]].float(), rtol=2e-2, atol=2e-2):
                err = (outs[name].float() - outs[names[0]].float()).abs().max().item()
                raise SystemExit(f"error: bench_experts: {name} and {names[0]} disagree at {labels} (max |diff| {err:.3g})")
    copy = copy_bandwidth(dev, gib=0.25 if dev.type != "cuda" else 2.0)
    t = pd.DataFrame(interleaved_rounds(work, names, args.rounds, args.reps, dev, calls_of=lambda calls: calls))
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        t.to_csv(args.csv, index=False)
    pd.set_option("display.width", 200)
    med = medians(t)
    mb = {(c.model, c.T, c.M): c.MB for c in t.itertuples(index=False)}
    med["of_copy"] = [mb[(c.model, c.T, c.M)] * 1e3 / c.median / copy for c in med.itertuples(index=False)]
    print(med.round(3).to_string(index=False))
    if len(names) == 2:
        print("\ncurrent over baseline in the same round: median [min, max], exact Mann-Whitney, Holm over the cases")
        print(tested(t, "baseline").round(4).to_string(index=False))
    print(f"us per call: median [min, max] over {args.rounds} interleaved rounds, one process; "
          f"copy bandwidth {copy:.0f} GB/s")


if __name__ == "__main__":
    main()
