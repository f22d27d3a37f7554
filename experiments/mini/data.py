"""Deterministic corpus of the "mini" model: held-out test sets and a disjoint training corpus.

Test sets are drawn first (seed `TEST_SEED`, unique prompts per domain); the training corpus is
drawn with another seed and rejects every test prompt (hash set), so the held-out check is by
construction and `check_disjoint` re-verifies it. A training text is `prompt + answer + "\\n"`;
the model is trained to emit the answer, the "\\n" stop and then EOS.

    python -m experiments.mini.data   # prints a few examples and the disjointness check
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from experiments.mini.domains import DOMAINS

TEST_SEED = 20250101
TRAIN_SEED = 0
STOP = "\n"


@dataclass(frozen=True)
class Sample:
    domain: str
    prompt: str
    answer: str

    @property
    def text(self) -> str:
        return self.prompt + self.answer + STOP


def _rng(seed: int, domain: str, split: str) -> random.Random:
    # Why: a str seed is hashed with sha512 by `random`, stable across runs and PYTHONHASHSEED.
    return random.Random(f"{split}-{seed}-{domain}")


def make_test_sets(n_per_domain: int = 200, seed: int = TEST_SEED) -> dict[str, list[Sample]]:
    """`n_per_domain` samples with unique prompts per domain, in generation order."""
    out: dict[str, list[Sample]] = {}
    for domain, gen in DOMAINS.items():
        rng, seen, samples = _rng(seed, domain, "test"), set(), []
        while len(samples) < n_per_domain:
            prompt, answer = gen(rng)
            if prompt not in seen:
                seen.add(prompt)
                samples.append(Sample(domain, prompt, answer))
        out[domain] = samples
    return out


def held_out_prompts(test_sets: dict[str, list[Sample]]) -> set[str]:
    return {s.prompt for samples in test_sets.values() for s in samples}


# Older name, still imported elsewhere (experiments/mini_calibration.py). Not used in tests: pytest
# would collect a `test_*` function imported into a test module.
test_prompts = held_out_prompts


def make_train_corpus(n_per_domain: int, exclude: set[str], seed: int = TRAIN_SEED,
                      domains: Iterable[str] | None = None) -> list[Sample]:
    """`n_per_domain` samples per domain (repeats allowed), none with a prompt in `exclude`.

    Domains are interleaved (sample i is domain i % D) so any prefix of the corpus is balanced.
    `domains` (default: all) keeps only those domains' streams; each domain has its own random
    stream, so a domain's samples are the same whichever other domains are drawn.
    """
    per_domain: list[list[Sample]] = []
    for domain in DOMAINS if domains is None else domains:
        gen = DOMAINS[domain]
        rng, samples = _rng(seed, domain, "train"), []
        while len(samples) < n_per_domain:
            prompt, answer = gen(rng)
            if prompt not in exclude:
                samples.append(Sample(domain, prompt, answer))
        per_domain.append(samples)
    return [samples[i] for i in range(n_per_domain) for samples in per_domain]


def make_split(n_train: int, n_test: int = 200, train_seed: int = TRAIN_SEED,
               domains: Iterable[str] | None = None) -> tuple[dict[str, list[Sample]], list[Sample]]:
    """The test sets (seed TEST_SEED) and the training corpus drawn with their prompts held out, as
    train.py draws them; `domains` restricts the training corpus only (see make_train_corpus)."""
    test_sets = make_test_sets(n_test, TEST_SEED)
    return test_sets, make_train_corpus(n_train, held_out_prompts(test_sets), train_seed, domains)


def check_disjoint(train: list[Sample], test_sets: dict[str, list[Sample]]) -> dict:
    """Re-verify that no test prompt occurs in the training corpus; returns a record for metrics."""
    train_prompts = {s.prompt for s in train}
    held_out = held_out_prompts(test_sets)
    overlap = len(train_prompts & held_out)
    record = {
        "train_examples": len(train),
        "train_unique_prompts": len(train_prompts),
        "test_examples": sum(len(v) for v in test_sets.values()),
        "test_prompts_in_train": overlap,
        "disjoint": overlap == 0,
    }
    if overlap:
        raise AssertionError(f"{overlap} test prompts occur in the training corpus: {record}")
    return record


if __name__ == "__main__":
    tests = make_test_sets()
    train = make_train_corpus(2000, held_out_prompts(tests))
    for s in train[:16]:
        print(repr(s.text))
    print(check_disjoint(train, tests))
