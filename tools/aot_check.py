"""Compile the decode-step kernels for a GPU target on any machine (no GPU needed) and report their
resources: registers per thread, spills, shared memory. Catches compile errors before a GPU run.

    python -m tools.aot_check                 # sm_90 (H100/H200), the launch shapes of Qwen3-30B-A3B (and gpt-oss gate_up)
    python -m tools.aot_check --arch 90       # another target (compute capability)
    AOT_VERBOSE=1 python -m tools.aot_check   # a failed compile's whole message, not its first 400 characters
    python -m tools.aot_check --sass DIR      # also each case's SASS (addresses and line info dropped) in DIR
    python -m tools.aot_check --threads 2     # the cases compiled side by side (the wall time is printed last)
    python -m tools.aot_check --tables        # every tuned entry of every GPU table, in bf16 and float32:
                                              # its shared memory, and the launch the kernel's fitting runs

--sass is the check for a kernel change meant to compile to the same program (a refactor): write
DIR on both trees and `diff -r` them; identical SASS runs as the GPU-tested code did.

--tables is the check for a table before a GPU run: a tuned entry is timed in bf16, and in float32
its pipelined tiles need twice the shared memory. Triton refuses a program over the block's limit
(OutOfResources) and each kernel then runs a smaller launch (its `smaller_launch`, through
kernels/_triton.fit_shared_memory): this lists, per entry and dtype, the shared memory of the
launch as tuned and of the launch the fitting ends at, and fails where no launch fits or a
compile fails.

Triton compiles to PTX and runs the bundled ptxas, so this works on a CPU-only machine; the
numbers are what the GPU's JIT would get for the same constexprs (same Triton version). The first
line printed is this Triton's version: compare it with the GPU host's (its GPU test log's header).
A clean compile under another version is no evidence for a new construct: a gate_up whose scan
compiled here under triton 3.9 failed the device's 3.6 at K = 2 (results/roofline/branches_2026-12-07b).
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels import attention, experts, skinny
from kernels._triton import next_pow2
from kernels.attention import _decode_attention
from kernels.experts import (
    _down_kept_kernel,
    _down_kernel,
    _ffn_kernel,
    _gate_up_kept_kernel,
    _gate_up_kernel,
    _route_kernel,
)
from kernels.select import _route_select_kernel
from kernels.skinny import _skinny_kernel
from kernels.tuned import CONFIG_DIR, MAX_BUCKET, load_configs, nearest_key


def _types(fn, pointers: dict[str, str], floats: tuple[str, ...], constexprs: dict,
           aligned: tuple[str, ...] = ()) -> tuple[dict[str, str], dict]:
    """Triton signature (pointers by name, the named floats fp32, other runtime args i32) and the
    attributes the JIT would infer for real launches: pointers and strides aligned to 16."""
    sig, attrs = {}, {}
    for i, (name, param) in enumerate(inspect.signature(fn).parameters.items()):
        if name not in constexprs and param.default is not inspect.Parameter.empty and "constexpr" in str(param.annotation):
            constexprs[name] = param.default  # a constexpr left at its default, as a launch leaves it
        if name in constexprs:
            sig[name] = "constexpr"
            continue
        sig[name] = pointers.get(name) or ("fp32" if name in floats else "i32")
        if name in pointers or name.startswith("stride_") or name in ALIGNED or name in aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


# Sizes that are multiples of 16 in the launches this checks (the JIT marks such int arguments).
ALIGNED = ("H", "I", "C", "E")
# Per kernel, more int arguments that are multiples of 16 in its launches: the skinny kernel's
# matrix sizes (elsewhere K is the top-k); the attention's head size and the strides of its
# (rows, heads, slots, head size) tensors.
ALIGNED_IN = {_skinny_kernel: ("N", "K"),
              _decode_attention: ("D", "sq_b", "sq_h", "sk_b", "sk_k", "sk_l", "sv_b", "sv_k", "sv_l", "so_b", "so_h")}
# Strides that are 1 in every real launch: the JIT specialises an int argument equal to 1 into a
# constant, which is what lets it vectorise and software-pipeline the weight loads.
UNIT_STRIDES = {"stride_gk": 1, "stride_di": 1}


def cases() -> list[tuple[str, object, dict, tuple, dict, dict]]:
    """(label, kernel, pointer types, float args, constexprs, options)."""
    route_ptrs = {"x_ptr": "*bf16", "wr_ptr": "*bf16", "ws_ptr": "*fp32", "arrive_ptr": "*i32", "logits_ptr": "*fp32",
                  "lbias_ptr": "*bf16", "probs_ptr": "*fp32", "idx_ptr": "*i64", "w_ptr": "*bf16", "active_ptr": "*i1",
                  "score_ptr": "*fp32", "g_ptr": "*fp32", "bias_ptr": "*fp32", "energy_ptr": "*fp32", "sim_ptr": "*fp32",
                  "keep_e_ptr": "*i1", "keep_m_ptr": "*i64", "new_idx_ptr": "*i64", "new_w_ptr": "*bf16",
                  "part_ptr": "*fp32"}  # fmt: skip
    base = dict(K=8, K_BLOCK=8, E_BLOCK=128, TB=16, GEMV=True, CB=16, BK=128, TBG=16, DOT_PRECISION="tf32", ROUTE=True,  # noqa: C408
                NORM=True, HAS_LBIAS=False, SCORE_IN_KERNEL=True, KIND=4, TIER=0, COVERAGE=False, REASSIGN=0,
                RENORMALIZE=True, SELECT=True, M_BLOCK=16, KEPT_LIST=True)  # fmt: skip
    floats = ("route_scale", "coverage")
    out = [
        ("route_select gemv base", _route_select_kernel, route_ptrs, floats, base, {"num_warps": 8}),
        ("route_select gemv base CB=4", _route_select_kernel, route_ptrs, floats, {**base, "CB": 4, "BK": 256},
         {"num_warps": 8}),
        ("route_select gemv base T=64", _route_select_kernel, route_ptrs, floats, {**base, "TBG": 64}, {"num_warps": 8}),
        ("route_select gemv anchor", _route_select_kernel, route_ptrs, floats, {**base, "TIER": 1}, {"num_warps": 8}),
        ("route_select gemv oea", _route_select_kernel, route_ptrs, floats, {**base, "KIND": 0, "TIER": 3},
         {"num_warps": 8}),
        ("route_select gemv coverage", _route_select_kernel, route_ptrs, floats, {**base, "COVERAGE": True},
         {"num_warps": 8}),
        ("route_select gemv similar", _route_select_kernel, route_ptrs, floats, {**base, "REASSIGN": 2},
         {"num_warps": 8}),
        ("select after router top1", _route_select_kernel, route_ptrs, floats,
         {**base, "GEMV": False, "ROUTE": False, "KIND": 0, "TIER": 2}, {"num_warps": 8}),
    ]
    gu_ptrs = {"x_ptr": "*bf16", "gu_ptr": "*bf16", "gub_ptr": "*bf16", "keep_ptr": "*i64", "idx_ptr": "*i64",
               "w_ptr": "*bf16", "act_ptr": "*bf16"}
    dn_ptrs = {"act_ptr": "*bf16", "dw_ptr": "*bf16", "db_ptr": "*bf16", "keep_ptr": "*i64", "idx_ptr": "*i64",
               "w_ptr": "*bf16", "res_ptr": "*bf16", "out_ptr": "*bf16"}
    for T_BLOCK in (16, 64):
        common = dict(K=8, K_BLOCK=8, T_BLOCK=T_BLOCK, M_BLOCK=16, HAS_BIAS=False, DOT_PRECISION="tf32")  # noqa: C408
        for bi, bh, st in ((32, 128, 4), (64, 128, 3)):
            out.append((f"gate_up_kept T={T_BLOCK} BI={bi} BH={bh} st={st}", _gate_up_kept_kernel, gu_ptrs,
                        ("alpha", "limit"), {**common, "ROW_MUL": 1, "ACT": 0, "BI": bi, "BH": bh, "stride_gk": 1},
                        {"num_warps": 4, "num_stages": st}))
        for bho, bi, st in ((16, 128, 4), (16, 256, 3), (32, 128, 4)):
            out.append((f"down_kept T={T_BLOCK} BHO={bho} BI={bi} st={st}", _down_kept_kernel, dn_ptrs, (),
                        {**common, "BHO": bho, "BI": bi, "stride_di": 1, "HAS_RES": False},
                        {"num_warps": 4, "num_stages": st}))
    # the split selection (SelectLaunch.split): each tile's pass 1, then ranking and its tile's pass 2
    for phase in (1, 2):
        out.append((f"route_select split PHASE={phase}", _route_select_kernel, route_ptrs, floats,
                    {**base, "GEMV": False, "PHASE": phase}, {"num_warps": 8}))
    # the one-program selection after the router's GEMM, and the folded residual add
    for nw in (8, 16):  # the one-program launch after the router's GEMM: the tuner's warps candidates' largest
        out.append((f"route_select one program {nw} warps", _route_select_kernel, route_ptrs, floats,
                    {**base, "GEMV": False}, {"num_warps": nw}))
    out.append(("down_kept T=16 residual", _down_kept_kernel, dn_ptrs, (),
                {**common, "T_BLOCK": 16, "BHO": 16, "BI": 128, "stride_di": 1, "HAS_RES": True},
                {"num_warps": 4, "num_stages": 4}))
    # the decode projections without a reduce launch (kernels/skinny.py): one column block per program,
    # and K in shares summed by the last share
    sk_ptrs = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "part_ptr": "*fp32", "count_ptr": "*i32"}
    for bn, bk, st, split in ((16, 256, 4, 1), (16, 512, 3, 1), (64, 128, 4, 4), (32, 256, 4, 2)):
        out.append((f"skinny BN={bn} BK={bk} st={st} split={split}", _skinny_kernel, sk_ptrs, (),
                    {"TB": 16, "BN": bn, "BK": bk, "SPLIT": split, "DOT_PRECISION": "tf32"},
                    {"num_warps": 4, "num_stages": st}))
    # the four-launch path's down (its tuned T=16 launch), as it is and with the reduce folded in
    v2_ptrs = {"act_ptr": "*bf16", "dw_ptr": "*bf16", "db_ptr": "*bf16", "w_ptr": "*bf16", "pairs_ptr": "*i32",
               "cnt_ptr": "*i32", "y_ptr": "*fp32", "res_ptr": "*bf16", "out_ptr": "*bf16", "count_ptr": "*i32"}
    for reduce in (False, True):
        out.append((f"down T=16 BHO=64 BI=256 st=3{' REDUCE' if reduce else ''}", _down_kernel, v2_ptrs, (),
                    {"E_BLOCK": 128, "HAS_BIAS": False, "TB": 16, "BHO": 64, "BI": 256, "DOT_PRECISION": "tf32",
                     "stride_di": 1, "REDUCE": reduce, "K": 8, "HAS_RES": reduce}, {"num_warps": 4, "num_stages": 3}))
    # gpt-oss's gate_up (E, H, 2I), gate and up interleaved, with bias: one tile of 2*BI adjacent
    # rows split after the dot; unit stride along those rows, so its copies should be 16-byte cp.async
    oss = {"ROW_MUL": 2, "ACT": 1, "HAS_BIAS": True, "BI": 32, "BH": 128, "DOT_PRECISION": "tf32", "stride_gn": 1}
    v2_gu_ptrs = {**gu_ptrs, "pairs_ptr": "*i32", "cnt_ptr": "*i32"}
    for bi, st in ((32, 4), (64, 3)):  # the four-launch path's gate_up, Qwen3's concatenated layout
        out.append((f"gate_up T=16 BI={bi} BH=128 st={st}", _gate_up_kernel, v2_gu_ptrs, ("alpha", "limit"),
                    {"ROW_MUL": 1, "ACT": 0, "HAS_BIAS": False, "BI": bi, "BH": 128, "DOT_PRECISION": "tf32",
                     "stride_gk": 1, "E_BLOCK": 128, "TB": 16}, {"num_warps": 4, "num_stages": st}))
    # the route launch the four-launch path runs above ROUTE_IN_MAX pairs (64 tokens: 512 pairs)
    out.append(("route PB=512", _route_kernel, {"idx_ptr": "*i64", "w_ptr": "*bf16", "pairs_ptr": "*i32", "cnt_ptr": "*i32"},
                (), {"PB": 512}, {"num_warps": 4}))
    for T in (1, 16):  # the same with the route launch folded in: pairs T * 8 in one block (ROUTE_IN_MAX)
        out.append((f"gate_up T={T} BI=32 BH=128 st=4 ROUTE_IN", _gate_up_kernel, v2_gu_ptrs, ("alpha", "limit"),
                    {"ROW_MUL": 1, "ACT": 0, "HAS_BIAS": False, "BI": 32, "BH": 128, "DOT_PRECISION": "tf32",
                     "stride_gk": 1, "E_BLOCK": 128, "TB": max(16, T), "ROUTE_IN": True, "PB": next_pow2(8 * T)},
                    {"num_warps": 4, "num_stages": 4}))
    # gate_up and down in one launch (_ffn_kernel): the 1- and 16-token launches of the tables (up to ROUTE_IN_MAX
    # pairs, ranked in the launch; above, the route launch and the two)
    ffn_ptrs = {**v2_gu_ptrs, **v2_ptrs, "flag_ptr": "*i32"}
    for T, reduce in ((1, False), (16, True)):
        out.append((f"ffn T={T}{' REDUCE' if reduce else ''}", _ffn_kernel, ffn_ptrs,
                    ("alpha", "limit"),
                    {"E_BLOCK": 128, "K": 8, "ROW_MUL": 1, "HAS_BIAS": False, "ACT": 0, "TB": max(16, T), "BI": 32,
                     "BH": 128, "TB_D": max(16, T), "BHO": 64, "BI_D": 256, "STAGES_D": 3, "DOT_PRECISION": "tf32",
                     "PB": next_pow2(8 * T), "REDUCE": reduce,
                     "HAS_RES": reduce, "MAX_SPINS": experts.FFN_MAX_SPINS, "stride_gk": 1, "stride_di": 1},
                    {"num_warps": 4, "num_stages": 4}))
    out.append(("gate_up gpt-oss T=16 BI=32 BH=128 st=4", _gate_up_kernel,
                v2_gu_ptrs, ("alpha", "limit"),
                {**oss, "E_BLOCK": 32, "TB": 16}, {"num_warps": 4, "num_stages": 4}))
    out.append(("gate_up_kept gpt-oss T=16 BI=32 BH=128 st=4", _gate_up_kept_kernel, gu_ptrs, ("alpha", "limit"),
                {**oss, "K": 4, "K_BLOCK": 4, "T_BLOCK": 16, "M_BLOCK": 32}, {"num_warps": 4, "num_stages": 4}))
    # decode attention (Qwen3-30B-A3B: 8 query heads per KV head, head size 128): the cache in shares
    # combined by the last, and in one share
    at_ptrs = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "allowed_ptr": "*u8", "last_ptr": "*i64",
               "m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32", "count_ptr": "*i32", "out_ptr": "*bf16",
               "sink_ptr": "*bf16"}
    at = {"G_BLOCK": 16, "D_BLOCK": 128, "E_BLOCK": 128, "BLOCK_N": 64}
    for one in (False, True):
        out.append((f"decode_attention ONE_SHARE={one:d}", _decode_attention, at_ptrs, ("scaling",),
                    {**at, "ONE_SHARE": one, "HAS_SINK": False}, {"num_warps": 4}))
    # gpt-oss-20b's decode step (8 query heads a KV head, head size 64, attention sinks)
    out.append(("decode_attention gpt-oss HAS_SINK=1", _decode_attention, at_ptrs, ("scaling",),
                {**at, "D_BLOCK": 64, "E_BLOCK": 64, "ONE_SHARE": False, "HAS_SINK": True}, {"num_warps": 4}))
    return out


# The shared memory one block may opt into, per compute capability: what Triton's OutOfResources
# compares a program against (H100 and H200: 227 KB).
SHARED_LIMIT = {90: 232448}


@dataclasses.dataclass
class TableLaunch:
    """One tuned entry's launch in one dtype: `case(launch)` is the (kernel, pointer types, floats,
    constexprs, options) to compile, `smaller(launch)` the kernel's next smaller launch (None: none)."""

    label: str
    launch: object
    case: Callable
    smaller: Callable
    instead: str | None = None  # where no launch of it fits, what runs instead (None: nothing, a failure)


