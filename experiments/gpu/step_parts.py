"""Parts of a Qwen3-30B-A3B decode step timed alone in CUDA graphs (48 layers, distinct weights and
caches per layer so every byte comes from HBM), and the top kernels of a whole dense step.

    python -m experiments.gpu.step_parts --out $OUT/step_parts.json

  attention   decode attention at cache slot 300 of 640: the PyTorch grouped form
              (base.hf.attention.grouped_decode_attention) against kernels/attention.py
  router      what a budgeted selector adds after the router GEMM: router_sum (GEMM over E
              outputs + route_select), base as it runs (one GEMM over [router; predictor], 2E
              outputs), base with two GEMMs, and the GEMMs alone
  kernels     torch.profiler over 8 eager steps of the whole dense model (compiled regions):
              the 30 kernels with the most device time per step
Medians of per-replay CUDA events after warm-up. A diagnosis tool: its numbers are not in the README.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

LAYERS, H, E, TOPK, HQ, KV, D, L, LAST = 48, 2048, 128, 8, 32, 4, 128, 640, 300


def graph_ms(fn, reps: int = 50) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(5):
        g.replay()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    for i in range(reps):
        ev[i].record()
        g.replay()
    ev[-1].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(ev, ev[1:]))


def attention_parts(B: int) -> dict[str, float]:
    from base.hf.attention import grouped_decode_attention
    from kernels.attention import decode_attention

    dt, dev = torch.bfloat16, "cuda"
    ks = [torch.randn(B, KV, L, D, device=dev, dtype=dt) for _ in range(LAYERS)]
    vs = [torch.randn(B, KV, L, D, device=dev, dtype=dt) for _ in range(LAYERS)]
    q = torch.randn(B, HQ, 1, D, device=dev, dtype=dt)
    allowed = torch.zeros(B, 1, 1, L, dtype=torch.bool, device=dev)
    allowed[..., : LAST + 1] = True
    last = torch.tensor([LAST], device=dev)

    def torch_form():
        for k, v in zip(ks, vs):
            grouped_decode_attention(q, k, v, allowed, D**-0.5)

    def triton_form():
        for k, v in zip(ks, vs):
            decode_attention(q[:, :, 0], k, v, allowed[:, 0, 0], last, D**-0.5)

    return {"torch_grouped_ms": graph_ms(torch_form), "triton_ms": graph_ms(triton_form)}


def router_parts(T: int, budget: int = 16) -> dict[str, float]:
    from kernels import route_select

    dt, dev = torch.bfloat16, "cuda"
    z = torch.randn(T, H, device=dev, dtype=dt)
    w_router = [torch.randn(E, H, device=dev, dtype=dt) * 0.02 for _ in range(LAYERS)]
    w_pred = [torch.randn(E, H, device=dev, dtype=dt) * 0.01 for _ in range(LAYERS)]
    w_cat = [torch.cat([a, b]).contiguous() for a, b in zip(w_router, w_pred)]
    b_E = torch.zeros(E, device=dev)
    active = torch.ones(T, dtype=torch.bool, device=dev)
    rs = dict(norm_topk=True, reassign_mode="backfill", renormalize=True)

    def router_sum():
        for w in w_router:
            route_select(F.linear(z, w), TOPK, active, budget, kind="router_sum", **rs)

    def base_fused():
        for w in w_cat:
            out = F.linear(z, w)
            route_select(out[:, :E], TOPK, active, budget, kind="base", g_TE=out[:, E:], pred_b_E=b_E, **rs)

    def base_two_gemms():
        for w, p in zip(w_router, w_pred):
            route_select(F.linear(z, w), TOPK, active, budget, kind="base", g_TE=F.linear(z, p), pred_b_E=b_E, **rs)

    def gemm_router():
        for w in w_router:
            F.linear(z, w)

    def gemm_fused():
        for w in w_cat:
            F.linear(z, w)

    return {name: graph_ms(fn) for name, fn in [("router_sum", router_sum), ("base_fused", base_fused),
                                                 ("base_two_gemms", base_two_gemms), ("gemm_router", gemm_router),
                                                 ("gemm_fused", gemm_fused)]}


def top_kernels(B: int = 16, steps: int = 8) -> list[dict]:
    import yaml

    from base.config import ModelConfig
    from base.hf.loading import load_model
    from base.runtime.engine import DecodeEngine

    root = Path(__file__).resolve().parents[2]
    raw = yaml.safe_load((root / "conf/model/qwen3_30b.yaml").read_text())
    cfg = ModelConfig(**{**raw, "init": "random", "device": "cuda", "tokenizer": "bytes"})
    model = load_model(cfg, root, experts_impl="base_triton")
    engine = DecodeEngine(model, B, 640, graph=False, compile=True)
    ids = torch.randint(0, 1000, (B, 256), device="cuda")
    engine.prefill(ids, torch.ones_like(ids), 384, stop_at_eos=False)
    engine.decode(2)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        engine.decode(steps)
        torch.cuda.synchronize()
    engine.release()
    rows = [{"kernel": e.key[:90], "calls_per_step": e.count / steps, "us_per_step": e.device_time_total / steps}
            for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda r: -r["us_per_step"])
    return rows[:30]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    result = {"attention": {B: attention_parts(B) for B in (1, 16, 64)},
              "router": {T: router_parts(T) for T in (1, 16, 64)}}
    print(json.dumps(result, indent=1), flush=True)
    result["top_kernels_dense_b16"] = top_kernels()
    for r in result["top_kernels_dense_b16"]:
        print(f"{r['us_per_step']:9.1f} us {r['calls_per_step']:6.1f}x  {r['kernel']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
