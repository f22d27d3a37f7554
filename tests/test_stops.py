"""Stop strings on the device (base/runtime/stops.py) and in the continuous engine:

- the token automaton ends a row exactly where `stop in decode(new tokens)` first holds (brute
  force over random pieces, strings and token streams), for each row's own strings;
- `token_pieces` is exact where it answers: decode of any token sequence equals the UTF-8 decode
  of the pieces' concatenation (the mini tokenizer; a byte-level BPE built here, multi-byte
  characters split across tokens), and None for a decoder that strips or cleans up;
- served with the host one step behind (overlap) or not: the same tokens, statistics rows and
  decode-row counts (every step's active rows = Σ(new tokens - 1)), no late row; with the stops
  on the host only, overlap decodes late rows and the stream counts them.
"""
from __future__ import annotations

import random

import pandas as pd
import pytest
import torch

from base.config import SchedulerConfig
from base.hf.budget import BudgetOptions
from base.hf.loading import load_model
from base.method.selectors import build_selector
from base.runtime.continuous import ContinuousEngine
from base.runtime.scheduler import Request, serve
from base.runtime.stops import MAX_STRINGS, StopTable, token_pieces
from tests.helpers import ROOT, budgeted, loaded_tiny_qwen3, model_artifacts, tiny_model_config, torch_threads


def first_stop(pieces: list[bytes], toks: list[int], until: list[str]) -> int | None:
    """Brute force: the number of tokens after which a string of `until` first occurs in the text."""
    for n in range(1, len(toks) + 1):
        text = b"".join(pieces[t] for t in toks[:n]).decode("utf-8", errors="replace")
        if any(s and s in text for s in until):
            return n
    return None


def automaton_stop(table: StopTable, toks: list[int], until: list[str]) -> int | None:
    state, mask = torch.zeros(1, dtype=torch.long), torch.tensor([table.mask(until)])
    for n, t in enumerate(toks, 1):
        state, hit = table.advance(state, torch.tensor([t]), mask)
        if hit.item():
            return n
    return None


@pytest.mark.parametrize("seed", range(6))
def test_the_automaton_ends_a_row_where_its_stop_string_first_occurs(seed):
    """Pieces of 0-3 characters over a small alphabet (so strings straddle tokens, sit inside
    one, or overlap each other), rows with different strings sharing one table."""
    rng = random.Random(seed)
    alphabet = "ab\nQ:é"
    pieces = [b""] + ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3))).encode() for _ in range(40)]
    untils = [[("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))) for _ in range(rng.randint(1, 3))]
              for _ in range(8)] + [[""], []]
    table = StopTable.build(pieces, untils, vocab=len(pieces) + 5, device=torch.device("cpu"))
    for _ in range(60):
        until = rng.choice(untils)
        toks = [rng.randrange(len(pieces) + 5) for _ in range(rng.randint(1, 25))]
        padded = pieces + [b""] * 5  # ids past the tokenizer's: no text
        assert automaton_stop(table, toks, until) == first_stop(padded, toks, until), (until, toks)


def test_a_run_without_stop_strings_has_no_table_and_extra_strings_stay_on_the_host():
    pieces = [bytes([c]) for c in range(97, 123)]
    assert StopTable.build(pieces, [[], [""]], 26, torch.device("cpu")) is None
    many = [[f"{chr(97 + i // 26)}{chr(97 + i % 26)}"] for i in range(MAX_STRINGS + 2)]
    table = StopTable.build(pieces, many, 26, torch.device("cpu"))
    assert len(table.strings) == MAX_STRINGS
    left = [u[0] for u in many if u[0] not in table.strings]
    assert len(left) == 2 and table.host_only([left[0]]) == [left[0]] and table.mask([left[0]]) == 0


def _check_pieces(tokenizer, vocab: int, seed: int = 0) -> None:
    pieces = token_pieces(tokenizer)
    assert pieces is not None and len(pieces) == vocab
    rng = random.Random(seed)
    for _ in range(300):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 10))]
        assert tokenizer.decode(ids, skip_special_tokens=False) == \
            b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace"), ids


def test_token_pieces_of_the_embedded_models_tokenizer_concatenate_to_its_decode():
    from transformers import AutoTokenizer

    for name in ("mini", "mini_olmoe"):
        tok = AutoTokenizer.from_pretrained(ROOT / "models" / name)
        _check_pieces(tok, len(tok))


def _byte_level_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    texts = ["Question: what is 2+2?\nAnswer: 4\n\n", "naïve café – déjà vu ✓", "一二三四五 数学 答案"] * 50
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False)


