"""A layer's shared experts: the model's eager MLP and add against the expert kernel's chunks.

    python -m tools.bench_shared --ts 1 16 64 --rounds 7 --csv bench_shared.csv
    python -m analysis.kernel_ab bench_shared.csv --over eager

What a decode step runs for one MoE layer's shared experts after the routed output y_TH exists:
`eager` is the family's own (gate and up GEMMs, SiLU, the product, down, the add to y), `four` and
`kept` are base/hf/shared_experts.py's call (C chunks of the routed shape, y the residual) on the
expert kernel's four-launch path and on its kept-list path, each with the tuned entry of the routed
shape (H, I, T) where this GPU has one. Every form's output is first checked against `eager`'s
(relative error within 1e-2). Timed as tools/timing.py times (CUDA-graph replay of every weight set
once, sets rotated past the L2), one round timing each form once in rotated order: a row per
(model, T, form, round), the columns analysis.kernel_ab reads (`impl` is the form).
Shapes: DeepSeek-V2-Lite (H 2048, I 1408, 2 chunks), Qwen1.5-MoE-A2.7B (2048, 1408, 4).
"""
from __future__ import annotations

import argparse
import csv
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from base.hf.shared_experts import constant_routing
from kernels.experts import fused_experts, get_config
from tools.timing import time_graph

SHAPES = {"deepseek_v2_lite": (2048, 1408, 2), "qwen15_moe": (2048, 1408, 4)}  # (H, I routed, chunks)
FORMS = ("eager", "four", "kept")


def weight_sets(H: int, I_s: int, n: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """n independent ([gate; up] (2 I_s, H), down (H, I_s)) in bf16, 0.02 std."""
    g = torch.Generator(device=device).manual_seed(0)
    return [((torch.randn(2 * I_s, H, generator=g, device=device) * 0.02).bfloat16(),
             (torch.randn(H, I_s, generator=g, device=device) * 0.02).bfloat16()) for _ in range(n)]  # fmt: skip


def form_call(form: str, x_TH, y_TH, gate_up, down, I: int, C: int, routing):
    """One layer's shared experts added to y_TH, as `form` runs them."""
    T, H = x_TH.shape
    I_s = I * C
    if form == "eager":
        gate, up = gate_up[:I_s], gate_up[I_s:]
        return lambda: y_TH + F.linear(F.silu(F.linear(x_TH, gate)) * F.linear(x_TH, up), down)
    idx_TC, ones_TC, keep_C = routing
    cfg = replace(get_config(H, I, T, x_TH.device), use_kept=form == "kept", kept_max=None)
    gate_CIH = gate_up.as_strided((C, I, H), (I * H, H, 1))
    down_CHI = down.as_strided((C, H, I), (I, I_s, 1))
    return lambda: fused_experts(x_TH, gate_CIH, down_CHI, idx_TC[:T], ones_TC[:T], keep_M=keep_C, residual_TH=y_TH,
                                 up_offset=I_s, config=cfg)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--ts", nargs="*", type=int, default=[1, 16, 64])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--sets", type=int, default=4, help="weight sets rotated (past the L2)")
    ap.add_argument("--csv", type=Path, required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: bench_shared: needs a CUDA GPU (the timings are graph replays)")
    if args.rounds < 1 or any(t < 1 or t > 64 for t in args.ts):
        raise SystemExit("error: bench_shared: --rounds >= 1 and every --ts in [1, 64] (the decode kernel's sizes)")
    dev = torch.device("cuda")
    rows = []
    for model in args.models:
        H, I, C = SHAPES[model]
        sets = weight_sets(H, I * C, args.sets, dev)
        routing = constant_routing(C, dev, torch.bfloat16)
        for T in args.ts:
            g = torch.Generator(device=dev).manual_seed(T)
            x_TH = torch.randn(T, H, generator=g, device=dev).bfloat16()
            y_TH = torch.randn(T, H, generator=g, device=dev).bfloat16()
            calls = {f: [form_call(f, x_TH, y_TH, gu, dn, I, C, routing) for gu, dn in sets] for f in FORMS}
            ref = calls["eager"][0]().double()
            for f in FORMS[1:]:
                err = ((calls[f][0]().double() - ref).norm() / ref.norm()).item()
                if not err <= 1e-2:
                    raise SystemExit(f"error: bench_shared: {model} T={T} {f} differs from eager (relative error {err:.3g})")
            for r in range(args.rounds):
                order = FORMS[r % len(FORMS):] + FORMS[:r % len(FORMS)]
                for f in order:
                    us, timing = time_graph(calls[f], args.reps, dev)
                    rows.append({"model": model, "T": T, "impl": f, "round": r, "us": round(us, 3), "timing": timing})
                    print(f"[bench_shared] {model} T={T} round {r} {f}: {us:.2f} us", flush=True)
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
