"""The token stream of a packed forward: prompt chunks laid end to end, padded to a bucket.

    packed = pack([Chunk(slot=3, ids=[...], start=0, final=True, max_new=24), ...],
                  buckets=(64, 128, 256), slots=16, trash=640, pad_id=0)
    packed.bucket, packed.stream_4C, packed.rows_5B           # what the engine copies to the device

A chunk is a run of one request's prompt tokens: the whole prompt, or a piece of it when a prompt
is prefilled over several forwards (a long prompt, or chunked prefill riding in mixed steps).
Its tokens go into its slot's cache row at slots start, start+1, ... (a packed row has no left
padding: the slot is the position). The stream is padded up to the smallest bucket that holds
it, so one CUDA graph per bucket serves every forward (base/runtime/continuous.py); padding
tokens write their K/V into the cache's spare `trash` slot, which nothing reads, and attend to
nothing.

    stream_4C  long (4, C): token id, cache row, write slot, last slot attended (= the write slot;
               padding: pad_id, 0, trash, -1)
    rows_5B    long (5, B) per engine row: prompt length when its final chunk is in this forward
               (else 0), the stream index of that chunk's last token, the request's new-token
               limit, 1 when the row has a chunk here at all, and the request's stop strings as
               a bit mask of the engine's StopTable (base/runtime/stops.py; 0: none)

Shapes: C bucket (stream tokens), B slots.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

NO_LIMIT = 1 << 40  # a request with no new-token limit of its own


@dataclass(frozen=True)
class Chunk:
    slot: int  # the engine row the request decodes in
    ids: list[int]  # this chunk's prompt tokens
    start: int  # cache slot (and position) of its first token
    final: bool  # the prompt ends here: the forward samples the request's first new token
    max_new: int = NO_LIMIT  # the request's new-token limit (its first token counts)
    stops: int = 0  # the request's stop strings (a StopTable mask), read with its final chunk


@dataclass
class Packed:
    bucket: int  # C: stream length after padding
    tokens: int  # real prompt tokens
    stream_4C: Tensor
    rows_5B: Tensor


def bucket_for(tokens: int, buckets: tuple[int, ...] | list[int]) -> int:
    """The smallest bucket that holds `tokens`."""
    for b in buckets:
        if tokens <= b:
            return b
    raise ValueError(f"a packed forward of {tokens} tokens exceeds the largest bucket ({buckets[-1]})")


def pack(chunks: list[Chunk], buckets: tuple[int, ...] | list[int], slots: int, trash: int, pad_id: int,
         pin: bool = False, bucket: int | None = None) -> Packed:
    """The stream of `chunks` (see the module doc), in `bucket` tokens (default: the smallest that
    holds them); `pin`: in page-locked memory, for an asynchronous copy to the GPU."""
    if len({c.slot for c in chunks}) != len(chunks):
        raise ValueError("one chunk per slot and forward")
    n = sum(len(c.ids) for c in chunks)
    C = bucket or bucket_for(max(n, 1), buckets)
    if n > C:
        raise ValueError(f"{n} tokens do not fit a bucket of {C}")
    stream = torch.empty(4, C, dtype=torch.long)
    stream[0], stream[1], stream[2], stream[3] = pad_id, 0, trash, -1
    rows = torch.zeros(5, slots, dtype=torch.long)
    at = 0
    for c in chunks:
        if not c.ids or c.start + len(c.ids) > trash:
            raise ValueError(f"chunk of {len(c.ids)} tokens at slot {c.start}: empty, or past the cache's "
                             f"{trash} slots")
        span = slice(at, at + len(c.ids))
        stream[0, span] = torch.tensor(c.ids, dtype=torch.long)
        stream[1, span] = c.slot
        stream[2, span] = torch.arange(c.start, c.start + len(c.ids))
        stream[3, span] = stream[2, span]
        at += len(c.ids)
        rows[3, c.slot] = 1
        if c.final:
            rows[0, c.slot] = c.start + len(c.ids)
            rows[1, c.slot] = at - 1
            rows[2, c.slot] = c.max_new
            rows[4, c.slot] = c.stops
    if pin:
        stream, rows = stream.pin_memory(), rows.pin_memory()
    return Packed(C, n, stream, rows)
