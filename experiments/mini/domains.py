"""The eight synthetic domains of the "mini" model: one generator per domain.

Each generator draws one (prompt, answer) pair from a `random.Random`. Prompts start with a
domain-specific keyword and end with "="; the answer spans several characters (several decode
steps with the character-level tokenizer) and is followed by "\\n" in training text, which is the
stop sequence. Every domain's prompt space is large (>= 10^4), so a few hundred held-out test
prompts can be excluded from training without starving it.

    python -c "import random; from experiments.mini.domains import DOMAINS; \
print([g(random.Random(0)) for g in DOMAINS.values()])"
"""

from __future__ import annotations

import random
from collections.abc import Callable

Example = tuple[str, str]  # (prompt, answer); the model reads prompt and must emit answer + "\n"
Generator = Callable[[random.Random], Example]

COUNT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def gen_add(rng: random.Random) -> Example:
    """Multi-digit addition: 'add 384+57=' -> '441'."""
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    return f"add {a}+{b}=", str(a + b)


def gen_sort(rng: random.Random) -> Example:
    """Sort 4-6 distinct numbers below 100: 'sort 52 7 19=' -> '7 19 52'."""
    xs = rng.sample(range(100), rng.randint(4, 6))
    return f"sort {' '.join(map(str, xs))}=", " ".join(map(str, sorted(xs)))


def gen_rev(rng: random.Random) -> Example:
    """Reverse a 4-8 letter string: 'rev kqpzm=' -> 'mzpqk'."""
    s = "".join(rng.choice(LETTERS) for _ in range(rng.randint(4, 8)))
    return f"rev {s}=", s[::-1]


def gen_lookup(rng: random.Random) -> Example:
    """Key-value lookup in context: 'get q in a:417 q:052 z:339=' -> '052'."""
    keys = rng.sample(LETTERS, rng.randint(4, 6))
    vals = [f"{rng.randint(0, 999):03d}" for _ in keys]
    i = rng.randrange(len(keys))
    pairs = " ".join(f"{k}:{v}" for k, v in zip(keys, vals))
    return f"get {keys[i]} in {pairs}=", vals[i]


def gen_cmp(rng: random.Random) -> Example:
    """Compare two numbers, restating them: 'cmp 417 392=' -> '417>392'."""
    a = rng.randint(0, 999)
    # Why: equal and close pairs are rare under uniform sampling but are the hard cases.
    r = rng.random()
    b = a if r < 0.1 else (min(999, max(0, a + rng.randint(-9, 9))) if r < 0.4 else rng.randint(0, 999))
    rel = "<" if a < b else (">" if a > b else "=")
    return f"cmp {a} {b}=", f"{a}{rel}{b}"


def gen_count(rng: random.Random) -> Example:
    """Count a letter in a 5-10 letter string over 'abcd', answer in words: -> 'three'."""
    s = "".join(rng.choice("abcd") for _ in range(rng.randint(5, 10)))
    c = rng.choice("abcd")
    return f"count {c} in {s}=", COUNT_WORDS[s.count(c)]


def _balanced(rng: random.Random, pairs: int) -> str:
    """A uniformly-ish random balanced string of `pairs` bracket pairs (random walk kept >= 0)."""
    out, depth, opened = [], 0, 0
    while opened < pairs or depth > 0:
        can_open, can_close = opened < pairs, depth > 0
        if can_open and (not can_close or rng.random() < 0.5):
            out.append("(")
            depth, opened = depth + 1, opened + 1
        else:
            out.append(")")
            depth -= 1
    return "".join(out)


def _is_balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def gen_paren(rng: random.Random) -> Example:
    """Bracket matching over '()' with 2-4 letters mixed in: 'paren (a(b)c)=' -> 'yes'."""
    s = _balanced(rng, rng.randint(2, 5))
    if rng.random() < 0.5:
        # Why: negatives keep the counts equal half the time, so counting alone cannot solve it.
        if rng.random() < 0.5:
            chars = list(s)
            while _is_balanced("".join(chars)):
                rng.shuffle(chars)
            s = "".join(chars)
        else:
            i = rng.randrange(len(s))
            s = s[:i] + rng.choice("()") + s[i:]
    # Why: letters make the prompt space large (so test prompts can be held out) without
    # changing what decides the answer.
    for _ in range(rng.randint(2, 4)):
        i = rng.randrange(len(s) + 1)
        s = s[:i] + rng.choice(LETTERS) + s[i:]
    return f"paren {s}=", "yes" if _is_balanced(s) else "no"


UNITS = [("km", "m", 1000), ("m", "cm", 100), ("cm", "mm", 10), ("kg", "g", 1000), ("l", "ml", 1000)]


def gen_unit(rng: random.Random) -> Example:
    """Power-of-ten unit conversion, both ways: 'unit 47 km to m=' -> '47000'."""
    big, small, factor = rng.choice(UNITS)
    v = rng.randint(1, 999)
    if rng.random() < 0.5:
        return f"unit {v} {big} to {small}=", str(v * factor)
    return f"unit {v * factor} {small} to {big}=", str(v)


DOMAINS: dict[str, Generator] = {
    "add": gen_add,
    "sort": gen_sort,
    "rev": gen_rev,
    "lookup": gen_lookup,
    "cmp": gen_cmp,
    "count": gen_count,
    "paren": gen_paren,
    "unit": gen_unit,
}