def test_token_pieces_of_a_byte_level_tokenizer_are_bytes_and_match_stops_across_split_characters():
    """Byte-level BPE (Qwen's, OLMoE's kind): multi-byte characters split over tokens decode to
    replacement characters until complete; the stop matched on bytes ends where the decoded text
    first holds it."""
    tok = _byte_level_tokenizer()
    _check_pieces(tok, len(tok))
    pieces = token_pieces(tok)
    split = [i for i, p in enumerate(pieces) if p and (p[0] & 0xC0) == 0x80]  # starts inside a character
    assert split  # the test covers pieces that are not whole characters
    until = [["答案"], ["\n\n", "Question:"], ["é"]]
    table = StopTable.build(pieces, until, len(pieces), torch.device("cpu"))
    rng = random.Random(1)
    ids = tok.encode("".join(rng.choice(["答案", "一二", "\n", "Question", ":", "é", "x"]) for _ in range(60)))
    for u in until:
        for start in range(0, len(ids), 7):
            assert automaton_stop(table, ids[start:], u) == first_stop(pieces, ids[start:], u)


def test_a_decoder_that_is_no_concatenation_gets_no_pieces():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "▁a": 1, "b": 2, "▁": 3}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()  # strips the text's leading space: decode([1]) != decode([2, 1])[1:]
    assert token_pieces(PreTrainedTokenizerFast(tokenizer_object=backend)) is None
    backend.decoder = decoders.Fuse()
    assert token_pieces(PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=True)) is None
    assert token_pieces(PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False)) is not None


# ---- the engine ------------------------------------------------------------------------------------

model = pytest.fixture(scope="module")(loaded_tiny_qwen3)


def _pieces(vocab: int) -> list[bytes]:
    """A made-up text for the tiny model's ids: each id one or two letters."""
    return [(chr(97 + i % 7) * (1 + i % 2)).encode() for i in range(vocab)]


def _requests(model, n: int, seed: int) -> tuple[list[Request], list[list[str]]]:
    """Requests whose stop strings the tiny model's greedy tokens reach: taken from what it
    writes without them (some rows stop in a step, some at their first token, some never)."""
    g = torch.Generator().manual_seed(seed)
    reqs = [Request(torch.randint(3, 200, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g).tolist(), 12)
            for _ in range(n)]
    with torch_threads(1):
        free = _serve(model, reqs, None, SchedulerConfig(buckets=[8, 16, 32]))[0]
    pieces = _pieces(model.config.vocab_size)
    rng = random.Random(seed)
    untils = []
    for r, d in zip(reqs, free):
        text = b"".join(pieces[t] for t in d.tokens).decode()
        at = rng.randrange(len(text))
        untils.append([text[at:at + rng.randint(1, 3)], "zz"] if rng.random() < 0.8 else ["zz"])
    return reqs, untils


def _serve(model, reqs, stops, policy, budget=None):
    engine = ContinuousEngine(model, 3, 48, budget=budget, pad_id=0, buckets=policy.buckets, stops=stops)
    try:
        return serve(engine, reqs, pad_id=0, stop_at_eos=False, policy=policy)
    finally:
        engine.release()


def _with_stops(reqs, untils, table, pieces, on_device: bool) -> list[Request]:
    def done(toks, until):
        text = b"".join(pieces[t] for t in toks).decode()
        return any(s in text for s in until)

    return [Request(r.ids, r.max_new, done=lambda toks, u=u: done(toks, u), stops=table.mask(u) if on_device else 0)
            for r, u in zip(reqs, untils)]


@pytest.mark.parametrize("method,chunked", [("base", False), ("base_anchor", True)])
def test_overlap_changes_nothing_when_the_stops_are_on_the_device(model, method, chunked):
    """Overlap on and off: the same tokens and the same statistics rows, no late row; every
    request ends where its stop string first occurs; the decode rows recorded (active rows of the
    budgeted steps) equal Σ(new tokens - 1)."""
    reqs, untils = _requests(model, 11, seed=3)
    pieces = _pieces(model.config.vocab_size)
    table = StopTable.build(pieces, untils, model.config.vocab_size, torch.device("cpu"))
    results = {}
    for overlap in (False, True):
        policy = SchedulerConfig(buckets=[8, 16, 32], overlap=overlap, chunked=chunked, chunk_tokens=5)
        sel = build_selector(method, model_artifacts(model), k0=1 if method == "base_anchor" else None)
        with torch_threads(1), budgeted(model, "qwen3_moe", sel, BudgetOptions(budget=2)) as budget:
            done, stats = _serve(model, _with_stops(reqs, untils, table, pieces, True), table, policy, budget)
            rows = pd.DataFrame(budget.stats_rows())
        results[overlap] = done, stats, rows
        assert stats.late_rows == 0
        for d, u in zip(done, untils):
            n = first_stop(pieces, d.tokens, u)
            assert len(d.tokens) == (n if n is not None else 12)
        first_layer = rows[rows.layer == rows.layer.min()]
        decode_rows = first_layer[first_layer.kind == "decode"].tokens.sum()
        mixed_decode_rows = sum(stats.mixed_occupied)  # mixed steps: the decoding rows among the stream's tokens
        assert decode_rows + mixed_decode_rows == sum(len(d.tokens) - 1 for d in done)
    (off, s_off, r_off), (on, s_on, r_on) = results[False], results[True]
    assert [d.tokens for d in off] == [d.tokens for d in on]
    pd.testing.assert_frame_equal(r_off, r_on)
    assert s_off.occupied == s_on.occupied and s_off.mixed_occupied == s_on.mixed_occupied


