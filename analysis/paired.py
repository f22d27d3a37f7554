"""Paired comparison of two evaluate runs over the same prompts (reads their samples.jsonl).

    python -m analysis.paired outputs/<exp>/<run A> outputs/<exp>/<run B>

Both must be finished evaluate runs (report.json) of one model through one decode engine
(analysis/engines.py): two models, or one rule's run against another's through another engine
(static against continuous batching), would pair what differs in more than the rule, and are refused
(exit 2). Two runs that are one decode (one the copy of the other: a dense sweep point, report.json
`reused_from`) are compared as asked, with a warning that this compares a run with itself.

Per-request records are joined on (task, doc_id); the prompts must be the same (prompt hashes are
compared). Requests only one run holds are left out, with a warning giving the paired n and how
many of each run's went unpaired (a run stopped early, a truncated file). A samples.jsonl line that
does not parse is an error naming the file. Reported: accuracy of each run, the difference A - B with Tango's score 95 % interval,
the discordant counts (A right and B wrong, and the reverse), the exact McNemar p-value, the
equivalence (TOST) p against a 1-point margin (reported, not a call: stats.TIE_METRICS) and the call
(analysis/stats.py): "A higher" or "B higher" where McNemar rejects, else "inconclusive". One
comparison is its own family; a grid of them is corrected together by analysis/ablation.py.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from analysis import stats as S
from analysis.engines import engine_of
from analysis.load import _config, fail, read_jsonl, read_report, warn


def check_pair(run_a: str | Path, run_b: str | Path) -> None:
    """Exit 2 unless both are finished evaluate runs of one model through one decode engine."""
    seen = {}
    for run in (Path(run_a), Path(run_b)):
        if not run.is_dir():
            fail(f"{run}: no such run folder")
        if not (run / "report.json").exists():
            fail(f"{run} is not a finished run (no report.json: killed or unfinished); rerun it")
        report = read_report(run / "report.json")
        if report.get("stage") != "evaluate":
            fail(f"{run} is a stage={report.get('stage')} run; a paired comparison reads two evaluate runs")
        seen[run] = (report.get("model"), engine_of(report, _config(run)))
    (a, (model_a, engine_a)), (b, (model_b, engine_b)) = seen.items()
    if model_a != model_b:
        fail(f"{a} evaluates {model_a} and {b} {model_b}: a paired comparison of rules needs one model")
    if engine_a != engine_b:
        fail(f"{a} decoded through engine {engine_a} and {b} through {engine_b} (analysis/engines.py): their "
             "difference would mix the engines' with the rules'; compare runs of one engine")


def load_samples(run_dir: str | Path) -> pd.DataFrame:
    path = Path(run_dir) / "samples.jsonl"
    if not path.exists():
        fail(f"{path} is missing: the run predates per-request records; rerun it (force=true)")
    df = read_jsonl(path)
    missing = [c for c in ("task", "doc_id", "prompt_hash", "correct") if c not in df]
    if missing:
        fail(f"{path} has no {', '.join(missing)} (empty, or written before per-request records held them); "
             "rerun the run (force=true)")
    return df


def paired(a: pd.DataFrame, b: pd.DataFrame) -> dict[str, float | int | str]:
    """Compare run A with run B on the requests both hold (correct: 1 right, 0 wrong)."""
    keys = ["task", "doc_id"]
    j = a[[*keys, "prompt_hash", "correct"]].merge(b[[*keys, "prompt_hash", "correct"]], on=keys,
                                                   suffixes=("_a", "_b"))
    if len(j) == 0:
        raise ValueError("the two runs share no (task, doc_id) requests")
    held_a, held_b = set(zip(a["task"], a["doc_id"])), set(zip(b["task"], b["doc_id"]))
    unpaired_a, unpaired_b = len(held_a - held_b), len(held_b - held_a)
    if unpaired_a or unpaired_b:
        warn(f"paired n={len(j)}: {unpaired_a} of A's {len(held_a)} requests and {unpaired_b} of B's {len(held_b)} "
             "have no match in the other run and are left out")
    if (j["prompt_hash_a"] != j["prompt_hash_b"]).any():
        raise ValueError("the runs' prompts differ for the same (task, doc_id): not a paired comparison")
    ca, cb = j["correct_a"].to_numpy(float), j["correct_b"].to_numpy(float)
    c = S.paired_accuracy(ca, cb)
    call = S.call(c.diff, c.p, c.p_tost, "accuracy")
    call = {"higher": "A higher", "lower": "B higher"}.get(call, call)
    return {"n": c.n, "acc_a": float(ca.mean()), "acc_b": float(cb.mean()), "diff": c.diff, "ci_low": c.low,
            "ci_high": c.high, "a_only": c.a_only, "b_only": c.b_only, "mcnemar_p": c.p, "tost_p": c.p_tost,
            "margin": c.margin, "call": call, "unpaired_a": unpaired_a, "unpaired_b": unpaired_b}


def copy_note(run_a: str | Path, run_b: str | Path) -> str | None:
    """Where one run is the other's copy (report.json `reused_from`: a dense sweep point that took a
    sibling's outputs, base/run/dense_reuse.py) or both copy one run: they are one decode, and their
    comparison is a run against itself."""
    src = {}
    for run in (Path(run_a), Path(run_b)):
        report = read_report(run / "report.json") if (run / "report.json").exists() else {}
        src[run] = (report or {}).get("reused_from") or run.name
    a, b = src.values()
    return (f"{Path(run_a).name} and {Path(run_b).name} are one decode ({a}'s outputs, copied: "
            f"report.json reused_from): this compares a run with itself") if a == b else None


if __name__ == "__main__":
    if len(sys.argv) != 3:
        fail("usage: python -m analysis.paired <run A> <run B>")
    check_pair(sys.argv[1], sys.argv[2])
    if note := copy_note(sys.argv[1], sys.argv[2]):
        warn(note)
    try:
        res = paired(load_samples(sys.argv[1]), load_samples(sys.argv[2]))
    except ValueError as e:
        fail(str(e))
    for k, v in res.items():
        print(f"{k:>10}: {v:.4f}" if isinstance(v, float) else f"{k:>10}: {v}")
