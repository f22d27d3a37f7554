"""Stop strings decided on the device, in the step that produced the token that completes them.

    pieces = token_pieces(tokenizer)                     # each token's bytes in decoded text, or None
    table = StopTable.build(pieces, [["\\n\\n", "Q:"], ["."]], vocab=V, device=dev)
    table.mask(["\\n\\n", "Q:"])                           # the row's stop strings, as a bit mask
    nxt_state_B, hit_B = table.advance(state_B, tok_B, mask_B)   # in the decode step, no host sync

Why: with the host one step behind the device (scheduler.overlap), a stop only the host checks
ends its request one step late, and that late row takes part in the next step's expert selection
and statistics. Here every request's stop strings are matched on the device as its tokens are made.

The scheme (exact where `token_pieces` gives pieces): a request's text is the decode of its new
tokens, and for the tokenizers taken here that decode is the concatenation of each token's bytes
(`token_pieces`: a byte-level BPE decoder, or a `Fuse` decoder over whole-token strings, with no
clean-up of spaces). A stop string occurs in the text exactly when its UTF-8 bytes occur in the
concatenated bytes (UTF-8 is self-synchronising: a whole character's bytes never match inside
another character). So one deterministic automaton over bytes (Aho-Corasick, every stop string
of the run) matches every row: the state is the longest suffix of the row's bytes so far that is
a prefix of some stop string. Per token it is tabulated once: `next_QV[q, t]`, the state after
token t's bytes from state q, and `hit_QV[q, t]`, the bit mask of the stop strings that end at
some byte of t (not only at its last byte: a token may carry a stop string and more). A row's
own stop strings are a bit mask, so rows of different tasks share the tables. A tokenizer whose
decode is not such a concatenation (SentencePiece's leading-space strip, clean-up of spaces)
gets no table: its stops stay on the host and the late rows are counted (ServeStats.late_rows).

Limits: 63 distinct stop strings per table (one int64 mask); further strings are matched on the
host only. The empty string is no stop (as lm-eval truncates). Memory: Q states x V tokens x 12
bytes (Q is about the stop strings' total length).

Shapes: Q automaton states, V vocabulary (the model's, at least the tokenizer's), B rows.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch
from torch import Tensor

MAX_STRINGS = 63  # bits of an int64 mask (the sign bit left alone)


@cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet (printable stand-ins for the 256 bytes), inverted."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _decoders(spec: dict | None) -> list[str]:
    if spec is None:
        return []
    if spec.get("type") == "Sequence":
        return [t for d in spec.get("decoders", []) for t in _decoders(d)]
    return [spec.get("type", "")]


def token_pieces(tokenizer) -> list[bytes] | None:
    """Each token id's bytes such that decode(ids, skip_special_tokens=False) is the UTF-8 decode
    of their concatenation, or None where the tokenizer's decode is not such a concatenation."""
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return None
    spec = json.loads(backend.to_str())
    kinds = _decoders(spec.get("decoder"))
    added = {t["id"]: t["content"].encode() for t in spec.get("added_tokens", [])}
    vocab_size = backend.get_vocab_size(with_added_tokens=True)
    if kinds == ["ByteLevel"]:
        to_byte = _byte_decoder()
        pieces = []
        for i in range(vocab_size):
            if i in added:
                pieces.append(added[i])
                continue
            token = backend.id_to_token(i)
            if token is None or any(ch not in to_byte for ch in token):
                return None
            pieces.append(bytes(to_byte[ch] for ch in token))
        return pieces
    if kinds == ["Fuse"] and spec.get("model", {}).get("type") in ("WordLevel", "BPE"):
        if spec["model"].get("continuing_subword_prefix") or spec["model"].get("end_of_word_suffix"):
            return None
        pieces = []
        for i in range(vocab_size):
            token = backend.id_to_token(i)
            pieces.append(added.get(i, b"" if token is None else token.encode()))
        return pieces
    return None


