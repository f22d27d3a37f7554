"""Packed prefill (base/runtime/continuous.py, base/runtime/packing.py): an admission round's
prompts as one token stream with varlen causal attention give the logits of the padded path (the
first token's and the decode steps' after it, so the K/V written into each slot's row are right),
for several prompt lengths and families, with long prompts split over several forwards; padding
tokens write nothing any row reads."""
from __future__ import annotations

import pytest
import torch

from base.hf.loading import load_model
from base.runtime.continuous import ContinuousEngine
from base.runtime.packing import Chunk, bucket_for, pack
from base.runtime.sampling import Sampling
from base.runtime.scheduler import left_pad
from tests.helpers import ROOT, tiny_model_config, torch_threads

BUCKETS = (8, 16, 32)
_MODELS: dict[str, torch.nn.Module] = {}


def tiny(family: str) -> torch.nn.Module:
    if family not in _MODELS:
        with torch_threads(1):
            _MODELS[family] = load_model(tiny_model_config(family), ROOT, seed=0)
    return _MODELS[family]


class Spy(Sampling):
    """Greedy, keeping every logits tensor it is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.Tensor] = []

    def next_token(self, logits_BV):
        self.seen.append(logits_BV.detach().clone())
        return super().next_token(logits_BV)


def forwards(prompts: list[list[int]], slots: list[int], per_forward: int) -> list[list[Chunk]]:
    """The prompts packed greedily into forwards of at most `per_forward` tokens, a prompt that
    does not fit continuing in the next forward (written here independently of the scheduler)."""
    out, current, room = [], [], per_forward
    for slot, ids in zip(slots, prompts):
        start = 0
        while start < len(ids):
            n = min(room, len(ids) - start)
            current.append(Chunk(slot, ids[start:start + n], start, start + n == len(ids)))
            start, room = start + n, room - n
            if room == 0:
                out.append(current)
                current, room = [], per_forward
    return out + ([current] if current else [])


@pytest.mark.parametrize("family,lengths,per_forward", [
    ("qwen3", [5, 1, 9, 3], 32),
    pytest.param("olmoe", [5, 1, 9, 3], 32, marks=pytest.mark.slow),
    pytest.param("qwen3", [17, 2, 30, 8], 16, marks=pytest.mark.slow),  # prompts split over forwards
    pytest.param("olmoe", [11, 7, 1, 13], 8, marks=pytest.mark.slow),
    pytest.param("deepseek", [6, 9, 2, 4], 16, marks=pytest.mark.slow),  # MLA: key and value sizes differ
    pytest.param("gpt_oss", [13, 3, 20, 6], 16, marks=pytest.mark.slow),  # sinks, sliding-window layers
    pytest.param("mixtral", [5, 12, 2, 9], 16, marks=pytest.mark.slow),
])
def test_packed_prefill_gives_the_padded_logits(family, lengths, per_forward):
    model = tiny(family)
    g = torch.Generator().manual_seed(len(lengths) + sum(lengths))
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in lengths]
    slots = [2, 0, 3, 1]
    spy = Spy()
    engine = ContinuousEngine(model, 4, 48, pad_id=0, sampling=spy, buckets=BUCKETS)
    try:
        with torch_threads(1):
            engine.reset(stop_at_eos=False)
            engine.admit(slots, *left_pad(prompts, 0), stop_at_eos=False)
            for _ in range(3):
                engine.step()
            padded_first, padded_steps = spy.seen[0], spy.seen[1:]
            engine.reset(stop_at_eos=False)
            spy.seen.clear()
            plan = forwards(prompts, slots, per_forward)
            for chunks in plan:
                engine.run_packed(chunks, mixed=False)
            for _ in range(3):
                engine.step()
    finally:
        engine.release()
    packed_prefills, packed_steps = spy.seen[:len(plan)], spy.seen[len(plan):]
    # each prompt's first-token logits come from the forward that held its final chunk, in its slot's row
    final_in = {c.slot: f for f, chunks in enumerate(plan) for c in chunks if c.final}
    for n, slot in enumerate(slots):
        torch.testing.assert_close(packed_prefills[final_in[slot]][slot], padded_first[n], rtol=1e-4, atol=1e-4)
    for packed, padded in zip(packed_steps, padded_steps, strict=True):
        torch.testing.assert_close(packed[slots], padded[slots], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_packed_prefill_through_the_triton_kernel(monkeypatch):
    """The same with the Triton varlen kernel (interpreted) in place of the PyTorch path the CPU
    uses: the kernel as the engine calls it on a GPU."""
    import kernels.varlen_attention as va

    monkeypatch.setattr(va, "varlen_attention_reference", va.varlen_attention)
    test_packed_prefill_gives_the_padded_logits("qwen3", [17, 2, 30, 8], 16)


def test_pack_lays_chunks_end_to_end_and_pads_to_a_bucket():
    packed = pack([Chunk(2, [7, 8, 9], 0, True, 5, stops=6), Chunk(0, [4, 5], 6, False, stops=1)], BUCKETS, slots=3,
                  trash=40, pad_id=1)
    ids, row, slot, last = packed.stream_4C.tolist()
    assert packed.bucket == 8 and packed.tokens == 5
    assert ids == [7, 8, 9, 4, 5, 1, 1, 1] and row == [2, 2, 2, 0, 0, 0, 0, 0]
    assert slot == [0, 1, 2, 6, 7, 40, 40, 40] and last == [0, 1, 2, 6, 7, -1, -1, -1]
    length, last_idx, max_new, touched, stops = packed.rows_5B.tolist()
    assert length == [0, 0, 3] and last_idx[2] == 2 and max_new[2] == 5 and touched == [1, 0, 1]
    assert stops == [0, 0, 6]  # a request's stop strings travel with its final chunk
    assert bucket_for(9, BUCKETS) == 16
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        bucket_for(33, BUCKETS)


def test_padding_tokens_write_nothing_a_row_reads():
    """A packed forward of padding only (as the warm-up runs one per bucket) leaves every row's
    cache as it was, the spare slot aside."""
    model = tiny("qwen3")
    engine = ContinuousEngine(model, 2, 16, pad_id=0, buckets=BUCKETS)
    try:
        with torch_threads(1):
            engine.reset(stop_at_eos=False)
            engine.run_packed([Chunk(0, [5, 6, 7], 0, True), Chunk(1, [9, 10], 0, True)], mixed=False)
            before = [m.base_k_cache[:, :, :engine.L].clone() for m in engine.cache.modules]
            tokens = engine.tok_B1.clone()
            engine.run_packed([], mixed=False, bucket=32)
            after = [m.base_k_cache[:, :, :engine.L] for m in engine.cache.modules]
    finally:
        engine.release()
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert torch.equal(engine.tok_B1, tokens)  # nothing admitted: no row took a token