def table_launches(gpu: str, dtype: str) -> list[TableLaunch]:
    """Every entry of configs/<gpu>.json that streams tiles through shared memory (the expert
    kernels, the skinny GEMM, decode attention), with `dtype` ("bf16", "fp32") tensors, as the
    wrappers in kernels/ launch them: at each token tile that reads the entry (a bucket serves the
    token counts nearest it, whose tiles can be larger than its own)."""
    table = load_configs(gpu)
    prec = "ieee" if dtype == "fp32" else "tf32"
    shapes = {tuple(key.split(",")[:2]) for key in table if key.startswith("H=")}
    skinny_shapes = {key.rsplit(",T=", 1)[0] for key in table if key.startswith("skinny:")}
    return ([tl_ for H, I in sorted(shapes) for tl_ in _expert_launches(table, H, I, f"*{dtype}", prec)]
            + [tl_ for shape in sorted(skinny_shapes) for tl_ in _skinny_launches(table, shape, f"*{dtype}", prec)]
            + [_attention_launch(key, entry, f"*{dtype}") for key, entry in table.items() if key.startswith("attention:")])


def _expert_launches(table: dict, H_: str, I_: str, t: str, prec: str) -> list[TableLaunch]:
    """The expert kernels of one (H, I) ("H=..", "I=.."; Qwen3's layout, top-8 of 128: no tile depends
    on them) at every token count, the entry it reads resolved as the runtime does (the nearest
    tuned bucket), with the v3 path at its token tile where the entry takes it or names its
    launches (a test or benchmark may force it: replace(cfg, use_kept=True))."""
    gu_ptrs = {"x_ptr": t, "gu_ptr": t, "gub_ptr": t, "keep_ptr": "*i64", "idx_ptr": "*i64", "w_ptr": t, "act_ptr": t}
    dn_ptrs = {"act_ptr": t, "dw_ptr": t, "db_ptr": t, "keep_ptr": "*i64", "idx_ptr": "*i64", "w_ptr": t,
               "res_ptr": t, "out_ptr": t}
    pair_ptrs = {"pairs_ptr": "*i32", "cnt_ptr": "*i32", "y_ptr": "*fp32", "count_ptr": "*i32"}
    kernels = {  # part -> kernel, pointer types, float args, constexprs of the shape
        "gate_up": (_gate_up_kernel, {**gu_ptrs, **pair_ptrs}, ("alpha", "limit"),
                    {"ROW_MUL": 1, "ACT": 0, "stride_gk": 1, "E_BLOCK": 128}),
        "down": (_down_kernel, {**dn_ptrs, **pair_ptrs}, (), {"E_BLOCK": 128, "stride_di": 1, "K": 8, "HAS_RES": False}),
        "gate_up_kept": (_gate_up_kept_kernel, gu_ptrs, ("alpha", "limit"), {"ROW_MUL": 1, "ACT": 0, "stride_gk": 1}),
        "down_kept": (_down_kept_kernel, dn_ptrs, (), {"stride_di": 1, "HAS_RES": True})}
    H, I = int(H_[2:]), int(I_[2:])
    out, seen = [], set()
    for T in (2**i for i in range(MAX_BUCKET.bit_length())):  # 1 .. the largest bucket
        read = experts.entry_key(table, H, I, T)
        cfg = experts.config_from_entry(table[read], on_cpu=False)
        for part, (kernel, ptrs, floats, shape) in kernels.items():
            kept = part.endswith("_kept")
            if kept and (T > experts.V3_MAX_TOKENS or not (cfg.use_kept or part in table[read])):
                continue
            T_BLOCK = next_pow2(T, 16) if kept else None
            # gate_up routes its pairs itself up to ROUTE_IN_MAX pairs, with all of them in one block
            PB = next_pow2(8 * T) if part == "gate_up" and 8 * T <= experts.ROUTE_IN_MAX else None
            if (read, part, T_BLOCK, PB) in seen:
                continue
            seen.add((read, part, T_BLOCK, PB))
            consts = {**shape, "HAS_BIAS": False, "DOT_PRECISION": prec,
                      **(dict(K=8, K_BLOCK=8, T_BLOCK=T_BLOCK, M_BLOCK=16) if kept else {})}  # noqa: C408
            if part == "down":
                consts["REDUCE"] = cfg.reduce_in_down
            if PB is not None:
                consts.update(ROUTE_IN=True, PB=PB)

            def case(launch, kernel=kernel, ptrs=ptrs, floats=floats, consts=consts):
                launch = {k: v for k, v in launch.items() if k != "PER_SM"}
                opts = {"num_warps": launch.pop("num_warps"), "num_stages": launch.pop("num_stages")}
                return kernel, ptrs, floats, {**consts, **launch}, opts

            out.append(TableLaunch(f"{read} {part}" + (f" T_BLOCK={T_BLOCK}" if kept else "")
                                   + (f" ROUTE_IN PB={PB}" if PB is not None else ""), getattr(cfg, part),
                                   case, lambda launch, part=part: experts.smaller_launch(launch, part)))
        # gate_up and down in one launch (the four-launch path's up to ROUTE_IN_MAX pairs, FUSED_FFN): gate_up's tile
        # and launch, down's tile and stages; where the device cannot hold it, the two launches run (each listed above)
        PB = next_pow2(8 * T) if 8 * T <= experts.ROUTE_IN_MAX else None
        if PB is None or (read, "ffn", PB) in seen:
            continue
        seen.add((read, "ffn", PB))

        def ffn_case(launch, PB=PB, reduce=cfg.reduce_in_down):
            gu, dn = launch["gate_up"], launch["down"]
            consts = {"E_BLOCK": 128, "K": 8, "ROW_MUL": 1, "HAS_BIAS": False, "ACT": 0, "TB": gu["TB"], "BI": gu["BI"],
                      "BH": gu["BH"], "TB_D": dn["TB"], "BHO": dn["BHO"], "BI_D": dn["BI"], "STAGES_D": dn["num_stages"],
                      "DOT_PRECISION": prec, "PB": PB, "REDUCE": reduce,
                      "HAS_RES": False, "MAX_SPINS": experts.FFN_MAX_SPINS, "stride_gk": 1, "stride_di": 1}
            ptrs = {**gu_ptrs, **dn_ptrs, **pair_ptrs, "flag_ptr": "*i32"}
            return (_ffn_kernel, ptrs, ("alpha", "limit"), consts,
                    {"num_warps": gu["num_warps"], "num_stages": gu["num_stages"]})

        out.append(TableLaunch(f"{read} ffn PB={PB}",
                               {"gate_up": cfg.gate_up, "down": cfg.down}, ffn_case, lambda launch: None,
                               instead="the two launches"))
    return out


