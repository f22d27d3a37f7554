"""Decode attention over a static KV cache: one query token per row, grouped query heads, only the
filled part of the cache read (split-KV "flash decoding").

    out_BHE = decode_attention(q_BHD, k_BKLD, v_BKLE, allowed_BL, last_slot_1, scaling)

Why: in a decode step the attention reads each layer's K/V once and does almost no arithmetic, so
its cost is launches and bytes. The PyTorch form (a batched matmul per KV head, a masked softmax,
another matmul) is four or five kernels reading the whole static cache, most of it empty at the
start of a generation. This is one launch reading only the slots up to the newest one written:

    _decode_attention  grid (B*K, S): program (bk, s) takes KV head k of row b and the s-th of S
                     equal shares of the first n = last_slot + 1 slots (read on the device, so the
                     share grows as the cache fills without recompiling or syncing). The G query
                     heads of the group are the rows of a [G, D] x [D, N] tile (padded to 16 rows
                     for tl.dot); online softmax over N-slot blocks. With S = 1 the program writes
                     its (G, E) output; else it writes the share's running max, sum and
                     unnormalised output, and the LAST of the S programs of (b, k) to finish (an
                     arrival counter per (b, k), incremented with release/acquire semantics, reset
                     by that program) rescales and sums the S shares into (B, Hq, E).
                     With attention sinks (HAS_SINK, GPT-OSS's `s_aux`): share 0 adds each query
                     head's sink, a logit that takes probability mass and adds no value, after its
                     loop (online softmax does not care which share adds it).

Why one launch: until 2026-12-02 the combine was a second kernel, one more launch per layer of a
decode step (48 on Qwen3-30B-A3B), each a few microseconds of launch and ramp-up for a few
kilobytes of work.

Masking: `allowed_BL` (bool, row b may attend to slot l: filled, not padding, inside a sliding
window) is applied per slot; slots after last_slot are never read. A row with no allowed slot
returns zeros (the PyTorch form would return NaN; the engine never asks for one).

Shapes: B batch rows, Hq query heads, K KV heads, G = Hq / K, L cache slots, D key size, E value
size (D != E allowed: DeepSeek's MLA). Any float dtype; scores and softmax in float32.
Graph safety: no host sync, shapes fixed for given (B, Hq, K, L, D, E); S is chosen on the host
from these shapes only. Scratch buffers come from the caching allocator (the graph's pool); the
arrival counters (`arrival_counters`) live for the process and return to 0 after every launch, so
a captured launch replays. Launches that may run concurrently on one device must not share
counters: the engine runs one layer's attention at a time on one stream.
Reference: `decode_attention_reference` below (per head over K/V repeated per group), tested
against it in tests/test_kernels.py (interpreter on the CPU, compiled on the GPU).
Tuning (`AttentionLaunch`): slots per block, warps, and the programs S is sized for; tuned per GPU
in kernels/configs/<gpu>.json (tools/tune_step_kernels.py): per group size and batch bucket
("attention:G=<G>,D=<D_BLOCK>,T=<rows bucket>"), else one entry per G block for every batch
("attention:G=<G_BLOCK>,D=<D_BLOCK>"), else 64 slots, 4 warps and 264 programs (about two per SM of
an H200). A tuned launch whose tiles the device cannot hold in the dtype actually run (an entry
timed in bf16, run in float32) is halved in BLOCK_N until it fits (`fit_shared_memory`,
kernels/_triton.py), once per shape and dtype.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton.language as tl
from torch import Tensor

from kernels._triton import arrival_counters as _arrival_counters
from kernels._triton import dual_jit, empty, fit_shared_memory, next_pow2
from kernels.tuned import tuned_entry


@dataclass(frozen=True)
class AttentionLaunch:
    """BLOCK_N cache slots per inner step, the warps of a program, and the number of programs
    the shares S are sized for (more shares: more parallel reads, a longer combine)."""

    block_n: int = 64
    num_warps: int = 4
    target_programs: int = 264

    def __post_init__(self) -> None:
        if self.block_n not in (16, 32, 64, 128, 256):
            raise ValueError(f"block_n must be a power of two in [16, 256], got {self.block_n}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps}")
        if self.target_programs < 1:
            raise ValueError(f"target_programs must be >= 1, got {self.target_programs}")


def attention_launch(G: int, D: int, device: torch.device, B: int | None = None) -> AttentionLaunch:
    """The tuned launch for G query heads per KV head, key size D and B rows on this device: the
    entry for this G and B's bucket (the nearest bucket tuned), else the one for G's block over
    every batch, else the default. Why per batch: the best split of the cache differs between 1
    and 64 rows (tools/tune_step_kernels.py)."""
    entry = tuned_entry(f"attention:G={G},D={next_pow2(D, 16)}", device, T=B) if B is not None else {}
    entry = entry or tuned_entry(f"attention:G={next_pow2(G, 16)},D={next_pow2(D, 16)}", device)
    return launch_from_entry(entry)


def launch_from_entry(entry: dict) -> AttentionLaunch:
    """An `attention:` table entry's launch, the default's fields where it names none ({}: the
    default; tools/aot_check.py --tables compiles it too)."""
    default = AttentionLaunch()
    return AttentionLaunch(block_n=entry.get("BLOCK_N", default.block_n), num_warps=entry.get("num_warps", default.num_warps),
                           target_programs=entry.get("target_programs", default.target_programs))


@dual_jit
def _decode_attention(
    q_ptr, k_ptr, v_ptr, allowed_ptr, last_ptr, m_ptr, l_ptr, acc_ptr, count_ptr, out_ptr, sink_ptr,
    scaling, K, G, D, E, S,
    sq_b, sq_h, sk_b, sk_k, sk_l, sv_b, sv_k, sv_l, sa_b, so_b, so_h,
    G_BLOCK: tl.constexpr, D_BLOCK: tl.constexpr, E_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
    ONE_SHARE: tl.constexpr, HAS_SINK: tl.constexpr,
):
    bk = tl.program_id(0)
    s = tl.program_id(1)
    b = bk // K
    kh = bk % K
    n = tl.load(last_ptr) + 1  # slots filled so far (device scalar)
    n_blocks = tl.cdiv(n, BLOCK_N)
    per = tl.cdiv(n_blocks, S)
    lo = s * per
    hi = tl.minimum(lo + per, n_blocks)
    g = tl.arange(0, G_BLOCK)
    d = tl.arange(0, D_BLOCK)
    e = tl.arange(0, E_BLOCK)
    g_ok = g < G
    q_GD = tl.load(q_ptr + b * sq_b + (kh * G + g)[:, None] * sq_h + d[None, :],
                   mask=g_ok[:, None] & (d[None, :] < D), other=0.0)
    m_G = tl.full((G_BLOCK,), float("-inf"), tl.float32)
    l_G = tl.zeros((G_BLOCK,), tl.float32)
    acc_GE = tl.zeros((G_BLOCK, E_BLOCK), tl.float32)
    for blk in range(lo, hi):
        slot = blk * BLOCK_N + tl.arange(0, BLOCK_N)
        in_n = slot < n
        ok = in_n & (tl.load(allowed_ptr + b * sa_b + slot, mask=in_n, other=0) != 0)
        k_ND = tl.load(k_ptr + b * sk_b + kh * sk_k + slot[:, None] * sk_l + d[None, :],
                       mask=in_n[:, None] & (d[None, :] < D), other=0.0)
        s_GN = tl.dot(q_GD, tl.trans(k_ND), input_precision="ieee").to(tl.float32) * scaling
        s_GN = tl.where(ok[None, :], s_GN, float("-inf"))
        m_new = tl.maximum(m_G, tl.max(s_GN, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing allowed yet: no rescale
        p_GN = tl.exp(s_GN - m_safe[:, None])
        alpha = tl.exp(m_G - m_safe)
        v_NE = tl.load(v_ptr + b * sv_b + kh * sv_k + slot[:, None] * sv_l + e[None, :],
                       mask=in_n[:, None] & (e[None, :] < E), other=0.0)
        acc_GE = acc_GE * alpha[:, None] + tl.dot(p_GN.to(v_NE.dtype), v_NE, input_precision="ieee").to(tl.float32)
        l_G = l_G * alpha + tl.sum(p_GN, axis=1)
        m_G = m_new
    if HAS_SINK:  # noqa: SIM102 (a constexpr branch)
        if s == 0:  # each head's sink: one more logit, no value, added by one share
            sk_G = tl.load(sink_ptr + kh * G + g, mask=g_ok, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m_G, sk_G)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_G - m_safe)
            acc_GE = acc_GE * alpha[:, None]
            l_G = l_G * alpha + tl.exp(sk_G - m_safe)
            m_G = m_new
    out_mask = g_ok[:, None] & (e[None, :] < E)
    out_at = out_ptr + b * so_b + (kh * G + g)[:, None] * so_h + e[None, :]
    if ONE_SHARE:  # the whole cache in this program: normalise and write
        tl.store(out_at, (acc_GE / tl.where(l_G > 0, l_G, 1.0)[:, None]).to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        row = (bk * S + s) * G_BLOCK + g
        tl.store(m_ptr + row, m_G)
        tl.store(l_ptr + row, l_G)
        tl.store(acc_ptr + row[:, None] * E_BLOCK + e[None, :], acc_GE)
        tl.debug_barrier()  # every thread's stores precede the release below
        arrived = tl.atomic_add(count_ptr + bk, 1, sem="acq_rel", scope="gpu")
        if arrived == S - 1:  # the last share of (row, KV head) to finish combines all S
            tl.store(count_ptr + bk, 0)  # back to 0 for the next launch (a graph replays it)
            m_G = tl.full((G_BLOCK,), float("-inf"), tl.float32)
            for t in range(S):
                m_G = tl.maximum(m_G, tl.load(m_ptr + (bk * S + t) * G_BLOCK + g, cache_modifier=".cg"))
            m_safe = tl.where(m_G == float("-inf"), 0.0, m_G)
            l_G = tl.zeros((G_BLOCK,), tl.float32)
            acc_GE = tl.zeros((G_BLOCK, E_BLOCK), tl.float32)
            for t in range(S):
                r = (bk * S + t) * G_BLOCK + g
                w_G = tl.exp(tl.load(m_ptr + r, cache_modifier=".cg") - m_safe)
                l_G += w_G * tl.load(l_ptr + r, cache_modifier=".cg")
                acc_GE += w_G[:, None] * tl.load(acc_ptr + r[:, None] * E_BLOCK + e[None, :], cache_modifier=".cg")
            tl.store(out_at, (acc_GE / tl.where(l_G > 0, l_G, 1.0)[:, None]).to(out_ptr.dtype.element_ty),
                     mask=out_mask)


_FITTED: dict[tuple, AttentionLaunch] = {}  # (device, asked launch, blocks, dtypes) -> the launch that fits


def smaller_launch(launch: AttentionLaunch) -> AttentionLaunch | None:
    """Half the slots per block (the K/V tiles are what fills shared memory), None below 16."""
    return None if launch.block_n <= 16 else dataclasses.replace(launch, block_n=launch.block_n // 2)


def arrival_counters(n: int, device: torch.device) -> Tensor:
    """n int32 counters at 0, one per (row, KV head): each launch's last share resets its own
    (kernels/_triton.py's pool for this kernel)."""
    return _arrival_counters(n, device, "attention")


def splits_for(batch_kv_heads: int, slots: int, launch: AttentionLaunch = AttentionLaunch()) -> int:
    """Shares of the cache per (row, KV head): about `target_programs` programs, each at least one block."""
    cdiv = lambda a, b: -(-a // b)
    return max(1, min(cdiv(launch.target_programs, batch_kv_heads), cdiv(slots, launch.block_n), 16))


def decode_attention(q_BHD: Tensor, k_BKLD: Tensor, v_BKLE: Tensor, allowed_BL: Tensor, last_slot_1: Tensor,
                     scaling: float, launch: AttentionLaunch | None = None, sinks_H: Tensor | None = None,
                     fit: bool = True) -> Tensor:
    """softmax(q k^T * scaling over allowed slots <= last_slot) v, per query head; returns
    (B, Hq, E) in q's dtype. `allowed_BL` is bool (unit last stride); `last_slot_1` an int tensor
    of one element on the device: the newest slot written (later slots are not read). `launch`:
    the tuned one for (G, D) on this device when None. `sinks_H` (Hq,): attention sinks (GPT-OSS's
    `s_aux`), one logit per query head that takes probability mass and contributes no value: the
    softmax is over [the allowed slots' scores, the sink]. `fit` False: `launch` exactly, or Triton's
    OutOfResources where the device cannot hold it (a tuner times the launch it names, never a
    halved one)."""
    B, Hq, D = q_BHD.shape
    K, L, E = k_BKLD.shape[1], k_BKLD.shape[2], v_BKLE.shape[-1]
    if Hq % K or k_BKLD.stride(-1) != 1 or v_BKLE.stride(-1) != 1 or q_BHD.stride(-1) != 1:
        raise ValueError("decode_attention needs Hq divisible by K and unit-stride head dimensions")
    if sinks_H is not None and tuple(sinks_H.shape) != (Hq,):
        raise ValueError(f"decode_attention: sinks of shape {tuple(sinks_H.shape)} do not match the {Hq} query heads")
    sinks = sinks_H.contiguous() if sinks_H is not None else q_BHD  # not read without HAS_SINK
    G = Hq // K
    G_BLOCK, D_BLOCK, E_BLOCK = next_pow2(G, 16), next_pow2(D, 16), next_pow2(E, 16)
    dev = q_BHD.device
    out = torch.empty(B, Hq, E, dtype=q_BHD.dtype, device=dev)
    allowed = allowed_BL.view(torch.uint8) if allowed_BL.dtype == torch.bool else allowed_BL

    def run(launch: AttentionLaunch) -> None:
        S = splits_for(B * K, L, launch)
        m = empty(B * K * S * G_BLOCK, dtype=torch.float32, device=dev)
        l_ = empty(B * K * S * G_BLOCK, dtype=torch.float32, device=dev)
        acc = empty(B * K * S * G_BLOCK, E_BLOCK, dtype=torch.float32, device=dev)
        _decode_attention.on(dev)[(B * K, S)](
            q_BHD, k_BKLD, v_BKLE, allowed, last_slot_1, m, l_, acc, arrival_counters(B * K, dev), out, sinks,
            float(scaling), K, G, D, E, S,
            q_BHD.stride(0), q_BHD.stride(1), k_BKLD.stride(0), k_BKLD.stride(1), k_BKLD.stride(2),
            v_BKLE.stride(0), v_BKLE.stride(1), v_BKLE.stride(2), allowed.stride(0), out.stride(0), out.stride(1),
            G_BLOCK=G_BLOCK, D_BLOCK=D_BLOCK, E_BLOCK=E_BLOCK, BLOCK_N=launch.block_n, ONE_SHARE=S == 1,
            HAS_SINK=sinks_H is not None, num_warps=launch.num_warps,
        )  # fmt: skip

    launch = launch or attention_launch(G, D, dev, B)
    key = (dev, launch, G_BLOCK, D_BLOCK, E_BLOCK, q_BHD.dtype, k_BKLD.dtype)
    fit_shared_memory(run, launch, smaller_launch, _FITTED, key, fit=fit)
    return out


def decode_attention_reference(q_BHD: Tensor, k_BKLD: Tensor, v_BKLE: Tensor, allowed_BL: Tensor, last_slot: int,
                               scaling: float, sinks_H: Tensor | None = None) -> Tensor:
    """Per query head over K/V repeated for its group, float32; rows with no allowed slot: 0.
    With sinks, each head's sink is one more logit in the softmax, with no value."""
    n_slots = last_slot + 1
    B, Hq = q_BHD.shape[:2]
    G = Hq // k_BKLD.shape[1]
    k_BHLD = k_BKLD[:, :, :n_slots].float().repeat_interleave(G, 1)
    v_BHLE = v_BKLE[:, :, :n_slots].float().repeat_interleave(G, 1)
    s_BHL = torch.einsum("bhd,bhld->bhl", q_BHD.float(), k_BHLD) * scaling
    s_BHL = s_BHL.masked_fill(~allowed_BL[:, None, :n_slots], float("-inf"))
    if sinks_H is not None:
        s_BHL = torch.cat([s_BHL, sinks_H.float().view(1, Hq, 1).expand(B, Hq, 1)], -1)
    p_BHL = torch.nan_to_num(s_BHL.softmax(-1), nan=0.0)[..., :n_slots]
    return torch.einsum("bhl,bhle->bhe", p_BHL, v_BHLE).to(q_BHD.dtype)

