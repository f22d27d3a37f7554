"""Continuous batching: a fixed number of slots; a finished request's slot takes the next one.

    engine = ContinuousEngine(model, slots=16, max_len=640, budget=budget, eos_ids=(2,), pad_id=0)
    engine.reset(reserve=4096)                        # every slot empty; statistics rows for 4096 forwards
    engine.run_packed([Chunk(3, ids, 0, True, 24), Chunk(7, ids2, 0, True, 9)], mixed=False)  # prefill 2 arrivals
    engine.step()                                     # one decode step of every occupied slot
    engine.run_packed([Chunk(5, ids3[:64], 0, False)], mixed=True)  # a prompt chunk + a decode step
    toks = engine.snapshot()                          # every slot's newest token, copied asynchronously
    toks.get()                                        # ... on the host (waits for that copy only)
    engine.end(3)                                     # slot 3's request is over: inactive from the next step
    engine.graphs.captures                            # CUDA graphs captured so far

Each slot is a row of the KV cache (base/hf/attention.py) with its own write slot, position and
mask, so a request admitted mid-way decodes exactly as it would alone. Three kinds of forward,
each a fixed-shape step on static buffers, one CUDA graph per shape (base/runtime/graphs.py;
eager on a CPU, the same code):

- decode step: one token of every slot at its own write slot. A slot that holds no request, or
  whose request ended, is inactive: it neither scores nor joins the union, and what it computes
  is discarded. Key ("decode",).
- packed prefill: the prompts (or prompt chunks) of arrivals laid end to end in one token stream
  (base/runtime/packing.py), no padding between them, padded at the end to a token bucket; each
  token writes its K/V straight into its slot's row and attends that row causally
  (kernels/varlen_attention.py). The expert FFN runs on the path its token count calls for
  (base/hf/experts_impl.py). A request whose final chunk is in the stream gets its first new
  token. Dense, as the static engine's prefill (unless method.apply_to=all). Key ("prefill", C).
- mixed step: the decode step's B tokens and a prompt chunk stream in one packed forward (chunked
  prefill). The chunk touches nearly every expert, so every expert's weights stream anyway: the
  budget does not bind here, every token (the decoding rows' too) runs its own routing, and the
  statistics row is marked `mixed`. Key ("mixed", C).

The decoding rows' token limits, EOS and stop strings are checked on the device inside the step
(`left_B`, `finished_B`; stop strings through the engine's StopTable, base/runtime/stops.py, each
row with its own strings as a bit mask): a row ends in the step that produced its last token,
with no host sync, so it never takes part in a later step's selection. The host reads tokens and
which rows ended through `snapshot()` (an asynchronous copy to page-locked memory) when it likes,
so a scheduler can read step i while step i+1 runs (base/runtime/scheduler.py). Nothing a step
reads is copied from the host except a packed forward's stream, copied asynchronously from
page-locked memory into static buffers before the forward.

Cache slot L (one past max_len) is spare: stream padding and inactive rows of a mixed step write
there and nothing reads it. A row whose prompt is partly prefilled must not see a decode-only
step (the scheduler runs mixed steps until its prompt is in); its write slot points at the spare
slot meanwhile, so such a step would only cost time.

`admit` is the earlier path (left-padded to the longest prompt of the arrivals, eager): the
reference the packed prefill is tested against, and `scheduler.packing=padded`.

Shapes: B slots, n arrivals, P their prompt length, L cache slots per row (max_len), C stream
bucket, T tokens of a packed forward (C, or B + C in a mixed step), V vocabulary.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import Tensor

from base.config import DEFAULT_BUCKETS
from base.hf.attention import StaticKV
from base.hf.moe_block import StepInputs
from base.runtime.engine import DecodeEngine
from base.runtime.graphs import CaptureError, StepGraphs, eager_capture
from base.runtime.packing import NO_LIMIT, Chunk, Packed, pack
from base.runtime.stops import StopTable


class HostTokens:
    """Every slot's newest token and whether its row has ended, on their way to the host: an
    asynchronous copy of (2, B) into one buffer of the engine's ring of page-locked buffers (a
    GPU), or a clone (a CPU).

    Why a ring: a fresh page-locked buffer per step goes through the host allocator (cudaHostAlloc
    when its cache is empty) on the host's critical path. A buffer is reused `TokenRing.SIZE`
    snapshots later; `get()` raises if it was reused before it was read (the scheduler reads each
    snapshot one or two steps after it)."""

    def __init__(self, tok_2B: Tensor, ring: TokenRing | None = None) -> None:
        self.event, self.ring = None, ring
        if tok_2B.is_cuda and ring is not None:
            self.host_2B, self.generation = ring.next()
            self.host_2B.copy_(tok_2B, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host_2B = tok_2B.clone()

    def get(self) -> tuple[list[int], list[bool]]:
        """The tokens and the rows ended on the device; waits for this copy (and the forwards
        before it) only."""
        if self.event is not None:
            self.event.synchronize()
            if not self.ring.holds(self.generation):
                raise RuntimeError(f"a token snapshot was read after {TokenRing.SIZE} later snapshots reused its buffer")
        tok, ended = self.host_2B.tolist()
        return tok, [bool(e) for e in ended]


class TokenRing:
    """SIZE page-locked (2, B) buffers, handed out in turn, each with a generation count."""

    SIZE = 8

    def __init__(self, B: int, dtype: torch.dtype, pin: bool = True) -> None:
        self.bufs = [torch.empty(2, B, dtype=dtype, pin_memory=pin) for _ in range(self.SIZE)]
        self.taken = 0  # buffers handed out so far

    def next(self) -> tuple[Tensor, int]:
        buf = self.bufs[self.taken % self.SIZE]
        self.taken += 1
        return buf, self.taken

    def holds(self, generation: int) -> bool:
        """Whether the buffer handed out as `generation` was not handed out again since."""
        return self.taken - generation < self.SIZE


class ContinuousEngine(DecodeEngine):
    """The decode engine with per-slot admission, packed prefill and mixed steps (see the module doc).
    `buckets`: the packed stream lengths (one graph each). Where the engine compiles its decode step's
    regions (a GPU with throughput.compile), packed forwards run through them too (base/runtime/regional.py;
    one compile per bucket and kind, in the warm-up, or at a bucket's first use without one). `stops`: the stop strings
    of the requests to come (base/runtime/stops.py; a request names its own by a bit mask), matched
    in the step; None: no stop strings on the device."""

    def __init__(self, *args, buckets: tuple[int, ...] | list[int] = DEFAULT_BUCKETS,
                 stops: StopTable | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stops = stops
        B, L, dev = self.B, self.L, self.device
        self.trash = L  # the spare cache slot (see the module doc)
        self.cache = StaticKV(L + 1, dev, batch=B)  # B rows even when fewer arrive first
        self.valid_BL = torch.zeros(B, L + 1, dtype=torch.bool, device=dev)
        self.slot_B1 = torch.zeros(B, 1, dtype=torch.long, device=dev)  # each row's next write slot
        self.left_B = torch.full((B,), NO_LIMIT, dtype=torch.long, device=dev)  # new tokens a row may still make
        self.buckets = tuple(sorted(buckets))
        self.stream_4C = torch.zeros(4, self.buckets[-1], dtype=torch.long, device=dev)  # packing.py's stream
        self.rows_5B = torch.zeros(5, B, dtype=torch.long, device=dev)  # packing.py's per-row fields
        self.stop_state_B = torch.zeros(B, dtype=torch.long, device=dev)  # each row's StopTable state
        self.stop_mask_B = torch.zeros(B, dtype=torch.long, device=dev)  # ... and its stop strings
        self.arange_B = torch.arange(B, device=dev)
        self.slot_L = torch.arange(L + 1, device=dev)
        self.mask_1111 = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=dev)  # packed: attention ignores it
        self.graphs = StepGraphs(self.graph_enabled)
        self.token_ring = TokenRing(B, self.tok_B1.dtype) if dev.type == "cuda" else None

    # ---- host-side control ---------------------------------------------------------------------
    @property
    def records(self) -> bool:
        """Whether forwards write statistics rows (the budget's record_stats)."""
        return self.budget is not None and self.budget.options.record_stats

    def reset(self, stop_at_eos: bool = True, reserve: int = 0) -> None:
        """Every slot empty (inactive, attending to one blank slot so that nothing divides by zero).
        `reserve`: statistics rows to make room for now (the forwards to come), so that the
        recorder never grows, and no graph is captured again, mid-stream."""
        if not self.cache.owns(self.model):
            self.cache.claim(self.model)
            self.graphs.clear()
            if self.regions is not None:
                self._allocate_cache()
        self.cache.zero_()
        self.valid_BL.zero_()
        self.valid_BL[:, 0] = True
        self.slot_B1.fill_(1)
        self.rowpos_B1.zero_()
        self.tok_B1.fill_(self.pad_id)
        self.finished_B.fill_(True)
        self.left_B.fill_(NO_LIMIT)
        self.stop_state_B.zero_()
        self.stop_mask_B.zero_()
        self.stop_at_eos.fill_(stop_at_eos)
        self.cache.set_write_pos(self.slot_B1)
        if self.records and reserve:
            self.budget.recorder.reserve(reserve)

    def _allocate_cache(self) -> None:
        """The K/V buffers now, by one eager packed forward of padding (the smallest bucket: every
        token writes the spare slot, nothing is recorded). Why: the first forward allocates them
        (StaticKV.allocate); traced inside a compiled packed forward, that allocation becomes a
        guard that fails at the next run, and dynamo recompiles inside the CUDA graph capture."""
        C = self.buckets[0]
        packed = pack([], self.buckets, self.B, self.trash, self.pad_id, pin=False, bucket=C)
        ids_C, row_C, slot_C, last_C = packed.stream_4C.to(self.device)
        self.cache.set_packed((row_C, slot_C, last_C))
        inputs = None if self.budget is None else self.budget.inputs(False, last_C >= 0, record=False)
        try:
            with torch.no_grad(), self.cache.active(self.model), \
                    self.budget.bound(inputs) if inputs is not None else nullcontext():
                self.model(input_ids=ids_C[None], attention_mask=self.mask_1111, position_ids=torch.zeros_like(ids_C)[None],
                           use_cache=False)
        finally:
            self.cache.set_packed(None)

    def end(self, slot: int) -> None:
        """The slot's request is over (a host stop check): inactive from the next forward on."""
        self.finished_B[slot] = True

    def snapshot(self) -> HostTokens:
        """Every slot's newest token and whether its row has ended, copied to the host
        asynchronously (read with .get())."""
        return HostTokens(torch.stack((self.tok_B1[:, 0], self.finished_B.long())), self.token_ring)

    def use_eager_capture(self) -> None:
        """Tests on a CPU: 'capture' and 'replay' by running the step, so the capture bookkeeping
        (keys, re-captures) is exercised without a GPU."""
        self.graphs = StepGraphs(True, eager_capture)

    # ---- launching forwards ----------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> None:
        """One decode step of every slot (a graph replay on a GPU); no host sync."""
        self._run(("decode",), self._step)

    @torch.no_grad()
    def run_packed(self, chunks: list[Chunk], mixed: bool, bucket: int | None = None) -> Packed:
        """A packed prefill of `chunks` (mixed=False) or a mixed step: the chunks plus one decode
        step of every slot (mixed=True). `bucket`: the stream length (default: the smallest that
        holds the chunks). No host sync."""
        packed = pack(chunks, self.buckets, self.B, self.trash, self.pad_id, pin=self.device.type == "cuda",
                      bucket=bucket)
        self.stream_4C[:, :packed.bucket].copy_(packed.stream_4C, non_blocking=True)
        self.rows_5B.copy_(packed.rows_5B, non_blocking=True)
        C = packed.bucket
        self._run(("mixed" if mixed else "prefill", C), lambda: self._packed(C, mixed))
        return packed

    def decode(self, steps: int, timed: bool = False, after_step=None) -> tuple[list[float], int]:
        """`steps` decode steps (the static engine's interface); returns ([], steps run eagerly)."""
        eager = self.graphs.eager
        for i in range(steps):
            self.step()
            if after_step is not None:
                after_step(i)
        return [], self.graphs.eager - eager

    @torch.no_grad()
    def warm_up(self, mixed: bool = True, reserve: int = 0) -> None:
        """Capture the decode step and the packed prefill (and mixed step) of every bucket now, on
        streams of padding that write nothing any row reads; then every slot empty and the
        budget's statistics reset. `reserve`: statistics rows for the streams to come
        (scheduler.forwards_bound), reserved before capturing so they never grow after."""
        self.reset(reserve=reserve)
        for C in self.buckets:
            self.run_packed([], mixed=False, bucket=C)
            if mixed:
                self.run_packed([], mixed=True, bucket=C)
        self.step()
        self.reset()
        if self.budget is not None:
            self.budget.reset()

    def _version(self) -> int:
        return self.budget.recorder.version if self.records else 0

    def _run(self, key: tuple, step) -> None:
        try:
            replayed = self.graphs.run(key, step, self._version())
        except CaptureError as err:
            impl = getattr(self.model.config, "_experts_implementation", None)
            raise CaptureError(f"{err}; experts implementation {impl!r}, dtype {self.dtype}. Use "
                               f"model.experts_impl=base_triton (or grouped_mm in bf16)") from err
        if replayed and self.records and not self.graphs.replays_run_on_host:
            self.budget.recorder.advance_host(1)  # a real replay ran a step the host did not see

    # ---- the steps (captured as they are: no host sync) --------------------------------------------
    def _step(self) -> None:
        """One decode step of every row at its own slot; decode attention reads up to the last
        slot of an active row."""
        active_B = ~self.finished_B
        self.cache.sync(active_B)
        self.valid_BL.scatter_(1, self.slot_B1, True)
        with self.regions.enabled() if self.regions is not None else nullcontext():
            out = self._forward(self.tok_B1, self.valid_BL[:, None, None, :], self.rowpos_B1, True, active_B)
        self._advance(self.sampling.next_token(out.logits[:, -1]))

    def _advance(self, nxt_B: Tensor) -> None:
        """Each active row takes its next token and moves on one slot; a row whose token is EOS
        (when stopping at EOS), completes one of its stop strings, or reaches its limit ends here."""
        active_B = ~self.finished_B
        nxt_B = torch.where(active_B, nxt_B, self.pad_id)
        self.left_B -= active_B.long()
        ends_B = (self.stop_at_eos & torch.isin(nxt_B, self.eos_D)) | (self.left_B <= 0)
        if self.stops is not None:
            state_B, hit_B = self.stops.advance(self.stop_state_B, nxt_B, self.stop_mask_B)
            self.stop_state_B.copy_(torch.where(active_B, state_B, self.stop_state_B))
            ends_B |= hit_B
        self.finished_B |= active_B & ends_B
        self.tok_B1.copy_(nxt_B[:, None])
        # an ended row stays where it is (it keeps writing its last slot, discarded at its next admission)
        self.slot_B1.add_(active_B[:, None].long()).clamp_(max=self.L - 1)
        self.rowpos_B1.add_(active_B[:, None].long())

    def _packed(self, C: int, mixed: bool) -> None:
        """A packed forward over stream_4C[:, :C] (and, when mixed, one decode token of every row
        first), then each row's bookkeeping."""
        B = self.B
        ids_C, row_C, slot_C, last_C = self.stream_4C[:, :C]
        len_B, lastidx_B, max_new_B, touched_B, stops_B = self.rows_5B
        real_C = last_C >= 0
        pos_C = torch.where(real_C, slot_C, 0)
        if mixed:
            self.cache.sync()
            active_B = ~self.finished_B
            dslot_B = torch.where(active_B, self.slot_B1[:, 0], self.trash)
            dlast_B = torch.where(active_B, self.slot_B1[:, 0], -1)
            ids_T = torch.cat([self.tok_B1[:, 0], ids_C])
            row_T, slot_T, last_T = torch.cat([self.arange_B, row_C]), torch.cat([dslot_B, slot_C]), torch.cat([dlast_B, last_C])
            pos_T = torch.cat([self.rowpos_B1[:, 0], pos_C])
            keep_K = torch.cat([self.arange_B, lastidx_B + B])
            active_T = torch.cat([active_B, real_C])
        else:
            ids_T, row_T, slot_T, last_T, pos_T = ids_C, row_C, slot_C, last_C, pos_C
            keep_K, active_T = lastidx_B, real_C
        self.cache.set_packed((row_T, slot_T, last_T))
        # eager, a prefill's norms, rotary and casts are dozens of element-wise launches per layer
        # over every token (about 15 of the 71.7 ms of kernel time of a 2,048-token prefill on an
        # H200: results/serve/grid_2026-12-04b/'s probe profile); compiled, Inductor fuses them (the
        # stream's prefill 1.14 -> 0.87-0.88 s, base M=16 7.7 % more tokens/s: results/serve/grid_2026-12-06b/)
        try:
            with self.regions.enabled() if self.regions is not None else nullcontext():
                logits_KV = self._forward_packed(ids_T[None], pos_T[None], keep_K, active_T, mixed)
        finally:
            self.cache.set_packed(None)
        nxt_K = self.sampling.next_token(logits_KV)
        if mixed:
            self.valid_BL.scatter_(1, self.slot_B1, True)  # the slots the decoding rows just wrote
            self._advance(nxt_K[:B])
            first_B = nxt_K[B:]
        else:
            first_B = nxt_K
        self._start(first_B, len_B, max_new_B, touched_B.bool(), stops_B)

    def _start(self, first_B: Tensor, len_B: Tensor, max_new_B: Tensor, touched_B: Tensor, stops_B: Tensor) -> None:
        """Rows whose prompt is now in (len_B > 0) take their first token and decode from slot
        len_B; rows with a partial prompt stay inactive, writing (if at all) into the spare slot.
        The first token may already end a request (EOS, a limit of 1, a stop string)."""
        final_B = len_B > 0
        partial_B = touched_B & ~final_B
        first_B = torch.where(final_B, first_B, self.tok_B1[:, 0])
        ends_B = (self.stop_at_eos & torch.isin(first_B, self.eos_D)) | (max_new_B <= 1)
        if self.stops is not None:  # a new request's text starts at its first token (state 0)
            state_B, hit_B = self.stops.advance(torch.zeros_like(first_B), first_B, stops_B)
            ends_B |= hit_B
            self.stop_state_B.copy_(torch.where(final_B, state_B, self.stop_state_B))
            self.stop_mask_B.copy_(torch.where(final_B, stops_B, self.stop_mask_B))
        self.tok_B1.copy_(first_B[:, None])
        self.left_B.copy_(torch.where(final_B, max_new_B - 1, self.left_B))
        self.finished_B.copy_(torch.where(final_B, ends_B, self.finished_B | partial_B))
        slot_B = torch.where(final_B, len_B, torch.where(partial_B, self.trash, self.slot_B1[:, 0]))
        self.slot_B1.copy_(slot_B[:, None])
        self.rowpos_B1.copy_(torch.where(final_B, len_B, self.rowpos_B1[:, 0])[:, None])
        self.valid_BL.copy_(torch.where(final_B[:, None], self.slot_L[None, :] < len_B[:, None], self.valid_BL))

    def _forward_packed(self, ids_1T: Tensor, pos_1T: Tensor, keep_K: Tensor, active_T: Tensor,
                        mixed: bool) -> Tensor:
        """The model over a packed stream (StaticKV.set_packed); the logits at `keep_K`, (K, V)."""
        kw = {"logits_to_keep": keep_K} if self._has_keep else {}
        inputs = None
        if self.budget is not None:
            if mixed:  # the budget binds in decode-only steps (docs/engine.md); recorded as `mixed`
                b = self.budget
                select = b.options.apply_to == "all" and b.selector is not None
                inputs = StepInputs(active_T, select, b.recorder if self.records else None, decode=False)
            else:
                inputs = self.budget.inputs(False, active_T)
        moe = self.budget.bound(inputs) if inputs is not None else nullcontext()
        with self.cache.active(self.model), moe:
            out = self.model(input_ids=ids_1T, attention_mask=self.mask_1111, position_ids=pos_1T, use_cache=False,
                             **kw)
        if inputs is not None and mixed and inputs.recorder is not None:
            inputs.recorder.mark_mixed()
        return out.logits[0] if self._has_keep else out.logits[0, keep_K]

    # ---- the padded path (reference, scheduler.packing=padded) ----------------------------------------
    @torch.no_grad()
    def admit(self, slots: list[int], ids_nP: Tensor, mask_nP: Tensor, stop_at_eos: bool = True,
              max_new: list[int] | None = None, stops: list[int] | None = None) -> Tensor:
        """Prefill the arrivals (left-padded prompts) into `slots`, eagerly; returns their first new
        tokens (n,) on the device. Their rows' old contents are replaced; the other rows are
        untouched. `max_new`: each request's new-token limit (the first token counts; default none);
        `stops`: each request's StopTable mask (default none)."""
        n, P = ids_nP.shape
        if P >= self.L:
            raise ValueError(f"prompt of {P} tokens does not fit the engine's {self.L} cache slots")
        dev = self.device
        rows_n = torch.tensor(slots, dtype=torch.long, device=dev)
        ids, mask = ids_nP.to(dev), mask_nP.to(dev)
        if not self.cache.owns(self.model):
            self.reset(stop_at_eos)
        self.valid_BL[rows_n] = False
        self.valid_BL[rows_n, :P] = mask.bool()
        pos_nP = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as generate does for left padding
        causal_PP = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
        allowed_n1PL = torch.zeros(n, 1, P, self.L + 1, dtype=torch.bool, device=dev)
        allowed_n1PL[:, 0, :, :P] = causal_PP & mask.bool()[:, None, :]
        allowed_n1PL[:, 0, :, :P] |= torch.eye(P, dtype=torch.bool, device=dev)  # pad queries: themselves
        self.cache.set_write_rows(rows_n)
        self.cache.set_write_pos(torch.arange(P, device=dev))
        try:
            out = self._forward(ids, allowed_n1PL, pos_nP, False, mask.reshape(-1).bool())
        finally:
            self.cache.set_write_rows(None)
            self.cache.set_write_pos(self.slot_B1)  # decode steps write at each row's slot
        first_n = self.sampling.next_token(out.logits[:, -1])
        limit_n = torch.tensor(max_new or [NO_LIMIT] * n, dtype=torch.long, device=dev)
        self.slot_B1[rows_n] = P
        self.rowpos_B1[rows_n] = pos_nP[:, -1:] + 1
        self.tok_B1[rows_n] = first_n[:, None]
        self.left_B[rows_n] = limit_n - 1
        ends_n = (torch.isin(first_n, self.eos_D) & stop_at_eos) | (limit_n <= 1)
        if self.stops is not None:
            mask_n = torch.tensor(stops or [0] * n, dtype=torch.long, device=dev)
            state_n, hit_n = self.stops.advance(torch.zeros_like(first_n), first_n, mask_n)
            self.stop_state_B[rows_n], self.stop_mask_B[rows_n] = state_n, mask_n
            ends_n |= hit_n
        self.finished_B[rows_n] = ends_n
        self.stop_at_eos.fill_(stop_at_eos)
        return first_n

    def release(self) -> None:
        """Free the graphs and the cache and restore the model's own forwards."""
        self.graphs.clear()
        super().release()
        self.cache = StaticKV(self.L + 1, self.device, batch=self.B)
