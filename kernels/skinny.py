"""A decode step's dense projection, y = x @ W^T for a few tokens, in one launch.

    y_TN = skinny_linear(x_TK, w_NK)                 # as F.linear(x_TK, w_NK), no bias
    y_TN = skinny_linear(x_TK, w_NK, launch=SkinnyLaunch(block_n=64, block_k=256, split=4))

Why: at decode the attention's output projection (Qwen3-30B-A3B: 4096 -> 2048) streams 16.8 MB of
weights for 16 tokens. cuBLAS splits K for it (its 64-column tiles leave 32 tiles for 132 SMs) and
adds a reduce launch: 7.7 + 1.7 us per layer on an H200 (results/roofline/grid_2026-12-04/), 2.2 TB/s
before the reduce. Here either each program owns BN output columns of every token and streams its
(BN, K) slice of W once (split 1: with BN = 16 a 2048-wide output is 128 programs, about one per
SM, each reading all of x from L2), or K is cut into `split` shares too (wider column blocks, each
program reading only its share of x) and the last share of a column block to finish sums the
shares' partials in share order, in the same launch: no reduce launch either way. Whether either
beats cuBLAS on a GPU is for tools/bench_skinny.py to say: it writes, per (N, K, token bucket), the
fastest launch and whether it beat cuBLAS ("skinny:N=<N>,K=<K>,T=<T>" in kernels/configs/<gpu>.json,
`skinny_launch` reads it). The decode step uses it wherever the table says it won, with no switch:
for the attention's projections in the default compiled region (base/hf/skinny_proj.py) and for the
router's GEMM (base/method/backends.py); a shape the table does not name keeps cuBLAS.

    _skinny_kernel   grid (cdiv(N, BN), split): program (n, s) takes the s-th share of K and, per
                     tile of TB tokens (one tile up to TB tokens; a split launch takes one tile),
                     steps over it by BK: acc (TB, BN) fp32 += x (TB, BK) @ W[n-block, k-block]^T on
                     the tensor cores. Split 1: stores y in x's dtype. Else: stores its partial
                     (fp32 workspace), then counts its arrival (release/acquire); the last of the
                     column block's shares resets the counter and writes the sum of the partials.

Shapes: T tokens, K input features, N output features. x_TK and w_NK have a contiguous last dim;
y_TN is new and contiguous. fp32 inputs are multiplied in full fp32 (no silent tf32), bf16/fp16
accumulate in fp32 and round once, as cuBLAS does (a split launch adds its shares in fp32, in a
fixed order: deterministic).
Shared memory: a launch the device cannot hold (a bf16-tuned entry run in float32) is refused by
Triton on the host before anything is enqueued; the launch then drops a pipeline stage at a time,
then halves BK, until it fits, and the fitted launch is remembered per shape and dtype
(`fit_shared_memory`, kernels/_triton.py).
Graph safety: grid fixed by (N, launch); no host sync. The partials come from the caching allocator
(the graph's pool); the arrival counters (kernels/_triton.py, kept for the process) return to 0
after every launch, so a captured launch replays. Launches run one at a time on one stream.
Reference: F.linear (tests/test_skinny.py, interpreter on the CPU, fp32; bf16 on a GPU).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels._triton import (
    arrival_counters,
    dual_jit,
    empty,
    fit_shared_memory,
    next_pow2,
)
from kernels.tuned import tuned_entry

MAX_TOKENS = 64  # one token tile of at most 64 rows (larger batches, and prefill, are cuBLAS's)


@dual_jit
def _skinny_kernel(
    x_ptr,  # (T, K)
    w_ptr,  # (N, K)
    y_ptr,  # (T, N) out
    part_ptr,  # (cdiv(N, BN), SPLIT, TB, BN) fp32 (SPLIT > 1): each share's partial sums
    count_ptr,  # (cdiv(N, BN),) int32 arrival counters, 0 between launches (SPLIT > 1)
    T,
    N,
    K,
    stride_xt,
    stride_wn,
    stride_yt,
    TB: tl.constexpr,  # tokens per tile (>= 16 for the tensor cores)
    BN: tl.constexpr,  # output columns per program
    BK: tl.constexpr,  # reduction step
    SPLIT: tl.constexpr,  # shares of K per column block (1: none; > 1: one token tile, T <= TB)
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs, else unused
):
    """Grid (cdiv(N, BN), SPLIT). See the module doc."""
    pid_n = tl.program_id(0)
    s = tl.program_id(1)
    offs_n = pid_n * BN + tl.arange(0, BN)
    n_ok = offs_n < N
    per = tl.cdiv(tl.cdiv(K, BK), SPLIT) * BK  # this share's K range: [s * per, (s + 1) * per)
    k_lo = s * per
    k_hi = tl.minimum(k_lo + per, K)
    for t0 in range(0, T, TB):
        offs_t = t0 + tl.arange(0, TB)
        t_ok = offs_t < T
        acc_TN = tl.zeros((TB, BN), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BK):
            offs_k = k0 + tl.arange(0, BK)
            k_ok = offs_k < k_hi
            x_TK = tl.load(x_ptr + offs_t[:, None] * stride_xt + offs_k[None, :], mask=t_ok[:, None] & k_ok[None, :],
                           other=0.0)
            w_KN = tl.load(w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None], mask=k_ok[:, None] & n_ok[None, :],
                           other=0.0)
            acc_TN = tl.dot(x_TK, w_KN, acc_TN, input_precision=DOT_PRECISION)
        y_at = y_ptr + offs_t[:, None] * stride_yt + offs_n[None, :]
        y_ok = t_ok[:, None] & n_ok[None, :]
        if SPLIT == 1:
            tl.store(y_at, acc_TN.to(y_ptr.dtype.element_ty), mask=y_ok)
        else:
            tb = tl.arange(0, TB)[:, None] * BN + tl.arange(0, BN)[None, :]
            tl.store(part_ptr + (pid_n * SPLIT + s) * TB * BN + tb, acc_TN)
            tl.debug_barrier()  # every thread's stores precede the release below
            arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT - 1:  # the last share of this column block sums all of them, in share order
                tl.store(count_ptr + pid_n, 0)  # back to 0 for the next launch (a graph replays it)
                sum_TN = tl.zeros((TB, BN), dtype=tl.float32)
                for j in range(SPLIT):
                    sum_TN += tl.load(part_ptr + (pid_n * SPLIT + j) * TB * BN + tb, cache_modifier=".cg")
                tl.store(y_at, sum_TN.to(y_ptr.dtype.element_ty), mask=y_ok)


@dataclass(frozen=True)
class SkinnyLaunch:
    """Columns per program, reduction step, pipeline depth, warps and K shares (tools/bench_skinny.py
    times them)."""

    block_n: int = 16
    block_k: int = 256
    num_stages: int = 4
    num_warps: int = 4
    split: int = 1  # shares of K per column block; the last share to finish sums them (no extra launch)

    def __post_init__(self) -> None:
        if self.split not in (1, 2, 4, 8):
            raise ValueError(f"split must be one of 1, 2, 4, 8, got {self.split}")
        for name in ("block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {v}")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"num_warps must be one of 1, 2, 4, 8, got {self.num_warps}")
        if not 1 <= self.num_stages <= 8:
            raise ValueError(f"num_stages must be in [1, 8], got {self.num_stages}")


def skinny_launch(N: int, K: int, T: int, device: torch.device) -> SkinnyLaunch | None:
    """The launch to use for this shape on this device, or None where cuBLAS is the choice: the tuned
    entry's launch where it beat cuBLAS; None where it lost, where nothing is tuned (only a measured
    win moves a GEMM), above MAX_TOKENS, or off a GPU (on the CPU F.linear is the reference)."""
    if device.type != "cuda" or T > MAX_TOKENS:
        return None
    entry = tuned_entry(f"skinny:N={N},K={K}", device, T)
    if not entry or not entry.get("use", False):
        return None
    return launch_from_entry(entry)


def launch_from_entry(entry: dict) -> SkinnyLaunch:
    """A `skinny:` table entry's launch (tools/aot_check.py --tables compiles it too)."""
    return SkinnyLaunch(block_n=entry["block_n"], block_k=entry["block_k"], num_stages=entry["num_stages"],
                        num_warps=entry.get("num_warps", 4), split=entry.get("split", 1))


