"""Tune the decode step's two latency-bound kernels on this GPU -> kernels/configs/<gpu>.json.

    python -m tools.tune_step_kernels --csv /tmp/tune_step.csv       # on a CUDA machine
    python -m tools.tune_step_kernels --smoke --no-install           # CPU check of the harness
    python -m tools.tune_step_kernels --kernels select --select-ts 64 # one kernel, one bucket
    python -m tools.tune_step_kernels --from-csv results/roofline/grid_2026-12-02d/tune_step.csv \
        --device-name NVIDIA_H200                                     # the attention entries, no timing

The selection kernel (kernels/select.py) runs as one program per layer: its time is a chain of
reductions, so its warps (reductions inside one warp need no shared memory) and its tokens per
tile decide it. Decode attention (kernels/attention.py) reads a few MB per layer in a few
microseconds: slots per block, warps and how many shares the cache is cut into decide it.

Selection: `route_select` as the budgeted model calls it (kind base, logits and the predictor's g
from one GEMM, M = 16), per token bucket T in 1, 16, 64: every (num_warps, TB, form) candidate, the forms the one-program
launch and `split` (one program per tile in two launches), the latter where T spans more than one
tile; the fastest of those whose selection is the built-in launch's (`same_selection`, checked on
this GPU) is the bucket's entry "select:E=<E_BLOCK>,T=<T>"; the same for dense's launch (budget
None: nothing to drop, so only the routing runs) gives "route:E=<E_BLOCK>,T=<T>" (kernels/select.py's
`select_launch`: an entry tuned on base's launch had made dense's two launches a layer).
Attention: every (BLOCK_N, num_warps, target_programs) candidate over the batch sizes 1, 16, 64
and the first and last filled length of a 640-slot cache (the throughput grid's 256 + 384), for the Qwen3-30B-A3B
and OLMoE heads; objective: the mean over those shapes of time / the shape's best time; the best is
the entry "attention:G=<G_BLOCK>,D=<D_BLOCK>", and the best over each model's shapes at one batch
size the entry "attention:G=<G>,D=<D_BLOCK>,T=<rows>"; a candidate whose output differs from
`decode_attention_reference` at any shape (checked on this GPU) is in no entry.
Timing as tools/bench_kernels.py: CUDA-graph replays of 20 calls, the median of `--reps`; before a
bucket's (or an attention shape's) candidates are timed, they are called once each in threads
(tools/timing.compile_side_by_side), so their Triton compiles run side by side.
Every timing goes to --csv (the candidates' table, rewritten after each selection token bucket and
after attention); each bucket's and attention's entries are merged into the GPU's config file as soon
as they are tuned, unless --no-install (a run stopped early keeps what it finished). Most of the time
is compiling: the selection's three buckets with both launches took over 300 s on a fresh H100, one
bucket 11 s with the compiled kernels cached (results/roofline/branches_2026-12-06j/).
"""
from __future__ import annotations

import argparse
import itertools
import json
import time
from functools import partial
from pathlib import Path

import pandas as pd
import torch

from kernels._triton import next_pow2
from kernels.attention import (
    AttentionLaunch,
    decode_attention,
    decode_attention_reference,
)
from kernels.select import SelectLaunch, route_select
from tools.timing import compile_side_by_side, compile_workers, select_layer, time_graph
from tools.tune_kernels import install as install_table

