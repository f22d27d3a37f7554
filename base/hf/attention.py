"""The decode engine's KV cache and attention: static per-layer buffers, grouped-query decoding
without copying K/V per query head.

    kv = StaticKV(max_len, device)
    with kv.active(model):                   # the model's attention runs engine_attention
        model(input_ids=..., attention_mask=allowed_B1QL, position_ids=..., use_cache=False)

Why not a transformers `Cache`: its `update(k, v, layer_idx)` makes the layer index a Python
constant of every attention call, so `torch.compile` of the repeated decoder block recompiles once
per layer (a guard on `layer_idx`) and, past the recompile limit, runs the rest eagerly. Here the
model runs without a cache object; each attention module holds its own K/V buffers (registered
buffers, so a compiled attention forward sees them as inputs, not constants) and the attention
function writes the new keys and values at `write_pos` itself. One compiled graph then serves
every layer.

Why not sdpa: with a mask (left padding, empty cache slots), transformers' sdpa path repeats K/V
for each query head of a group (`repeat_kv`, older versions) or falls back to the math kernel;
either reads and writes Hq/Hkv times the cache per layer, the part of a decode step that grew with
batch size. For one query token on a GPU, kernels/attention.py reads each KV head's filled slots
once for its G query heads, attention sinks included (one launch, registered as a custom op so
the compiled region calls it as is); elsewhere the G query heads of a KV head are stacked as G
rows of one matmul against that head's cache (`grouped_decode_attention`).

Supports grouped and multi-head attention, key and value head sizes that differ (DeepSeek's MLA),
sliding windows (cache slots older than the window are masked) and attention sinks (GPT-OSS's
`s_aux`). Prefill (more than one query token) uses sdpa over the repeated cache: it runs once.

Continuous batching (base/runtime/continuous.py) writes per row: a decode step's write position
is then one slot per row, `write_pos` of shape (B, 1), written for K and V at once by the custom op
`base_moe::write_kv_rows` (kernels/kv_write.py on a GPU), and an arrivals' prefill writes only their
rows (`set_write_rows`), attending over those rows alone. A packed forward (`set_packed`: one
stream of T tokens, batch 1, each token with its cache row, its slot and the last slot it attends
to) writes every token's K/V at (row, slot) and attends each token to its own row up to that slot
(kernels/varlen_attention.py): the prompts of an admission round without padding, and a mixed
step's prompt chunks beside one token of every decoding row.

Shapes: B batch, Hq query heads, K key/value heads, G = Hq/K, Q query tokens, L cache slots,
D key head size, E value head size.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

NAME = "base_engine"


@torch.library.custom_op("base_moe::decode_attention", mutates_args=())
def _decode_attention_op(q_BHD: Tensor, k_BKLD: Tensor, v_BKLE: Tensor, allowed_BL: Tensor, last_1: Tensor,
                         scaling: float, sinks_H: Tensor | None = None) -> Tensor:
    """kernels/attention.py's decode attention; `sinks_H`: GPT-OSS's attention sinks (`s_aux`)."""
    from kernels.attention import decode_attention

    return decode_attention(q_BHD, k_BKLD, v_BKLE, allowed_BL, last_1, scaling, sinks_H=sinks_H)


@_decode_attention_op.register_fake
def _(q_BHD, k_BKLD, v_BKLE, allowed_BL, last_1, scaling, sinks_H=None):
    return q_BHD.new_empty(q_BHD.shape[0], q_BHD.shape[1], v_BKLE.shape[-1])


def kernel_decode(query_BHQD: Tensor) -> bool:
    """Whether a one-token step attends through kernels/attention.py: on a GPU (a CPU test
    replaces this to run the kernel through Triton's interpreter)."""
    return query_BHQD.is_cuda


@torch.library.custom_op("base_moe::write_kv_rows", mutates_args=("k_cache_BKLD", "v_cache_BKLE"))
def _write_kv_rows_op(k_cache_BKLD: Tensor, v_cache_BKLE: Tensor, k_BKD: Tensor, v_BKE: Tensor, slot_B: Tensor) -> None:
    """Continuous batching's decode write: row b's K/V heads at its own slot slot_B[b], both caches
    in one launch on a GPU (kernels/kv_write.py). An op that declares the caches mutated, so a
    compiled region keeps the write in place and unbroken (a per-row scatter_ or index_copy_ there
    became a copy of the whole cache; run eagerly, a graph break through the layer's attention)."""
    from kernels.kv_write import write_kv_rows, write_kv_rows_reference

    write = write_kv_rows if k_cache_BKLD.is_cuda else write_kv_rows_reference
    write(k_cache_BKLD, v_cache_BKLE, k_BKD, v_BKE, slot_B)


@_write_kv_rows_op.register_fake
def _(k_cache_BKLD, v_cache_BKLE, k_BKD, v_BKE, slot_B):
    return None


_ACTIVE: list[StaticKV] = []  # the cache of the engine whose forward is running (for allocation)


class StaticKV:
    """Per-attention-module K/V buffers of fixed shape (B, K, L, D|E), written at `write_pos`.

    Buffers are allocated by the first (prefill) forward, outside any CUDA graph, and keep their
    addresses; `write_pos` holds the cache slots the current forward writes: (Q,) shared by every
    row, or (B, 1) one per row. `batch` fixes B when the first forward has fewer rows."""

    def __init__(self, max_len: int, device: torch.device, batch: int | None = None) -> None:
        self.max_len, self.batch = max_len, batch
        self.write_pos = torch.zeros(1, dtype=torch.long, device=device)
        self.write_rows: Tensor | None = None  # an arrivals' prefill: the rows it writes
        self.packed: tuple[Tensor, Tensor, Tensor] | None = None  # a packed forward: (row_T, slot_T, last_T)
        self.modules: list[nn.Module] = []  # attention modules holding this cache's buffers
        self.host_len = 0  # tokens written, as the host knows it (graph replays do not update it)
        self._mirrors: dict[torch.device, Tensor] = {}  # write_pos on the other GPUs of a spread model
        # a per-row write position's largest slot, per device: the last slot decode attention
        # reads (refreshed once per step, instead of a reduction in every layer)
        self._last: dict[torch.device, Tensor] = {}

    def allocate(self, module: nn.Module, key_BKQD: Tensor, value_BKQE: Tensor) -> None:
        """Buffers on the module's own device (each layer of a model spread over GPUs keeps its
        cache beside its weights)."""
        B, K, _, D = key_BKQD.shape
        B = self.batch or B
        module.register_buffer("base_k_cache", key_BKQD.new_zeros(B, K, self.max_len, D), persistent=False)
        module.register_buffer("base_v_cache", value_BKQE.new_zeros(B, K, self.max_len, value_BKQE.shape[-1]),
                               persistent=False)
        module.register_buffer("base_write_pos", self._pos_on(key_BKQD.device), persistent=False)
        module.base_last_slot = self._last_slot(key_BKQD.device)
        module.base_write_rows = None if self.write_rows is None else self.write_rows.to(key_BKQD.device)
        module.base_packed = _on(self.packed, key_BKQD.device)
        self.modules.append(module)

    def _last_slot(self, device: torch.device) -> Tensor:
        device = torch.device(device)
        if device not in self._last:
            self._last[device] = torch.zeros(1, dtype=torch.long, device=device)
            self._refresh_last()
        return self._last[device]

    def _refresh_last(self, active_B: Tensor | None = None) -> None:
        """The largest slot of a per-row write_pos (B, 1), over the active rows when given (a row
        that has ended keeps its last slot until its next admission, and a row between prompt
        chunks writes the spare slot past the cache: neither decides how far every row's attention
        reads); nothing for a shared (Q,) position."""
        if self.write_pos.dim() != 2 or not self._last:
            return
        pos_B = self.write_pos.view(-1)
        if active_B is not None:
            pos_B = torch.where(active_B, pos_B, 0)
        home = self._last.get(self.write_pos.device)
        last_1 = torch.amax(pos_B, dim=0, keepdim=True, out=home)
        for out_1 in self._last.values():
            if out_1 is not last_1:
                out_1.copy_(last_1)  # the other devices of a spread model

    def _pos_on(self, device: torch.device) -> Tensor:
        if device == self.write_pos.device:
            return self.write_pos
        if device not in self._mirrors:
            self._mirrors[device] = self.write_pos.to(device)
        return self._mirrors[device]

    def set_write_pos(self, pos_Q: Tensor) -> None:
        """The slots the next forward writes; every module on one device sees the same tensor."""
        self.write_pos = pos_Q
        self._mirrors = {}
        for m in self.modules:
            m.base_write_pos = self._pos_on(m.base_k_cache.device)  # a registered buffer: replaced, not copied into
        self._refresh_last()

    def set_write_rows(self, rows_n: Tensor | None) -> None:
        """The rows the next forward writes (an arrivals' prefill), or None: every row."""
        self.write_rows = rows_n
        for m in self.modules:
            m.base_write_rows = None if rows_n is None else rows_n.to(m.base_k_cache.device)

    def set_packed(self, packed: tuple[Tensor, Tensor, Tensor] | None) -> None:
        """The next forward is a packed stream (batch 1, T tokens): token t writes its K/V at
        (row_T[t], slot_T[t]) and attends row_T[t]'s slots up to last_T[t] (-1: none); None: not
        packed. Rows are filled from slot 0 without holes, so no validity mask is needed."""
        self.packed = packed
        for m in self.modules:
            m.base_packed = _on(packed, m.base_k_cache.device)

    def sync(self, active_B: Tensor | None = None) -> None:
        """After write_pos changed in place (a decode step's position += 1): the other devices'
        copies follow, and a per-row position's largest slot is recomputed, over the rows
        `active_B` marks when given (once per step, where each layer's decode attention would
        otherwise compute it: the continuous engine calls this first in every decode step)."""
        for pos in self._mirrors.values():
            pos.copy_(self.write_pos)
        self._refresh_last(active_B)

    def zero_(self) -> None:
        for m in self.modules:
            m.base_k_cache.zero_()
            m.base_v_cache.zero_()

    def owns(self, model: nn.Module) -> bool:
        return model.__dict__.get("_base_kv_owner") is self

    def claim(self, model: nn.Module) -> None:
        """Make this the model's cache: buffers another engine left on its modules are dropped
        (that engine allocates again at its next prefill)."""
        for m in model.modules():
            _drop_buffers(m)
        self.modules, self._mirrors, self._last = [], {}, {}
        model.__dict__["_base_kv_owner"] = self

    def release(self, model: nn.Module | None = None) -> None:
        """Drop every module's buffers (another batch size or a later run allocates its own)."""
        for m in self.modules:
            _drop_buffers(m)
        self.modules, self._mirrors, self._last = [], {}, {}
        if model is not None and self.owns(model):
            del model.__dict__["_base_kv_owner"]

    @contextmanager
    def active(self, model: nn.Module) -> Iterator[None]:
        """Run the model's attention through engine_attention with this cache."""
        register()
        config = model.config
        before = config._attn_implementation
        config._attn_implementation = NAME
        _ACTIVE.append(self)
        try:
            yield
        finally:
            _ACTIVE.pop()
            config._attn_implementation = before


def _on(packed: tuple[Tensor, ...] | None, device: torch.device) -> tuple[Tensor, ...] | None:
    return None if packed is None else tuple(x.to(device) for x in packed)  # no-op on the cache's device


def _drop_buffers(module: nn.Module) -> None:
    for name in ("base_k_cache", "base_v_cache", "base_write_pos"):
        module._buffers.pop(name, None)
    module.__dict__.pop("base_write_rows", None)
    module.__dict__.pop("base_packed", None)
    module.__dict__.pop("base_last_slot", None)


def _flat_slots(row_T: Tensor, slot_T: Tensor, K: int, L: int) -> Tensor:
    """(T*K,) rows of a (B, K, L, D) cache viewed as (B*K*L, D): token t's K heads at row_T[t],
    slot slot_T[t], token-major (the order of a (T, K, D) tensor's rows)."""
    k_K = torch.arange(K, device=row_T.device)
    return ((row_T[:, None] * K + k_K[None, :]) * L + slot_T[:, None]).reshape(-1)


def _index_write(cache_BKLD: Tensor, flat_N: Tensor, new_TKD: Tensor) -> None:
    """new_TKD's (token, head) rows into the flattened cache at flat_N: one index_copy_, no host
    sync (repeated targets, the padding's spare slot, take any one)."""
    B, K, L, D = cache_BKLD.shape
    cache_BKLD.view(B * K * L, D).index_copy_(0, flat_N, new_TKD.reshape(-1, D))


def _write_packed(cache_BKLD: Tensor, new_1KTD: Tensor, row_T: Tensor, slot_T: Tensor) -> None:
    """Token t's K (or V) heads into cache[row_T[t], :, slot_T[t]]."""
    _, K, L, _ = cache_BKLD.shape
    _index_write(cache_BKLD, _flat_slots(row_T, slot_T, K, L), new_1KTD[0].transpose(0, 1))


@torch.library.custom_op("base_moe::write_packed_kv", mutates_args=("k_cache_BKLD", "v_cache_BKLE"))
def _write_packed_kv_op(k_cache_BKLD: Tensor, v_cache_BKLE: Tensor, key_1KTD: Tensor, value_1KTE: Tensor,
                        row_T: Tensor, slot_T: Tensor) -> None:
    """A packed forward's K/V, token t's heads at (row_T[t], slot_T[t]) of both caches: an op that
    declares the caches mutated, so a compiled region (the continuous engine's packed prefill) keeps the write in
    place (an index_copy_ into a view of the cache compiled out of place on an H200: a copy of the
    whole cache per layer, results/serve/README.md)."""
    _write_packed(k_cache_BKLD, key_1KTD, row_T, slot_T)
    _write_packed(v_cache_BKLE, value_1KTE, row_T, slot_T)


@_write_packed_kv_op.register_fake
def _(k_cache_BKLD, v_cache_BKLE, key_1KTD, value_1KTE, row_T, slot_T):
    return None


@torch.library.custom_op("base_moe::varlen_attention", mutates_args=())
def _varlen_attention_op(q_THD: Tensor, k_BKLD: Tensor, v_BKLE: Tensor, row_T: Tensor, last_T: Tensor,
                         scaling: float, window: int, sinks_H: Tensor | None) -> Tensor:
    """kernels/varlen_attention.py on a GPU, its PyTorch reference elsewhere; one opaque call for
    a compiled region."""
    from kernels.varlen_attention import varlen_attention, varlen_attention_reference

    attend = varlen_attention if q_THD.is_cuda else varlen_attention_reference
    return attend(q_THD, k_BKLD, v_BKLE, row_T, last_T, scaling, window, sinks_H)


@_varlen_attention_op.register_fake
def _(q_THD, k_BKLD, v_BKLE, row_T, last_T, scaling, window, sinks_H):
    return q_THD.new_empty(q_THD.shape[0], q_THD.shape[1], v_BKLE.shape[-1])


def packed_attention(module: nn.Module, query_1HTD: Tensor, key_1KTD: Tensor, value_1KTE: Tensor, scaling: float,
                     sliding_window: int | None, sinks_H: Tensor | None) -> Tensor:
    """A packed forward's attention (StaticKV.set_packed): write each token's K/V at its (row,
    slot), then attend it to its row up to its last slot; returns (1, T, Hq, E)."""
    row_T, slot_T, last_T = module.base_packed
    _write_packed_kv_op(module.base_k_cache, module.base_v_cache, key_1KTD, value_1KTE, row_T, slot_T)
    out_THE = _varlen_attention_op(query_1HTD[0].transpose(0, 1), module.base_k_cache, module.base_v_cache, row_T,
                                   last_T, scaling, sliding_window or 0, sinks_H)
    return out_THE[None]


def _allowed(mask_B1QL: Tensor, pos: Tensor, sliding_window: int | None) -> Tensor:
    """The mask, with slots older than a sliding window dropped (pos: (Q,) shared or (B, 1) per row)."""
    if mask_B1QL.dtype != torch.bool:
        raise TypeError("engine_attention takes the engine's boolean 4D mask")
    if not sliding_window:
        return mask_B1QL
    slot_L = torch.arange(mask_B1QL.shape[-1], device=mask_B1QL.device)
    if pos.dim() == 2:  # one position per row
        return mask_B1QL & (slot_L[None, :] > pos - sliding_window)[:, None, None, :]
    return mask_B1QL & (slot_L[None, :] > pos[:, None] - sliding_window)  # as transformers' sliding mask


def _write(cache_BKLD: Tensor, new_BKQD: Tensor, pos: Tensor, rows_n: Tensor | None) -> Tensor:
    """Write the forward's keys or values at the slots pos (Q,) shared by every row, or by the
    rows rows_n only (an arrivals' prefill); returns the cache rows it attends over. (A slot per
    row, pos (B, 1), is `_write_kv_rows_op`'s.)"""
    if rows_n is not None:  # an arrivals' prefill: their rows only, slots pos (Q,)
        cache_BKLD.transpose(1, 2)[rows_n[:, None], pos[None, :]] = new_BKQD.transpose(1, 2)
        return cache_BKLD[rows_n]
    cache_BKLD.index_copy_(2, pos, new_BKQD)
    return cache_BKLD


def last_read(module: nn.Module) -> Tensor:
    """The last cache slot a decode step's attention reads: with a write slot per row, their largest
    (StaticKV keeps it, over the rows still decoding); else the one slot every row writes."""
    pos = module.base_write_pos
    return module.base_last_slot if pos.dim() == 2 else pos


def grouped_decode_attention(query_BHQD: Tensor, k_BKLD: Tensor, v_BKLE: Tensor, allowed_B1QL: Tensor,
                             scaling: float, sinks_H: Tensor | None = None) -> Tensor:
    """softmax(q k^T * scaling, masked) v with the G query heads of a KV head as rows of one matmul;
    returns (B, Q, Hq, E). Reads each cache once; scores in float32."""
    B, Hq, Q, D = query_BHQD.shape
    K, L, E = k_BKLD.shape[1], k_BKLD.shape[2], v_BKLE.shape[-1]
    G = Hq // K
    q_BKRD = query_BHQD.reshape(B, K, G * Q, D)  # R = G*Q rows: head-major, then query token
    s_BKGQL = (q_BKRD @ k_BKLD.transpose(-1, -2)).view(B, K, G, Q, L).float() * scaling
    s_BKGQL = s_BKGQL.masked_fill(~allowed_B1QL[:, :, None], float("-inf"))
    if sinks_H is not None:  # a per-head logit that takes probability mass and contributes no value
        sink_BKGQ1 = sinks_H.float().view(1, K, G, 1, 1).expand(B, K, G, Q, 1)
        p_BKGQL = torch.cat([s_BKGQL, sink_BKGQ1], -1).softmax(-1)[..., :L]
    else:
        p_BKGQL = s_BKGQL.softmax(-1)
    o_BKRE = p_BKGQL.to(v_BKLE.dtype).view(B, K, G * Q, L) @ v_BKLE
    return o_BKRE.view(B, Hq, Q, E).transpose(1, 2)


def engine_attention(module: nn.Module, query_BHQD: Tensor, key_BKQD: Tensor, value_BKQE: Tensor,
                     attention_mask: Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     sliding_window: int | None = None, s_aux: Tensor | None = None,
                     **kwargs) -> tuple[Tensor, None]:
    """A transformers attention function (AttentionInterface) over the module's static cache."""
    if kwargs.get("softcap") is not None:
        raise NotImplementedError("engine_attention: logit soft-capping is not supported")
    if not hasattr(module, "base_k_cache"):
        if not _ACTIVE:
            raise RuntimeError("engine_attention runs only inside StaticKV.active(model)")
        _ACTIVE[-1].allocate(module, key_BKQD, value_BKQE)
    scaling = query_BHQD.shape[-1] ** -0.5 if scaling is None else scaling
    if getattr(module, "base_packed", None) is not None:
        return packed_attention(module, query_BHQD, key_BKQD, value_BKQE, scaling, sliding_window, s_aux), None
    pos = module.base_write_pos
    rows_n = getattr(module, "base_write_rows", None)
    if pos.dim() == 2 and rows_n is None:  # one slot per row (continuous batching's decode step)
        _write_kv_rows_op(module.base_k_cache, module.base_v_cache, key_BKQD[:, :, 0], value_BKQE[:, :, 0], pos[:, 0])
        k_BKLD, v_BKLE = module.base_k_cache, module.base_v_cache
    else:
        k_BKLD = _write(module.base_k_cache, key_BKQD, pos, rows_n)
        v_BKLE = _write(module.base_v_cache, value_BKQE, pos, rows_n)
    allowed_B1QL = _allowed(attention_mask, pos, sliding_window)
    Q = query_BHQD.shape[2]
    if Q == 1 and kernel_decode(query_BHQD):
        out_BHE = _decode_attention_op(query_BHQD[:, :, 0], k_BKLD, v_BKLE, allowed_B1QL[:, 0, 0], last_read(module),
                                       scaling, s_aux)
        return out_BHE[:, None], None
    if Q == 1 or s_aux is not None:
        return grouped_decode_attention(query_BHQD, k_BKLD, v_BKLE, allowed_B1QL, scaling, s_aux), None
    G = query_BHQD.shape[1] // k_BKLD.shape[1]  # prefill: once per prompt, sdpa over repeated K/V
    out_BHQE = F.scaled_dot_product_attention(query_BHQD, k_BKLD.repeat_interleave(G, 1),
                                              v_BKLE.repeat_interleave(G, 1), attn_mask=allowed_B1QL,
                                              scale=scaling)
    return out_BHQE.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register engine_attention with transformers (idempotent); 4D masks pass through as given."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, engine_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
