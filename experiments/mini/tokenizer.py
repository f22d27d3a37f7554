"""Character-level tokenizer of the "mini" model, built with the `tokenizers` library.

One token per character: 4 specials, "\\n" (the stop sequence) and the 95 printable ASCII
characters, 100 ids in all. No post-processor, so `tok(text)` never adds BOS/EOS: training text,
`tok(...)` and lm-eval's encoding (which adds no special tokens) all see the same ids. Left padding
is the saved default, for batched generation.

    python -m experiments.mini.tokenizer /tmp/tok   # writes tokenizer.json + tokenizer_config.json
"""

from __future__ import annotations

import itertools
import sys

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]
VOCAB_SIZE = len(SPECIALS) + len(CHARS)  # 100; the model pads its embedding to 128


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Deterministic: the vocabulary is fixed, nothing is learned from data."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Why: "[\s\S]" (not ".") so that "\n" is split off as its own token too.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()  # join characters back without separators
    for tok in SPECIALS:
        core.add_special_tokens([tok])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",
        model_max_length=256,
    )


def char_table(tok: PreTrainedTokenizerFast) -> np.ndarray:
    """Byte -> token id lookup (uint8 ASCII only), for vectorised encoding of a large corpus."""
    table_A = np.full(256, tok.unk_token_id, dtype=np.int64)  # A = 256 byte values
    for ch in CHARS:
        table_A[ord(ch)] = tok.convert_tokens_to_ids(ch)
    return table_A


def encode_flat(texts: list[str], table_A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All texts' ids concatenated (ids_C, C = total characters) and each text's length (len_T)."""
    ids_C = table_A[np.frombuffer("".join(texts).encode("ascii"), dtype=np.uint8)]
    return ids_C, np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))


def encode_fast(texts: list[str], table_A: np.ndarray) -> list[np.ndarray]:
    """Encode ASCII texts via the lookup table; equals `tok(text).input_ids` (checked in tests)."""
    ids_C, len_T = encode_flat(texts, table_A)
    bounds = np.concatenate([[0], np.cumsum(len_T)])
    return [ids_C[a:b] for a, b in itertools.pairwise(bounds)]


if __name__ == "__main__":
    build_tokenizer().save_pretrained(sys.argv[1] if len(sys.argv) > 1 else "tokenizer_out")
