"""General calibration text for real models: prose, code and math interleaved, from material that
ships offline.

    python -m experiments.general_calibration   # writes data/calibration/general.jsonl

  prose  the Python documentation's topic texts (pydoc_data.topics, in every CPython install)
  code   Python standard-library source (data/calibration/stdlib.txt), cut at function boundaries
  math   word problems and equations with worked solutions, generated with a fixed seed
One short document per line, kinds in turn, so any prefix (calibration reads the first
`calibration.num_tokens` tokens) mixes all three. `calibration.files=` still takes users' own data.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data/calibration/general.jsonl"
SEED = 11
CHUNK = 700  # characters per prose / code document


def prose_docs() -> list[str]:
    from pydoc_data.topics import topics

    docs = []
    for name in sorted(topics):
        paras = [p.strip() for p in topics[name].split("\n\n") if len(p.strip()) > 200 and not p.startswith(" ")]
        docs += [p[:CHUNK] for p in paras[:3]]
    return docs


def code_docs() -> list[str]:
    text = (ROOT / "data/calibration/stdlib.txt").read_text()
    parts = ["def " + p for p in text.split("\ndef ")[1:]]
    return [p[:CHUNK] for p in parts if len(p) > 200]


def math_docs(n: int, rng: random.Random) -> list[str]:
    docs = []
    for i in range(n):
        a, b, c = rng.randint(2, 12), rng.randint(1, 50), rng.randint(2, 9)
        x = rng.randint(1, 30)
        if i % 3 == 0:
            docs.append(f"Solve {a}x + {b} = {a * x + b}. Subtract {b} from both sides: {a}x = {a * x}. "
                        f"Divide by {a}: x = {x}.")
        elif i % 3 == 1:
            price, qty, paid = rng.randint(3, 40), rng.randint(2, 9), 0
            paid = price * qty + rng.randint(1, 50)
            docs.append(f"A notebook costs ${price}. Sam buys {qty} notebooks and pays with ${paid}. "
                        f"The notebooks cost {qty} * {price} = ${price * qty}, so the change is "
                        f"{paid} - {price * qty} = ${paid - price * qty}.")
        else:
            docs.append(f"The area of a rectangle with sides {a} and {c} is {a} * {c} = {a * c}; its perimeter "
                        f"is 2 * ({a} + {c}) = {2 * (a + c)}. A circle of radius {c} has area pi * {c}^2 = "
                        f"{3.14159 * c * c:.2f}.")
    return docs


def build(seed: int = SEED) -> list[dict[str, str]]:
    rng = random.Random(seed)
    prose, code = prose_docs(), code_docs()
    rng.shuffle(prose)
    rng.shuffle(code)
    n = min(len(prose), len(code), 120)
    maths = math_docs(n, rng)
    rows = []
    for p, c, m in zip(prose[:n], code[:n], maths):
        rows += [{"kind": "prose", "text": p}, {"kind": "code", "text": c}, {"kind": "math", "text": m}]
    return rows


def main() -> None:
    rows = build()
    OUT.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {OUT} ({len(rows)} documents, {OUT.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