# the one-program launch got faster with every doubling of its warps on an H100 (T = 16: 31.3, 15.1,
# 13.3 us at 2, 4, 8; results/roofline/grid_2026-12-05c/micro/tune_step.csv), so 16 is a candidate
SELECT_WARPS = (2, 4, 8, 16)
SELECT_TB = (4, 8, 16, 32)
SELECT_TS = (1, 16, 64)
ATTN_BLOCK_N = (32, 64, 128)
ATTN_WARPS = (2, 4, 8)
ATTN_TARGETS = (64, 132, 264, 528)
ATTN_BATCHES = (1, 16, 64)
ATTN_SLOTS = 640
ATTN_FILLED = (256, 640)
# (name, query heads, KV heads, head size)
ATTN_MODELS = (("qwen3_30b_a3b", 32, 4, 128), ("olmoe", 16, 16, 128))
SELECT_MODEL = {"H": 2048, "E": 128, "K": 8, "budget": 16}
SMOKE = {"select_model": {"H": 32, "E": 16, "K": 4, "budget": 4}, "select_ts": (4,), "select_warps": (1, 4),
         "select_tb": (4, 16), "attn_models": (("smoke", 4, 2, 16),), "attn_batches": (2,), "attn_slots": 96,
         "attn_filled": (40,), "attn_block_n": (32, 64), "attn_warps": (4,), "attn_targets": (4,)}  # fmt: skip


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def same_selection(out, ref) -> bool:
    """Whether a candidate launch's (routing, selection) is the built-in launch's: the routing, kept
    list and reassignment bit for bit, the score (a sum over tokens, summed per tile) up to
    rounding. A candidate that differs is timed and logged but never installed, so every entry
    this tool writes has been checked on the GPU it was tuned on."""
    (routing, sel), (ref_routing, ref_sel) = out, ref
    same = [torch.equal(a, b) for a, b in ((routing.topk_idx_TK, ref_routing.topk_idx_TK),
                                           (routing.topk_w_TK, ref_routing.topk_w_TK), (sel.keep_M, ref_sel.keep_M),
                                           (sel.topk_idx_TK, ref_sel.topk_idx_TK), (sel.topk_w_TK, ref_sel.topk_w_TK))]
    return all(same) and torch.allclose(sel.score_E, ref_sel.score_E, rtol=1e-6, atol=0)


def time_candidates(fns: dict, reps: int, dev: torch.device, what: str) -> dict:
    """Each candidate launch's (µs, how) in order: every call made once side by side first (their
    Triton compiles, tools/timing.compile_side_by_side), then each timed alone (CUDA-graph replays
    of 20 calls, the median of `reps`); one this GPU cannot compile or launch is logged and left out."""
    t0 = time.perf_counter()
    compile_side_by_side(list(fns.values()), compile_workers(dev))
    log(f"{what}: {len(fns)} candidates called once (their compiles) in {time.perf_counter() - t0:.1f} s")
    timed = {}
    for launch, fn in fns.items():
        try:
            timed[launch] = time_graph([fn] * 20, reps, dev)
        except Exception as e:  # noqa: BLE001 - a candidate this GPU cannot compile or launch
            log(f"{what} {launch} failed: {type(e).__name__}: {str(e)[:120]}")
    return timed


def tune_select(dev: torch.device, model: dict, ts, warps, tbs, reps: int) -> tuple[list[dict], dict]:
    H, E, K, M = model["H"], model["E"], model["K"], model["budget"]
    g = torch.Generator(device="cpu").manual_seed(7)
    layer = select_layer(H, E, dev, g)
    pred_b_E = layer.pred_b_E
    rows, table = [], {}
    E_BLOCK = next_pow2(E, 16)
    for T in ts:
        logits_TE, g_TE, active_T = layer.inputs(T, g)
        cands = [(nw, tb, form) for nw, tb, form in itertools.product(warps, tbs, ("one", "split"))
                 if tb <= max(next_pow2(T), min(tbs))  # a tile larger than the tokens only pads
                 and not (form == "split" and tb >= T)]  # one tile: the split launch is the one-program launch
        # the launch that selects (base, M) and the one with nothing to drop (dense: the union), each its entry
        for entry, call in (("select", partial(route_select, logits_TE, K, active_T, M, norm_topk=True, kind="base",
                                               g_TE=g_TE, pred_b_E=pred_b_E)),
                            ("route", partial(route_select, logits_TE, K, active_T, None, norm_topk=True))):
            ref = call(launch=SelectLaunch())
            fns = {la: partial(call, launch=la) for la in (SelectLaunch(num_warps=nw, tokens_per_tile=tb,
                                                                         split=form == "split") for nw, tb, form in cands)}
            for la, (us, how) in time_candidates(fns, reps, dev, f"{entry} T={T}").items():
                rows.append({"kernel": entry, "E": E, "T": T, "num_warps": la.num_warps, "TB": la.tokens_per_tile,
                             "split": la.split, "us": round(us, 3), "timing": how,
                             "matches_default": same_selection(fns[la](), ref)})
            ok = [r for r in rows if r["kernel"] == entry and r["T"] == T and r["matches_default"]]
            if not ok:
                raise RuntimeError(f"{entry} T={T}: no candidate launch gives the built-in launch's selection")
            best = min(ok, key=lambda r: r["us"])
            key = f"{entry}:E={E_BLOCK},T={T}"
            table[key] = {"num_warps": best["num_warps"], "TB": best["TB"], "split": best["split"], "us": best["us"]}
            forms = {f: min((r["us"] for r in ok if ("split" if r["split"] else "one") == f), default=None)
                     for f in ("one", "split")}
            log(f"{entry} T={T}: best {table[key]}; best us per form {forms}")
    return rows, table


