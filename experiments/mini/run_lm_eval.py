"""Score a checkpoint on the offline lm-eval tasks in tasks/mini (the wiring run.py relies on).

    HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 python -m experiments.mini.run_lm_eval --model models/mini
    python -m experiments.mini.run_lm_eval --tasks mini_add --limit 8      # quick wiring check

With --write, the per-task exact match is stored under "lm_eval" in <model>/metrics.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(model_dir: str, tasks: list[str], limit: int | None, batch_size: int = 16, device: str = "cpu") -> dict:
    """Returns {task: exact_match} for every task and group lm-eval reports."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir).to(device).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=batch_size, device=device)
    res = simple_evaluate(
        model=lm,
        tasks=tasks,
        num_fewshot=0,
        limit=limit,
        task_manager=TaskManager(include_path=str(REPO / "tasks" / "mini")),
        log_samples=False,
    )
    return {name: r["exact_match,none"] for name, r in res["results"].items() if "exact_match,none" in r}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/mini")
    ap.add_argument("--tasks", nargs="+", default=["mini"])
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--write", action="store_true", help="store the scores in <model>/metrics.json")
    args = ap.parse_args()
    t0 = time.time()
    scores = run(args.model, args.tasks, args.limit, device=args.device)
    print(json.dumps(scores, indent=2), f"\n{time.time() - t0:.0f} s")
    if args.write:
        path = Path(args.model) / "metrics.json"
        metrics = json.loads(path.read_text())
        metrics["lm_eval"] = {"exact_match": {k: round(v, 4) for k, v in scores.items()}, "limit": args.limit}
        path.write_text(json.dumps(metrics, indent=2) + "\n")


if __name__ == "__main__":
    main()
