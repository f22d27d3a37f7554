"""Time decode attention alone against an earlier version of it (an A/B of kernels/attention.py).

    python -m tools.bench_attention --baseline /tmp/attention_old.py --csv /tmp/attn.csv   # on a GPU
    python -m tools.bench_attention --smoke                                                 # CPU check

Shapes: the throughput grid's (tools/tune_step_kernels.py's): Qwen3-30B-A3B's heads (32 query, 4 KV,
head size 128) and OLMoE's (16 and 16), a 640-slot cache filled to 256 and to 640 slots, 1, 16 and
64 rows, bf16.
Each implementation (this tree's, and the baseline file loaded as a module of its own) is timed at
two launches per shape:
  default  the built-in AttentionLaunch() (what a GPU without attention entries in its table runs)
  best     the implementation's fastest candidate at that shape (BLOCK_N x warps x programs, the
           tuner's grid), found in one search pass before the rounds; a candidate whose output
           differs from decode_attention_reference on this GPU is never chosen
Then `--rounds` interleaved rounds (at least 5; order rotated each round), each a CUDA graph of 20
launches (tools/timing.time_graph: the median per launch over `--reps` replays). Prints each case's
median [min, max] over rounds and current over baseline in the same round (analysis/kernel_ab.py);
--csv gets the rounds, <csv stem>_search.csv every candidate's search timing, in the tuner's columns:
    python -m tools.tune_step_kernels --from-csv <stem>_search.csv --impl baseline --device-name <GPU>
makes one implementation's attention entries from it without timing again.
"""
from __future__ import annotations

import argparse
import itertools
from functools import partial
from pathlib import Path

import pandas as pd
import torch

from analysis.kernel_ab import medians, ratios
from tools.timing import check_ab_arguments, interleaved_rounds, load_module, time_graph
from tools.tune_step_kernels import (
    ATTN_BATCHES,
    ATTN_BLOCK_N,
    ATTN_FILLED,
    ATTN_MODELS,
    ATTN_SLOTS,
    ATTN_TARGETS,
    ATTN_WARPS,
    attention_inputs,
)

# the tuner's shapes and candidates (tools/tune_step_kernels.py), so a search here is a tuning run there
GRID = {"batches": ATTN_BATCHES, "slots": ATTN_SLOTS, "filled": ATTN_FILLED, "block_n": ATTN_BLOCK_N,
        "warps": ATTN_WARPS, "targets": ATTN_TARGETS}
MODELS = tuple({"name": name, "Hq": Hq, "K": K, "D": D, **GRID} for name, Hq, K, D in ATTN_MODELS)
SMOKE = {"name": "smoke", "Hq": 4, "K": 2, "D": 16, "batches": (2,), "slots": 96, "filled": (40,),
         "block_n": (16, 32), "warps": (2,), "targets": (2, 8)}


def shapes(model: dict, dev: torch.device, dtype: torch.dtype):
    """(labels, decode_attention's inputs) per (rows, filled slots)."""
    g = torch.Generator(device="cpu").manual_seed(3)
    for B, n in itertools.product(model["batches"], model["filled"]):
        yield {"model": model["name"], "B": B, "filled": n}, attention_inputs(
            B, model["Hq"], model["K"], model["D"], model["slots"], n, g, dev, dtype)


def search(mod, inputs, ref, model: dict, reps: int, dev: torch.device) -> tuple[object, list[dict]]:
    """The fastest candidate launch of `mod` at one shape whose output matches the reference."""
    rows, best = [], None
    for bn, nw, tg in itertools.product(model["block_n"], model["warps"], model["targets"]):
        launch = mod.AttentionLaunch(block_n=bn, num_warps=nw, target_programs=tg)
        fn = partial(mod.decode_attention, *inputs, launch=launch)
        us, _ = time_graph([fn] * 20, reps, dev)
        ok = bool(torch.allclose(fn().float(), ref, rtol=2e-2, atol=2e-2))
        rows.append({"BLOCK_N": bn, "num_warps": nw, "target_programs": tg, "us": round(us, 3),
                     "matches_reference": ok})
        if ok and (best is None or us < best[0]):
            best = (us, launch)
    if best is None:
        raise RuntimeError("no candidate launch matched decode_attention_reference")
    return best[1], rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", help="another kernels/attention.py to time against this tree's")
    ap.add_argument("--csv", default=None, help="every round's timing")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=30, help="graph replays per timing (tools/timing.time_graph)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and candidates on this machine's device")
    args = ap.parse_args()
    check_ab_arguments(ap, args)
    dev = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    models = (SMOKE,) if dev.type != "cuda" else MODELS
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    import kernels.attention as current

    impls = {"current": current}
    if args.baseline:
        impls["baseline"] = load_module(args.baseline, "_attention_baseline")
    names = list(impls)
    work, found = [], []
    for model, (labels, inputs) in ((m, x) for m in models for x in shapes(m, dev, dtype)):
        ref = current.decode_attention_reference(*inputs[:4], int(inputs[4]), inputs[5]).float()
        for name, mod in impls.items():
            launch, rows = search(mod, inputs, ref, model, args.reps, dev)
            # in tools/tune_step_kernels.py's columns: its --from-csv makes a table from one impl's rows
            found += [{"kernel": "attention", **labels, "G": model["Hq"] // model["K"], "D": model["D"], "impl": name, **r}
                      for r in rows]
            work.append(({**labels, "launch": "best"}, name, partial(mod.decode_attention, *inputs, launch=launch)))
            work.append(({**labels, "launch": "default"}, name,
                         partial(mod.decode_attention, *inputs, launch=mod.AttentionLaunch())))
            chosen = {k: getattr(launch, k) for k in ("block_n", "num_warps", "target_programs")}
            print(f"{labels} {name}: best {chosen}", flush=True)
    cases: dict[tuple, tuple[dict, dict]] = {}  # per case, its labels and each implementation's call
    for labels, name, fn in work:
        cases.setdefault(tuple(sorted(labels.items())), (labels, {}))[1][name] = fn
    t = pd.DataFrame(interleaved_rounds(list(cases.values()), names, args.rounds, args.reps, dev))
    if args.csv:
        out = Path(args.csv)
        out.parent.mkdir(parents=True, exist_ok=True)
        t.to_csv(out, index=False)
        pd.DataFrame(found).to_csv(out.with_name(out.stem + "_search.csv"), index=False)
    pd.set_option("display.width", 200)
    print(medians(t).round(3).to_string(index=False))
    if len(names) == 2:
        print("\ncurrent over baseline in the same round: median [min, max]")
        print(ratios(t, "baseline").round(3).to_string(index=False))
    print(f"us per launch: median [min, max] over {args.rounds} interleaved rounds, one process, {dev}")


if __name__ == "__main__":
    main()