def attention_inputs(B: int, Hq: int, K: int, D: int, slots: int, n: int, g: torch.Generator, dev: torch.device,
                     dtype: torch.dtype) -> tuple:
    """decode_attention's arguments for B rows of Hq query and K KV heads of size D, a cache of `slots`
    with the first n filled (random q, K, V from g)."""
    q = torch.randn(B, Hq, D, generator=g).to(dev, dtype)
    k = torch.randn(B, K, slots, D, generator=g).to(dev, dtype)
    v = torch.randn(B, K, slots, D, generator=g).to(dev, dtype)
    allowed = torch.zeros(B, slots, dtype=torch.bool, device=dev)
    allowed[:, :n] = True
    return q, k, v, allowed, torch.tensor([n - 1], device=dev), D**-0.5


def tune_attention(dev: torch.device, models, batches, slots: int, filled, block_ns, warps, targets,
                   reps: int) -> tuple[list[dict], dict]:
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    g = torch.Generator(device="cpu").manual_seed(3)
    rows = []
    for name, Hq, K, D in models:
        for B, n in itertools.product(batches, filled):
            q, k, v, allowed, last, _ = attention_inputs(B, Hq, K, D, slots, n, g, dev, dtype)
            ref = decode_attention_reference(q, k, v, allowed, n - 1, D**-0.5).float()
            # fit=False: each candidate as named (one the GPU cannot hold fails and is left out, never timed halved)
            fns = {la: partial(decode_attention, q, k, v, allowed, last, D**-0.5, launch=la, fit=False)
                   for la in (AttentionLaunch(block_n=bn, num_warps=nw, target_programs=tg)
                              for bn, nw, tg in itertools.product(block_ns, warps, targets))}
            for la, (us, how) in time_candidates(fns, reps, dev, f"attention {name} B={B}").items():
                same = bool(torch.allclose(fns[la]().float(), ref, rtol=2e-2, atol=2e-2))
                rows.append({"kernel": "attention", "model": name, "G": Hq // K, "D": D, "B": B, "filled": n,
                             "BLOCK_N": la.block_n, "num_warps": la.num_warps, "target_programs": la.target_programs,
                             "us": round(us, 3), "timing": how, "matches_reference": same})
        log(f"attention {name}: {len(rows)} timings so far")
    return rows, attention_table(pd.DataFrame(rows))


ATTN_CANDIDATE = ["BLOCK_N", "num_warps", "target_programs"]


def attention_table(t: pd.DataFrame) -> dict:
    """The attention entries from the candidates' timings: for each (G block, D), the candidate
    with the lowest mean over every (model, rows, filled) shape of time / the shape's best time;
    and for each (G, D, rows), the same over that batch's shapes (the launch lookup prefers it:
    kernels/attention.py)."""
    t = t[t["kernel"] == "attention"].copy()
    if "matches_reference" in t:  # a candidate wrong at any shape is out of every entry
        wrong = t.loc[~t["matches_reference"].astype(bool), ATTN_CANDIDATE].drop_duplicates()
        for _, c in wrong.iterrows():
            log(f"attention candidate {dict(c)} differs from decode_attention_reference: never installed")
            t = t[~(t[ATTN_CANDIDATE] == c.values).all(axis=1)]
        if t.empty:
            raise RuntimeError("no attention candidate matched decode_attention_reference")
    t["G_BLOCK"] = [next_pow2(int(x), 16) for x in t["G"]]
    t["rel"] = t["us"] / t.groupby(["model", "B", "filled"])["us"].transform("min")

    def best(part: pd.DataFrame) -> dict:
        score = part.groupby(ATTN_CANDIDATE)["rel"].mean()
        bn, nw, tg = score.idxmin()
        return {"BLOCK_N": int(bn), "num_warps": int(nw), "target_programs": int(tg),
                "objective": round(float(score.min()), 4)}

    table = {}
    for (gb, D), part in t.groupby(["G_BLOCK", "D"]):
        table[f"attention:G={gb},D={next_pow2(int(D), 16)}"] = best(part)
    for (G, D, B), part in t.groupby(["G", "D", "B"]):
        table[f"attention:G={int(G)},D={next_pow2(int(D), 16)},T={int(B)}"] = best(part)
    for key, entry in table.items():
        log(f"{key}: best {entry}")
    return table


