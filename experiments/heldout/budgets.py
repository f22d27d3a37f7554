"""The pre-registered budgets of one held-out model (docs/preregistration_heldout.md), from its dense
run on the pool: U = the mean union per MoE layer and decode step (report.json's summary.union_mean);
tight, middle, loose = round(0.25 U), round(0.375 U), round(0.5 U), each at least 2, a level equal
to the one below it raised by one (Python's round: a half goes to the even neighbour).

    python -m experiments.heldout.budgets <the dense run's folder>     # prints "6,9,12"
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

SHARES = (0.25, 0.375, 0.5)


def budgets(union_mean: float) -> list[int]:
    if not union_mean > 0:
        raise ValueError(f"the dense union must be positive, got {union_mean}")
    out: list[int] = []
    for share in SHARES:
        m = max(2, round(share * union_mean))
        if out and m <= out[-1]:
            m = out[-1] + 1
        out.append(m)
    return out


def main(run_dir: str) -> None:
    report = Path(run_dir) / "report.json"
    if not report.is_file():
        raise SystemExit(f"error: {report} does not exist (run the model's dense run first)")
    rep = json.loads(report.read_text())
    if rep.get("method") != "dense":
        raise SystemExit(f"error: {run_dir} is a run of {rep.get('method')!r}; the budgets come from the dense run")
    print(",".join(str(m) for m in budgets(float(rep["summary"]["union_mean"]))))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m experiments.heldout.budgets <the dense run's folder>")
    main(sys.argv[1])