def _skinny_launches(table: dict, shape: str, t: str, prec: str) -> list[TableLaunch]:
    """The skinny GEMM of one shape ("skinny:N=..,K=..") at each token tile, the entry it reads
    resolved as the runtime does."""
    out, seen = [], set()
    for T in (2**i for i in range(skinny.MAX_TOKENS.bit_length())):
        read, TB = nearest_key(table, shape, T), max(16, min(next_pow2(T), skinny.MAX_TOKENS))
        if (read, TB) in seen:
            continue
        seen.add((read, TB))

        def case(launch, TB=TB):
            consts = {"TB": TB, "BN": launch.block_n, "BK": launch.block_k, "SPLIT": launch.split, "DOT_PRECISION": prec}
            return (_skinny_kernel, {"x_ptr": t, "w_ptr": t, "y_ptr": t, "part_ptr": "*fp32", "count_ptr": "*i32"},
                    (), consts, {"num_warps": launch.num_warps, "num_stages": launch.num_stages})

        out.append(TableLaunch(f"{read} TB={TB}", skinny.launch_from_entry(table[read]), case, skinny.smaller_launch))
    return out


def _attention_launch(key: str, entry: dict, t: str) -> TableLaunch:
    """One `attention:G=..,D=..[,T=..]` entry (no tile depends on the rows)."""
    fields = dict(part.split("=") for part in key.split(":", 1)[1].split(","))
    G, D = int(fields["G"]), int(fields["D"])

    def case(launch):
        consts = {"G_BLOCK": next_pow2(G, 16), "D_BLOCK": next_pow2(D, 16), "E_BLOCK": next_pow2(D, 16),
                  "BLOCK_N": launch.block_n, "ONE_SHARE": False, "HAS_SINK": False}
        ptrs = {"q_ptr": t, "k_ptr": t, "v_ptr": t, "allowed_ptr": "*u8", "last_ptr": "*i64", "m_ptr": "*fp32",
                "l_ptr": "*fp32", "acc_ptr": "*fp32", "count_ptr": "*i32", "out_ptr": t, "sink_ptr": t}
        return _decode_attention, ptrs, ("scaling",), consts, {"num_warps": launch.num_warps}

    return TableLaunch(key, attention.launch_from_entry(entry), case, attention.smaller_launch)


