"""Decode attention over a static KV cache: one query token per row, grouped query heads, only the
filled part of the cache read (split-KV "flash decoding").

    out_BHE = decode_attention(q_BHD, k_BKLD, v_BKLE, allowed_BL, last_slot_1, scaling)
    out_BHE = fused_decode_attention(q_raw_BHD, NewToken(k_raw_BKD, v_BKE, cos_BD, sin_BD, pos_B, q_norm_D,
                                     k_norm_D, eps), k_BKLD, v_BKLE, allowed_BL, last_slot_1, scaling)

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

Why one launch: until 2026-12-02 the combine was a second kernel, one more launch per layer of a
decode step (48 on Qwen3-30B-A3B), each a few microseconds of launch and ramp-up for a few
kilobytes of work.

The fused form (NEW, base/hf/fused_attention.py): q and this step's key arrive raw from the q/k/v
GEMM. Every program applies the per-head RMSNorm (QK_NORM) and the rotary to its G query heads and
to its KV head's new key (rotate_half by loading each element's partner at d +- D/2), rounding
every product and sum to the model's dtype as transformers' eager ops do; share 0 writes the new
key and value at the row's slot pos_B[b], and every share substitutes them from registers when its
slot block holds pos_B[b] (another share may read that slot before share 0's store lands). What it
replaces: the compiled half's q/k-norm and rotary/cache-write kernels (two launches a layer; three
with continuous batching's per-row write). Reference: `fused_decode_attention_reference` (the
ops one by one), tested in tests/test_fused_attention.py (interpreter; compiled on the GPU).

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
    default = AttentionLaunch()
    return AttentionLaunch(block_n=entry.get("BLOCK_N", default.block_n), num_warps=entry.get("num_warps", default.num_warps),
                           target_programs=entry.get("target_programs", default.target_programs))


@dual_jit
def _decode_attention(
    q_ptr, k_ptr, v_ptr, allowed_ptr, last_ptr, m_ptr, l_ptr, acc_ptr, count_ptr, out_ptr,
    scaling, K, G, D, E, S,
    sq_b, sq_h, sk_b, sk_k, sk_l, sv_b, sv_k, sv_l, sa_b, so_b, so_h,
    # the fused form (NEW): this step's raw k and v, rotary cos/sin, the write slots, q/k norm weights
    kn_ptr, vn_ptr, cos_ptr, sin_ptr, pos_ptr, qw_ptr, kw_ptr, eps, L,
    skn_b, skn_k, svn_b, svn_k, sc_b, sp_b,
    G_BLOCK: tl.constexpr, D_BLOCK: tl.constexpr, E_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
    ONE_SHARE: tl.constexpr,
    NEW: tl.constexpr = False,  # q and the new k are raw: norm, rotate, write k/v at pos, then attend
    QK_NORM: tl.constexpr = False,  # NEW with a per-head RMSNorm of q and k before the rotary
    PDL: tl.constexpr = False,  # set by the launcher on sm90+ GPUs (kernels/_triton.py)
):
    if PDL:  # kernels/_triton.py: wait for the previous grid, then let the next one launch
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
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
    q_mask = g_ok[:, None] & (d[None, :] < D)
    q_GD = tl.load(q_ptr + b * sq_b + (kh * G + g)[:, None] * sq_h + d[None, :], mask=q_mask, other=0.0)
    if NEW:  # this step's token: q/k norm and rotary as transformers rounds them, k/v into the cache
        dt = q_ptr.dtype.element_ty
        d_ok = d < D
        partner = (d + D // 2) % D  # rotate_half(x)[d] = -x[d + D/2] (d < D/2), x[d - D/2] (else)
        sign = tl.where(d < D // 2, -1.0, 1.0)
        cos_D = tl.load(cos_ptr + b * sc_b + d, mask=d_ok, other=0.0).to(tl.float32)
        sin_D = tl.load(sin_ptr + b * sc_b + d, mask=d_ok, other=0.0).to(tl.float32)
        qp_GD = tl.load(q_ptr + b * sq_b + (kh * G + g)[:, None] * sq_h + partner[None, :], mask=q_mask, other=0.0)
        k_D = tl.load(kn_ptr + b * skn_b + kh * skn_k + d, mask=d_ok, other=0.0)
        kp_D = tl.load(kn_ptr + b * skn_b + kh * skn_k + partner, mask=d_ok, other=0.0)
        if QK_NORM:  # weight * (x * rsqrt(mean(x^2) + eps)).to(dtype), the mean over the head in fp32
            wq_D = tl.load(qw_ptr + d, mask=d_ok, other=0.0).to(tl.float32)
            wqp_D = tl.load(qw_ptr + partner, mask=d_ok, other=0.0).to(tl.float32)
            qf_GD = q_GD.to(tl.float32)
            inv_G = tl.rsqrt(tl.sum(qf_GD * qf_GD, axis=1) / D + eps)
            q_GD = (wq_D[None, :] * (qf_GD * inv_G[:, None]).to(dt).to(tl.float32)).to(dt)
            qp_GD = (wqp_D[None, :] * (qp_GD.to(tl.float32) * inv_G[:, None]).to(dt).to(tl.float32)).to(dt)
            wk_D = tl.load(kw_ptr + d, mask=d_ok, other=0.0).to(tl.float32)
            wkp_D = tl.load(kw_ptr + partner, mask=d_ok, other=0.0).to(tl.float32)
            kf_D = k_D.to(tl.float32)
            inv = tl.rsqrt(tl.sum(kf_D * kf_D, axis=0) / D + eps)
            k_D = (wk_D * (kf_D * inv).to(dt).to(tl.float32)).to(dt)
            kp_D = (wkp_D * (kp_D.to(tl.float32) * inv).to(dt).to(tl.float32)).to(dt)
        # x * cos + rotate_half(x) * sin, each product and the sum rounded to the dtype
        q_GD = ((q_GD.to(tl.float32) * cos_D[None, :]).to(dt).to(tl.float32)
                + (sign[None, :] * qp_GD.to(tl.float32) * sin_D[None, :]).to(dt).to(tl.float32)).to(dt)
        k_D = ((k_D.to(tl.float32) * cos_D).to(dt).to(tl.float32)
               + (sign * kp_D.to(tl.float32) * sin_D).to(dt).to(tl.float32)).to(k_ptr.dtype.element_ty)
        v_E = tl.load(vn_ptr + b * svn_b + kh * svn_k + e, mask=e < E, other=0.0).to(v_ptr.dtype.element_ty)
        pos = tl.load(pos_ptr + b * sp_b)
        if s == 0:  # one writer; every share reads the new slot from registers (below), not memory
            inside = (pos >= 0) & (pos < L)  # a slot outside the cache: nothing written (as kv_write.py)
            tl.store(k_ptr + b * sk_b + kh * sk_k + pos * sk_l + d, k_D, mask=d < tl.where(inside, D, 0))
            tl.store(v_ptr + b * sv_b + kh * sv_k + pos * sv_l + e, v_E, mask=e < tl.where(inside, E, 0))
    m_G = tl.full((G_BLOCK,), float("-inf"), tl.float32)
    l_G = tl.zeros((G_BLOCK,), tl.float32)
    acc_GE = tl.zeros((G_BLOCK, E_BLOCK), tl.float32)
    for blk in range(lo, hi):
        slot = blk * BLOCK_N + tl.arange(0, BLOCK_N)
        in_n = slot < n
        ok = in_n & (tl.load(allowed_ptr + b * sa_b + slot, mask=in_n, other=0) != 0)
        k_ND = tl.load(k_ptr + b * sk_b + kh * sk_k + slot[:, None] * sk_l + d[None, :],
                       mask=in_n[:, None] & (d[None, :] < D), other=0.0)
        if NEW:
            k_ND = tl.where((slot == pos)[:, None], k_D[None, :], k_ND)
        s_GN = tl.dot(q_GD, tl.trans(k_ND), input_precision="ieee").to(tl.float32) * scaling
        s_GN = tl.where(ok[None, :], s_GN, float("-inf"))
        m_new = tl.maximum(m_G, tl.max(s_GN, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing allowed yet: no rescale
        p_GN = tl.exp(s_GN - m_safe[:, None])
        alpha = tl.exp(m_G - m_safe)
        v_NE = tl.load(v_ptr + b * sv_b + kh * sv_k + slot[:, None] * sv_l + e[None, :],
                       mask=in_n[:, None] & (e[None, :] < E), other=0.0)
        if NEW:
            v_NE = tl.where((slot == pos)[:, None], v_E[None, :], v_NE)
        acc_GE = acc_GE * alpha[:, None] + tl.dot(p_GN.to(v_NE.dtype), v_NE, input_precision="ieee").to(tl.float32)
        l_G = l_G * alpha + tl.sum(p_GN, axis=1)
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


_FITTED: dict[tuple, AttentionLaunch] = {}  # (device, asked launch, blocks, dtypes, form) -> the launch that fits


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
                     scaling: float, launch: AttentionLaunch | None = None) -> Tensor:
    """softmax(q k^T * scaling over allowed slots <= last_slot) v, per query head; returns
    (B, Hq, E) in q's dtype. `allowed_BL` is bool (unit last stride); `last_slot_1` an int tensor
    of one element on the device: the newest slot written (later slots are not read). `launch`:
    the tuned one for (G, D) on this device when None."""
    return _launch(q_BHD, k_BKLD, v_BKLE, allowed_BL, last_slot_1, scaling, launch, None)


@dataclass(frozen=True)
class NewToken:
    """The fused form's inputs for this step's token (shapes as in the module doc): its raw keys
    k_BKD and values v_BKE (views of the q/k/v GEMM's output), the rotary cos_BD and sin_BD (the
    model's, full head size), the cache slot each row writes (pos_B, or one slot (1,) for every
    row; a slot outside the cache is not written), and the per-head RMSNorm weights of q and k
    (None: no q/k norm) with their epsilon."""

    k_BKD: Tensor
    v_BKE: Tensor
    cos_BD: Tensor
    sin_BD: Tensor
    pos_B: Tensor
    q_norm_D: Tensor | None = None
    k_norm_D: Tensor | None = None
    eps: float = 1e-6


def fused_decode_attention(q_BHD: Tensor, new: NewToken, k_BKLD: Tensor, v_BKLE: Tensor, allowed_BL: Tensor,
                           last_slot_1: Tensor, scaling: float, launch: AttentionLaunch | None = None) -> Tensor:
    """decode_attention with this step's token raw: q (B, Hq, D) and new.k_BKD go through the
    per-head RMSNorm (when new.q_norm_D is given) and the rotary, new.k_BKD and new.v_BKE are
    written at new.pos_B of each row, and q attends over the cache including them; one launch.
    Rounds as transformers' eager ops do (each product and sum to the model's dtype)."""
    B, _, D = q_BHD.shape
    K = k_BKLD.shape[1]
    if D % 2 or new.cos_BD.shape[-1] != D or new.k_BKD.shape != (B, K, D):
        raise ValueError(f"fused_decode_attention needs an even head size with full rotary: D={D}, "
                         f"cos {tuple(new.cos_BD.shape)}, k {tuple(new.k_BKD.shape)}")
    if (new.q_norm_D is None) != (new.k_norm_D is None):
        raise ValueError("fused_decode_attention: give both q and k norm weights or neither")
    return _launch(q_BHD, k_BKLD, v_BKLE, allowed_BL, last_slot_1, scaling, launch, new)


def _launch(q_BHD: Tensor, k_BKLD: Tensor, v_BKLE: Tensor, allowed_BL: Tensor, last_slot_1: Tensor,
            scaling: float, launch: AttentionLaunch | None, new: NewToken | None) -> Tensor:
    B, Hq, D = q_BHD.shape
    K, L, E = k_BKLD.shape[1], k_BKLD.shape[2], v_BKLE.shape[-1]
    if Hq % K or k_BKLD.stride(-1) != 1 or v_BKLE.stride(-1) != 1 or q_BHD.stride(-1) != 1:
        raise ValueError("decode_attention needs Hq divisible by K and unit-stride head dimensions")
    G = Hq // K
    G_BLOCK, D_BLOCK, E_BLOCK = next_pow2(G, 16), next_pow2(D, 16), next_pow2(E, 16)
    dev = q_BHD.device
    out = torch.empty(B, Hq, E, dtype=q_BHD.dtype, device=dev)
    allowed = allowed_BL.view(torch.uint8) if allowed_BL.dtype == torch.bool else allowed_BL
    if new is None:  # the fused form's arguments unused: any tensor, zero strides
        fused = (q_BHD,) * 7 + (0.0, L) + (0,) * 6
    else:
        if new.k_BKD.stride(-1) != 1 or new.v_BKE.stride(-1) != 1 or new.cos_BD.stride(-1) != 1:
            raise ValueError("fused_decode_attention needs unit-stride head dimensions")
        cos_BD, sin_BD = new.cos_BD.reshape(-1, D), new.sin_BD.reshape(-1, D)  # (B, 1, D) as the model gives them
        qw, kw = (new.q_norm_D, new.k_norm_D) if new.q_norm_D is not None else (q_BHD, q_BHD)
        fused = (new.k_BKD, new.v_BKE, cos_BD, sin_BD, new.pos_B, qw, kw, float(new.eps), L,
                 new.k_BKD.stride(0), new.k_BKD.stride(1), new.v_BKE.stride(0), new.v_BKE.stride(1),
                 cos_BD.stride(0) if cos_BD.shape[0] > 1 else 0, new.pos_B.stride(0) if new.pos_B.numel() > 1 else 0)

    def run(launch: AttentionLaunch) -> None:
        S = splits_for(B * K, L, launch)
        m = empty(B * K * S * G_BLOCK, dtype=torch.float32, device=dev)
        l_ = empty(B * K * S * G_BLOCK, dtype=torch.float32, device=dev)
        acc = empty(B * K * S * G_BLOCK, E_BLOCK, dtype=torch.float32, device=dev)
        _decode_attention.on(dev)[(B * K, S)](
            q_BHD, k_BKLD, v_BKLE, allowed, last_slot_1, m, l_, acc, arrival_counters(B * K, dev), out,
            float(scaling), K, G, D, E, S,
            q_BHD.stride(0), q_BHD.stride(1), k_BKLD.stride(0), k_BKLD.stride(1), k_BKLD.stride(2),
            v_BKLE.stride(0), v_BKLE.stride(1), v_BKLE.stride(2), allowed.stride(0), out.stride(0), out.stride(1),
            *fused,
            G_BLOCK=G_BLOCK, D_BLOCK=D_BLOCK, E_BLOCK=E_BLOCK, BLOCK_N=launch.block_n, ONE_SHARE=S == 1,
            NEW=new is not None, QK_NORM=new is not None and new.q_norm_D is not None,
            num_warps=launch.num_warps,
        )  # fmt: skip

    launch = launch or attention_launch(G, D, dev, B)
    key = (dev, launch, G_BLOCK, D_BLOCK, E_BLOCK, q_BHD.dtype, k_BKLD.dtype, new is not None,
           new is not None and new.q_norm_D is not None)
    fit_shared_memory(run, launch, smaller_launch, _FITTED, key)
    return out


def decode_attention_reference(q_BHD: Tensor, k_BKLD: Tensor, v_BKLE: Tensor, allowed_BL: Tensor, last_slot: int,
                               scaling: float) -> Tensor:
    """Per query head over K/V repeated for its group, float32; rows with no allowed slot: 0."""
    n_slots = last_slot + 1
    G = q_BHD.shape[1] // k_BKLD.shape[1]
    k_BHLD = k_BKLD[:, :, :n_slots].float().repeat_interleave(G, 1)
    v_BHLE = v_BKLE[:, :, :n_slots].float().repeat_interleave(G, 1)
    s_BHL = torch.einsum("bhd,bhld->bhl", q_BHD.float(), k_BHLD) * scaling
    s_BHL = s_BHL.masked_fill(~allowed_BL[:, None, :n_slots], float("-inf"))
    p_BHL = torch.nan_to_num(s_BHL.softmax(-1), nan=0.0)
    return torch.einsum("bhl,bhle->bhe", p_BHL, v_BHLE).to(q_BHD.dtype)


def rms_norm_reference(x: Tensor, weight_D: Tensor, eps: float) -> Tensor:
    """transformers' RMSNorm (Qwen3's q/k norm): the mean of squares in float32, the normalised
    value rounded to x's dtype, then times the weight."""
    xf = x.float()
    return weight_D * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotary_reference(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x * cos + rotate_half(x) * sin (transformers' apply_rotary_pos_emb, one tensor)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def fused_decode_attention_reference(q_BHD: Tensor, new: NewToken, k_BKLD: Tensor, v_BKLE: Tensor,
                                     allowed_BL: Tensor, last_slot: int, scaling: float) -> Tensor:
    """The fused form op by op as transformers and the engine run it: q/k norm, rotary, the write
    of k/v at each row's slot (into the caches given), then decode_attention_reference."""
    q, k = q_BHD, new.k_BKD
    if new.q_norm_D is not None:
        q, k = rms_norm_reference(q, new.q_norm_D, new.eps), rms_norm_reference(k, new.k_norm_D, new.eps)
    cos_B1D, sin_B1D = new.cos_BD.reshape(-1, 1, q.shape[-1]), new.sin_BD.reshape(-1, 1, q.shape[-1])
    q, k = rotary_reference(q, cos_B1D, sin_B1D), rotary_reference(k, cos_B1D, sin_B1D)
    B = q.shape[0]
    rows_B = torch.arange(B, device=q.device)
    pos_B = new.pos_B.reshape(-1).expand(B) if new.pos_B.numel() == 1 else new.pos_B.reshape(-1)
    inside_B = (pos_B >= 0) & (pos_B < k_BKLD.shape[2])  # a slot outside the cache: nothing written
    rows_B, pos_B = rows_B[inside_B], pos_B[inside_B]
    k_BKLD[rows_B, :, pos_B] = k[inside_B].to(k_BKLD.dtype)
    v_BKLE[rows_B, :, pos_B] = new.v_BKE[inside_B].to(v_BKLE.dtype)
    return decode_attention_reference(q, k_BKLD, v_BKLE, allowed_BL, last_slot, scaling)