def install(table: dict, device: torch.device) -> Path:
    """Merge the entries (their timings dropped) into configs/<gpu>.json as the expert tuner does;
    later launches in this process use them."""
    return install_table({k: {kk: vv for kk, vv in v.items() if kk != "us"} for k, v in table.items()}, device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", type=Path, default=None, help="every candidate's timing")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and two candidates (a CPU check)")
    ap.add_argument("--no-install", action="store_true", help="do not write kernels/configs/<gpu>.json")
    ap.add_argument("--kernels", nargs="+", choices=("select", "attention"), default=["select", "attention"],
                    help="which kernels to tune (default both)")
    ap.add_argument("--select-ts", nargs="+", type=int, choices=SELECT_TS, default=None,
                    help=f"the selection's token buckets to tune (default all of {SELECT_TS})")
    ap.add_argument("--from-csv", type=Path, default=None,
                    help="no timing: the attention entries from an earlier run's --csv (its GPU's table)")
    ap.add_argument("--device-name", default=None, help="with --from-csv: the config file's GPU name (NVIDIA_H200)")
    ap.add_argument("--impl", default=None,
                    help="with --from-csv: only this implementation's rows (a tools/bench_attention.py search table)")
    args = ap.parse_args()
    if args.from_csv is not None:
        if not args.from_csv.exists():
            raise SystemExit(f"error: --from-csv {args.from_csv}: no such file")
        if not args.device_name or args.device_name == "cpu":
            raise SystemExit("error: --from-csv needs --device-name, the GPU the timings were made on (e.g. NVIDIA_H200)")
        t = pd.read_csv(args.from_csv)
        if args.impl is not None:
            impls = sorted(set(t["impl"])) if "impl" in t else []
            if args.impl not in impls:
                raise SystemExit(f"error: --impl {args.impl!r}: {args.from_csv} has {impls or 'no impl column'}")
            t = t[t["impl"] == args.impl]
        elif "impl" in t and t["impl"].nunique() > 1:
            raise SystemExit(f"error: {args.from_csv} times {sorted(set(t['impl']))}: name one with --impl")
        table = attention_table(t)
        from tools.tune_kernels import install_named

        print(json.dumps(table, indent=1))
        log(f"installed into {install_named({k: {kk: vv for kk, vv in v.items() if kk != 'us'} for k, v in table.items()}, args.device_name)}")
        return
    dev = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if dev.type != "cuda" and not args.no_install:  # before any timing: a CPU's table is never written
        raise SystemExit("error: " + ("--smoke runs on the CPU" if args.smoke else "no CUDA device here") + ": its "
                         "timings are Triton's interpreter's, which tune no GPU's launches; pass --no-install")
    s = SMOKE if args.smoke else {}
    rows: list[dict] = []

    def keep(new_rows: list[dict], table: dict) -> None:
        rows.extend(new_rows)
        if args.csv:
            pd.DataFrame(rows).to_csv(args.csv, index=False)
        print(json.dumps(table, indent=1), flush=True)
        if not args.no_install:
            log(f"installed into {install(table, dev)}")

    if "select" in args.kernels:
        # one token bucket at a time, each kept when tuned: a run stopped at its time limit keeps the buckets
        # it finished (cold, the three buckets with both launches ran past 300 s on an H100, branches_2026-12-06j)
        for T in s.get("select_ts", tuple(args.select_ts or SELECT_TS)):
            keep(*tune_select(dev, s.get("select_model", SELECT_MODEL), (T,), s.get("select_warps", SELECT_WARPS),
                              s.get("select_tb", SELECT_TB), args.reps))
    if "attention" in args.kernels:
        keep(*tune_attention(dev, s.get("attn_models", ATTN_MODELS), s.get("attn_batches", ATTN_BATCHES),
                             s.get("attn_slots", ATTN_SLOTS), s.get("attn_filled", ATTN_FILLED),
                             s.get("attn_block_n", ATTN_BLOCK_N), s.get("attn_warps", ATTN_WARPS),
                             s.get("attn_targets", ATTN_TARGETS), args.reps))  # fmt: skip


if __name__ == "__main__":
    main()