@dataclass(frozen=True)
class StopTable:
    """Every stop string of a run as one automaton over token ids (see the module doc)."""

    strings: tuple[str, ...]  # bit i of a row's mask: strings[i]
    next_QV: Tensor  # int64 (Q, V): the state after a token
    hit_QV: Tensor  # int64 (Q, V): the strings that end inside a token's bytes, as bits

    @property
    def states(self) -> int:
        return self.next_QV.shape[0]

    def mask(self, until: list[str]) -> int:
        """The bit mask of `until`'s strings this table matches (the others: host only)."""
        return sum(1 << self.strings.index(s) for s in set(until) if s in self.strings)

    def host_only(self, until: list[str]) -> list[str]:
        """The stop strings of `until` that this table does not match (they end a row late)."""
        return [s for s in until if s and s not in self.strings]

    def advance(self, state_B: Tensor, tok_B: Tensor, mask_B: Tensor) -> tuple[Tensor, Tensor]:
        """Each row's state after its token and whether one of its own stop strings ended in it.
        Graph-safe: two gathers, no host sync."""
        flat_B = state_B * self.next_QV.shape[1] + tok_B
        hit_B = (self.hit_QV.view(-1)[flat_B] & mask_B) != 0
        return self.next_QV.view(-1)[flat_B], hit_B

    @classmethod
    def build(cls, pieces: list[bytes], untils: list[list[str]], vocab: int, device: torch.device) -> StopTable | None:
        """The table of every distinct non-empty string in `untils` (the most frequent
        MAX_STRINGS; None when there are none). `vocab`: the model's vocabulary (ids past the
        tokenizer's have no bytes)."""
        counts: dict[str, int] = {}
        for until in untils:
            for s in set(until):
                if s:
                    counts[s] = counts.get(s, 0) + 1
        if not counts:
            return None
        strings = tuple(sorted(counts, key=lambda s: (-counts[s], s))[:MAX_STRINGS])
        goto, out = _automaton([s.encode() for s in strings])
        next_QV, hit_QV = _per_token(goto, out, pieces, vocab)
        return cls(strings, torch.from_numpy(next_QV).to(device), torch.from_numpy(hit_QV).to(device))


def _automaton(patterns: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Aho-Corasick as a complete byte DFA: goto (Q, 256) and out (Q,), the bit mask of the
    patterns that end at a state (through its failure links)."""
    goto_rows: list[dict[int, int]] = [{}]
    out = [0]
    for bit, p in enumerate(patterns):
        q = 0
        for b in p:
            if b not in goto_rows[q]:
                goto_rows.append({})
                out.append(0)
                goto_rows[q][b] = len(goto_rows) - 1
            q = goto_rows[q][b]
        out[q] |= 1 << bit
    Q = len(goto_rows)
    goto = np.zeros((Q, 256), dtype=np.int64)
    fail = [0] * Q
    order = []
    for b, q in goto_rows[0].items():
        goto[0, b] = q
        order.append(q)
    while order:  # breadth first: a state's failure target is complete before its children
        nxt = []
        for q in order:
            out[q] |= out[fail[q]]
            goto[q] = goto[fail[q]]
            for b, child in goto_rows[q].items():
                fail[child] = goto[fail[q], b] if q else 0
                goto[q, b] = child
                nxt.append(child)
        order = nxt
    return goto, np.array(out, dtype=np.int64)


def _per_token(goto: np.ndarray, out: np.ndarray, pieces: list[bytes], vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Run every token's bytes from every state at once: (Q, V) end states and hit masks."""
    Q = goto.shape[0]
    V = max(vocab, len(pieces))
    width = max((len(p) for p in pieces), default=0)
    bytes_VW = np.zeros((V, max(width, 1)), dtype=np.int64)
    length_V = np.zeros(V, dtype=np.int64)
    for i, p in enumerate(pieces):
        bytes_VW[i, :len(p)] = np.frombuffer(p, dtype=np.uint8)
        length_V[i] = len(p)
    state_QV = np.repeat(np.arange(Q, dtype=np.int64)[:, None], V, axis=1)
    hit_QV = np.zeros((Q, V), dtype=np.int64)
    for j in range(width):
        live_V = length_V > j
        moved_QV = goto[state_QV, bytes_VW[None, :, j]]
        hit_QV |= np.where(live_V[None, :], out[moved_QV], 0)
        state_QV = np.where(live_V[None, :], moved_QV, state_QV)
    return state_QV[:, :vocab] if vocab < V else state_QV, hit_QV[:, :vocab] if vocab < V else hit_QV