def check_tables(target: GPUTarget, threads: int) -> int:
    """--tables: per GPU table, entry and dtype, the launch as tuned and the one the fitting ends at,
    with their shared memory; the number of entries where no launch fits or a compile failed."""
    limit = SHARED_LIMIT[target.arch]  # main refuses an --arch without one
    gpus = sorted(p.stem for p in CONFIG_DIR.glob("*.json") if p.stem != "default")
    work = [(gpu, dtype, tl_) for gpu in gpus for dtype in ("bf16", "fp32") for tl_ in table_launches(gpu, dtype)]

    def fit(item: tuple) -> str:
        tl_ = item[2]
        launch, tried = tl_.launch, []
        while True:
            try:
                shared = compile_case(tl_.case(launch), target).metadata.shared
            except Exception as e:  # noqa: BLE001 - report every entry
                return f"FAILED to compile {launch}: {type(e).__name__}: {str(e)[:300]}"
            tried.append(shared)
            if shared <= limit:
                break
            launch = tl_.smaller(launch)
            if launch is None:
                if tl_.instead:
                    return f"{tried[0] // 1024:4d} KB, over {limit // 1024} KB: {tl_.instead} run instead"
                return f"FAILED: no launch fits ({' > '.join(f'{b // 1024} KB' for b in tried)} against {limit // 1024} KB)"
        if len(tried) == 1:
            return f"{tried[0] // 1024:4d} KB, fits"
        return f"{tried[0] // 1024:4d} KB, over {limit // 1024} KB: fitted to {launch} ({tried[-1] // 1024} KB)"

    with ThreadPoolExecutor(max_workers=threads) as pool:
        results = list(pool.map(fit, work))
    failed = 0
    for (gpu, dtype, tl_), result in zip(work, results):
        failed += result.startswith("FAILED")
        print(f"{gpu:24} {dtype:5} {tl_.label:36} {result}")
    print(f"{len(work)} launches of {len(gpus)} tables ({', '.join(gpus)}); {failed} failed; "
          f"limit {limit} B a block (sm_{target.arch})")
    return failed


