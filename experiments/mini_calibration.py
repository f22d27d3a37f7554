"""Calibration text for the mini model: its training distribution, never its test prompts.

    python -m experiments.mini_calibration   # writes data/calibration/mini.jsonl

Drawn with its own seed (not the training corpus's), interleaved across domains, one example per line.
"""
from __future__ import annotations

import json
from pathlib import Path

from experiments.mini.data import make_test_sets, make_train_corpus, test_prompts

ROOT = Path(__file__).resolve().parents[1]
SEED = 7


def main(n_per_domain: int = 300) -> None:
    samples = make_train_corpus(n_per_domain, exclude=test_prompts(make_test_sets()), seed=SEED)
    out = ROOT / "data/calibration/mini.jsonl"
    out.write_text("".join(json.dumps({"domain": s.domain, "text": s.text}) + "\n" for s in samples))
    print(f"wrote {len(samples)} examples to {out}")


if __name__ == "__main__":
    main()