def test_stops_on_the_host_only_decode_late_rows_and_say_how_many(model):
    """The same requests with their stops checked by the host only: the tokens kept are the same
    (dense), but a request a stop ended (after its first token) decodes in the next step when one
    was launched with it, with overlap or without (the host acts one forward behind either way);
    the stream counts those rows, and the statistics rows hold exactly that many more."""
    reqs, untils = _requests(model, 11, seed=3)
    pieces = _pieces(model.config.vocab_size)
    table = StopTable.build(pieces, untils, model.config.vocab_size, torch.device("cpu"))
    policy = SchedulerConfig(buckets=[8, 16, 32])
    with torch_threads(1), budgeted(model, "qwen3_moe", None, BudgetOptions(budget=None)) as budget:
        device = _serve(model, _with_stops(reqs, untils, table, pieces, True), table, policy, budget)
    ended_by_stop = sum(first_stop(pieces, d.tokens, u) not in (None, 1) for d, u in zip(device[0], untils))
    assert device[1].late_rows == 0 and ended_by_stop > 0
    for overlap in (False, True):
        with torch_threads(1), budgeted(model, "qwen3_moe", None, BudgetOptions(budget=None)) as budget:
            host = _serve(model, _with_stops(reqs, untils, table, pieces, False), None,
                          SchedulerConfig(buckets=[8, 16, 32], overlap=overlap), budget)
            rows = pd.DataFrame(budget.stats_rows())
        assert [d.tokens for d in host[0]] == [d.tokens for d in device[0]]
        assert 0 < host[1].late_rows <= ended_by_stop
        decode_rows = rows[(rows.layer == rows.layer.min()) & (rows.kind == "decode")].tokens.sum()
        assert decode_rows == sum(len(d.tokens) - 1 for d in host[0]) + host[1].late_rows


@pytest.mark.gpu
@pytest.mark.parametrize("chunked", [False, True])
def test_gpu_stop_strings_in_the_captured_step_give_the_eager_steps_results(chunked):
    """On a GPU: the stop matching runs inside the captured decode step (and the packed forwards'
    first tokens); graph replay gives the eager run's tokens and statistics rows, every request
    ends where its stop string first occurs, and nothing is captured after the warm-up."""
    from base.hf.experts_impl import register_base_triton
    from base.runtime.scheduler import forwards_bound

    register_base_triton()
    cpu_model = load_model(tiny_model_config("qwen3"), ROOT, seed=0)
    reqs, untils = _requests(cpu_model, 13, seed=4)
    cfg = tiny_model_config("qwen3")
    cfg.device, cfg.experts_impl = "cuda", "base_triton"
    gpu_model = load_model(cfg, ROOT, seed=0, experts_impl="base_triton")
    pieces = _pieces(gpu_model.config.vocab_size)
    table = StopTable.build(pieces, untils, gpu_model.config.vocab_size, torch.device("cuda"))
    policy = SchedulerConfig(buckets=[8, 16, 32], chunked=chunked, chunk_tokens=5)
    results = {}
    for graph in (False, True):
        sel = build_selector("base", model_artifacts(gpu_model))
        with budgeted(gpu_model, "qwen3_moe", sel, BudgetOptions(budget=3, backend="triton")) as budget:
            engine = ContinuousEngine(gpu_model, 3, 48, budget=budget, pad_id=0, graph=graph, buckets=policy.buckets,
                                      stops=table)
            served = _with_stops(reqs, untils, table, pieces, True)
            try:
                engine.warm_up(mixed=chunked, reserve=forwards_bound(served, policy.buckets))
                done, stats = serve(engine, served, pad_id=0, stop_at_eos=False, policy=policy)
            finally:
                engine.release()
            rows = [(r["layer"], r["kind"], r["union"], r["kept"], r["tokens"]) for r in budget.stats_rows()]
        results[graph] = [d.tokens for d in done], rows, stats
        assert stats.late_rows == 0
        for d, u in zip(done, untils):
            n = first_stop(pieces, d.tokens, u)
            assert len(d.tokens) == (n if n is not None else 12)
    assert results[True][:2] == results[False][:2]
    assert results[True][2].captures == 0 and not any(results[True][2].eager)