def compile_case(case: tuple, target: GPUTarget):
    """Compile (kernel, pointer types, floats, constexprs, options) for `target`."""
    kernel, ptrs, floats, consts, opts = case
    consts = dict(consts)  # _types adds the constexprs a launch leaves at their defaults
    sig, attrs = _types(kernel.gpu.fn, ptrs, floats, consts, aligned=ALIGNED_IN.get(kernel, ()))
    return triton.compile(ASTSource(fn=kernel.gpu, signature=sig, constexprs=consts, attrs=attrs), target=target,
                          options=opts)


def cuobjdump(cubin: bytes, flag: str) -> str:
    """`cuobjdump <flag>` of the cubin, by the cuobjdump Triton bundles."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tool), flag, f.name], capture_output=True, text=True, check=False).stdout


def resources(cubin: bytes) -> str:
    """registers, spills (stack) and shared memory from the cubin."""
    text = cuobjdump(cubin, "--dump-resource-usage")
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", text)
    return f"regs={m.group(1):>4} stack={m.group(2):>4} shared={m.group(3):>6}" if m else text.strip()[-200:]


def sass(cubin: bytes) -> str:
    """The cubin's SASS, one instruction a line, without the addresses and line-info comments that
    differ between two compiles of the same program."""
    return "".join(line.split(";")[0].split("*/", 1)[1].strip() + "\n"
                   for line in cuobjdump(cubin, "-sass").splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--sass", type=Path, metavar="DIR", help="write each case's SASS to DIR/<case>.sass")
    ap.add_argument("--threads", type=int, default=1,
                    help="compile the cases in this many threads (Triton's compiler runs outside the GIL: "
                         "tools/timing.compile_side_by_side relies on it)")
    ap.add_argument("--tables", action="store_true",
                    help="every tuned entry of kernels/configs/<gpu>.json in bf16 and float32: its shared memory "
                         "and the launch the kernel's fitting runs (see above)")
    args = ap.parse_args()
    if args.threads < 1:
        ap.error(f"--threads must be >= 1, got {args.threads}")
    if args.tables and args.arch not in SHARED_LIMIT:
        ap.error(f"--tables knows the shared memory of sm_{', sm_'.join(map(str, SHARED_LIMIT))} only, "
                 f"got --arch {args.arch} (SHARED_LIMIT)")
    if args.sass:
        args.sass.mkdir(parents=True, exist_ok=True)
    target = GPUTarget("cuda", args.arch, 32)
    print(f"triton {triton.__version__}, target sm_{args.arch}")
    failed = 0

    if args.tables:
        raise SystemExit(1 if check_tables(target, args.threads) else 0)

    def compile_one(case: tuple):
        try:
            return compile_case(case[1:], target)
        except Exception as e:  # noqa: BLE001 - report every case
            return e

    start = time.perf_counter()
    all_cases = cases()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        compiled = list(pool.map(compile_one, all_cases))
    wall = time.perf_counter() - start
    for (label, *_), k in zip(all_cases, compiled):
        try:
            if isinstance(k, Exception):
                raise k
            ptx = k.asm["ptx"]
            if args.sass:
                (args.sass / (re.sub(r"\W+", "_", label).strip("_") + ".sass")).write_text(sass(k.asm["cubin"]))
            print(f"{label:44} {resources(k.asm['cubin'])} dyn_shared={k.metadata.shared:6} "
                  f"cp.async={ptx.count('cp.async')} wgmma={ptx.count('wgmma')} mma={ptx.count('mma.sync')}")
        except Exception as e:  # noqa: BLE001 - report every case
            failed += 1
            print(f"{label:40} FAILED: {type(e).__name__}: {str(e)[:400]}")
            if os.environ.get("AOT_VERBOSE"):
                print(str(e))
    print(f"{len(all_cases)} cases compiled in {wall:.1f} s ({args.threads} thread{'s' if args.threads > 1 else ''}; "
          "Triton's cache answers a case compiled before: TRITON_ALWAYS_COMPILE=1 for a cold time)")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
