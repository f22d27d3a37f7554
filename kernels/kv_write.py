"""Each row's new key and value into its own slot of a static KV cache, in one launch.

    write_kv_rows(k_BKLD, v_BKLE, k_BKD, v_BKE, slot_B)   # k_BKLD[b, :, slot_B[b]] = k_BKD[b], same for v

Why: continuous batching decodes every row at its own position, so a decode step writes row b's
K/V heads at slot slot_B[b]. In PyTorch that is an index_copy_ (or scatter_) per cache, and inside
a compiled region Inductor made it out of place: a copy of the whole cache and a copy back, per
layer, for K and V (2.0 of a 7.9 ms step, base M=16 on an H200). Run eagerly instead, it was two
launches and a graph break that split the layer's compiled attention in two (2.2 more kernels per
layer than the static engine's step). This kernel is one launch for both caches, called through a
custom op that declares the two caches mutated (base/hf/attention.py), so the compiled region
keeps it in place and whole.

    _write_kv_rows_kernel  grid (B, K): program (b, k) copies row b's head k, D key and E value
                           elements, to slot slot_B[b] of both caches.

Shapes: B rows, K KV heads, L cache slots, D key size, E value size (D != E allowed). Any dtype; the
new values are cast to the cache's. Caches and new values may be strided (last dim contiguous).
Slots are read on the device (no host sync); a slot outside [0, L) is not written.
Graph safety: fixed grid for given (B, K); no scratch buffers; safe to capture and replay.
Tuning: none. At Qwen3-30B-A3B's shape with 16 rows it writes 32 KB per layer in 1.1 us on an
H200 (results/serve/grid_2026-12-04b/'s probe profile): a kernel's minimum time, not bandwidth.
Reference: `write_kv_rows_reference` below (advanced-index assignment), tested against it in
tests/test_kernels.py (interpreter on the CPU).
"""
from __future__ import annotations

import torch
import triton.language as tl
from torch import Tensor

from kernels._triton import dual_jit, next_pow2


@dual_jit
def _write_kv_rows_kernel(
    k_cache_ptr, v_cache_ptr, k_new_ptr, v_new_ptr, slot_ptr, L,
    s_kb, s_kk, s_kl, s_vb, s_vk, s_vl,  # cache strides (last dim 1)
    s_nkb, s_nkk, s_nvb, s_nvk,  # new values' strides (last dim 1)
    D: tl.constexpr, E: tl.constexpr, D_BLOCK: tl.constexpr, E_BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    k = tl.program_id(1)
    slot = tl.load(slot_ptr + b)
    n_d = tl.where((slot >= 0) & (slot < L), D, 0)  # a slot outside the cache: nothing written
    n_e = tl.where((slot >= 0) & (slot < L), E, 0)
    offs_d = tl.arange(0, D_BLOCK)
    offs_e = tl.arange(0, E_BLOCK)
    key = tl.load(k_new_ptr + b * s_nkb + k * s_nkk + offs_d, mask=offs_d < D)
    val = tl.load(v_new_ptr + b * s_nvb + k * s_nvk + offs_e, mask=offs_e < E)
    k_row = k_cache_ptr + b * s_kb + k * s_kk + slot * s_kl
    v_row = v_cache_ptr + b * s_vb + k * s_vk + slot * s_vl
    tl.store(k_row + offs_d, key.to(k_cache_ptr.dtype.element_ty), mask=offs_d < n_d)
    tl.store(v_row + offs_e, val.to(v_cache_ptr.dtype.element_ty), mask=offs_e < n_e)


def write_kv_rows(k_BKLD: Tensor, v_BKLE: Tensor, k_BKD: Tensor, v_BKE: Tensor, slot_B: Tensor) -> None:
    """In place: k_BKLD[b, :, slot_B[b]] = k_BKD[b] and v_BKLE[b, :, slot_B[b]] = v_BKE[b] for every row b."""
    B, K, L, D = k_BKLD.shape
    E = v_BKLE.shape[-1]
    if k_BKD.shape != (B, K, D) or v_BKE.shape != (B, K, E) or v_BKLE.shape[:3] != (B, K, L) or slot_B.shape != (B,):
        raise ValueError(f"write_kv_rows: caches {tuple(k_BKLD.shape)}, {tuple(v_BKLE.shape)}, new "
                         f"{tuple(k_BKD.shape)}, {tuple(v_BKE.shape)}, slots {tuple(slot_B.shape)} do not match")
    for name, t in (("k cache", k_BKLD), ("v cache", v_BKLE), ("new k", k_BKD), ("new v", v_BKE), ("slots", slot_B)):
        if t.stride(-1) != 1:
            raise ValueError(f"write_kv_rows: {name} must be contiguous in its last dimension")
    _write_kv_rows_kernel.on(k_BKLD.device)[(B, K)](
        k_BKLD, v_BKLE, k_BKD, v_BKE, slot_B, L,
        k_BKLD.stride(0), k_BKLD.stride(1), k_BKLD.stride(2), v_BKLE.stride(0), v_BKLE.stride(1), v_BKLE.stride(2),
        k_BKD.stride(0), k_BKD.stride(1), v_BKE.stride(0), v_BKE.stride(1),
        D=D, E=E, D_BLOCK=next_pow2(D), E_BLOCK=next_pow2(E))


def write_kv_rows_reference(k_BKLD: Tensor, v_BKLE: Tensor, k_BKD: Tensor, v_BKE: Tensor, slot_B: Tensor) -> None:
    """The same writes in PyTorch (every slot in range)."""
    rows_B = torch.arange(slot_B.shape[0], device=slot_B.device)
    k_BKLD[rows_B, :, slot_B] = k_BKD.to(k_BKLD.dtype)
    v_BKLE[rows_B, :, slot_B] = v_BKE.to(v_BKLE.dtype)