def skinny_linear(x_TK: Tensor, w_NK: Tensor, launch: SkinnyLaunch | None = None, fit: bool = True) -> Tensor:
    """x_TK @ w_NK^T in x's dtype (F.linear without bias), one launch; see the module doc. `fit`
    False: `launch` exactly, or Triton's OutOfResources where the device cannot hold it (a benchmark
    times the launch it names, never a shrunk one)."""
    if x_TK.dim() != 2 or w_NK.dim() != 2 or x_TK.shape[1] != w_NK.shape[1]:
        raise ValueError(f"x_TK {tuple(x_TK.shape)} and w_NK {tuple(w_NK.shape)} do not multiply")
    if x_TK.dtype != w_NK.dtype:
        raise ValueError(f"x and w dtypes differ: {x_TK.dtype} and {w_NK.dtype}")
    launch = launch or SkinnyLaunch()
    x_TK = x_TK if x_TK.stride(-1) == 1 else x_TK.contiguous()
    w_NK = w_NK if w_NK.stride(-1) == 1 else w_NK.contiguous()
    T, K = x_TK.shape
    N = w_NK.shape[0]
    if launch.split > 1 and T > MAX_TOKENS:
        raise ValueError(f"a split launch takes one token tile: at most {MAX_TOKENS} tokens, got {T}")
    dev = x_TK.device
    y_TN = empty(T, N, device=dev, dtype=x_TK.dtype)
    TB = max(16, min(next_pow2(T), MAX_TOKENS))
    n_blocks = triton.cdiv(N, launch.block_n)

    def run(launch: SkinnyLaunch) -> None:
        if launch.split > 1:
            part = empty(n_blocks * launch.split * TB * launch.block_n, device=dev, dtype=torch.float32)
            counts = arrival_counters(n_blocks, dev, "skinny")
        else:
            part = counts = y_TN  # unused pointers
        _skinny_kernel.on(dev)[(n_blocks, launch.split)](
            x_TK, w_NK, y_TN, part, counts, T, N, K, x_TK.stride(0), w_NK.stride(0), y_TN.stride(0),
            TB=TB, BN=launch.block_n, BK=launch.block_k, SPLIT=launch.split,
            DOT_PRECISION="ieee" if x_TK.dtype == torch.float32 else "tf32", num_warps=launch.num_warps,
            num_stages=launch.num_stages,
        )  # fmt: skip

    # a table entry is timed in bf16: in float32 its pipelined tiles need twice the shared memory
    fit_shared_memory(run, launch, smaller_launch, _FITTED, (dev, launch, TB, x_TK.dtype), fit=fit)
    return y_TN


_FITTED: dict[tuple, SkinnyLaunch] = {}  # (device, asked launch, token tile, dtype) -> the launch that fits


def smaller_launch(launch: SkinnyLaunch) -> SkinnyLaunch | None:
    """The next launch needing less shared memory (each pipeline stage holds an x and a W tile): one
    stage fewer, then at one stage half the reduction step; None at one stage of 16."""
    if launch.num_stages > 1:
        return replace(launch, num_stages=launch.num_stages - 1)
    return None if launch.block_k <= 16 else replace(launch, block_k=launch.block_k // 2)
