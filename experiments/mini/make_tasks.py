"""Write the offline lm-eval tasks of the "mini" model into tasks/mini/.

One task per domain (`mini_<domain>`: <domain>.yaml + <domain>.jsonl holding the held-out test
split), a shared template and the group `mini` (per-task and unweighted mean exact match). The
JSONL rows are exactly `make_test_sets()`, so lm-eval and experiments.mini.evaluate score the same
examples.

    python -m experiments.mini.make_tasks            # rewrites tasks/mini/
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from experiments.mini.data import STOP, TEST_SEED, make_test_sets
from experiments.mini.domains import DOMAINS

MAX_GEN_TOKS = 24  # longest answer is 17 characters (sort), one token each, plus the stop

TEMPLATE = f"""\
# Shared by every mini_<domain> task (written by experiments/mini/make_tasks.py).
# The test split is read by utils.load_split from the JSONL beside this file, so the tasks work
# from any working directory and need no network or datasets cache.
output_type: generate_until
test_split: test
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: ""
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: {MAX_GEN_TOKS}
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: false
    ignore_punctuation: false
metadata:
  version: 1.0
"""

TASK = """\
include: _template.yaml
task: mini_{domain}
custom_dataset: !function utils.load_split
dataset_kwargs:
  domain: {domain}
"""

GROUP = """\
group: mini
task: [{tasks}]
aggregate_metric_list:
  - metric: exact_match
    aggregation: mean
    weight_by_size: false
metadata:
  version: 1.0
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="tasks/mini")
    ap.add_argument("--n", type=int, default=200, help="test examples per domain")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for domain, samples in make_test_sets(args.n, TEST_SEED).items():
        rows = [{"prompt": s.prompt, "answer": s.answer, "domain": domain} for s in samples]
        (out / f"{domain}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (out / f"{domain}.yaml").write_text(TASK.format(domain=domain))
    (out / "_template.yaml").write_text(TEMPLATE)
    (out / "mini.yaml").write_text(GROUP.format(tasks=", ".join(f"mini_{d}" for d in DOMAINS)))
    assert STOP == "\n", "the template's `until` assumes the newline stop"
    print(f"wrote {len(DOMAINS)} tasks x {args.n} examples to {out}")


if __name__ == "__main__":
    main()
