"""Generative variants of the paper's multiple-choice tasks, written as lm-eval task YAMLs.

    python -m experiments.paper_tasks        # writes tasks/paper/ (needs only lm-eval installed)

A budget changes decode steps only, so a task scored by log-likelihood ranks every method equal to
dense. The paper evaluated generation. lm-eval ships `boolq-seq2seq` (used as is by task=paper);
for cmmlu it has none, so this writes `cmmlu_gen`: the same 67 subjects, datasets, prompts and
descriptions as lm-eval's `cmmlu` (read from the installed package), asking for the answer's
letter by generation (stop at a newline) and scoring the first A-D letter of the answer by exact
match.
"""
from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tasks" / "paper"

TEMPLATE = {
    "dataset_path": "haonan-li/cmmlu",
    "test_split": "test",
    "fewshot_split": "dev",
    "fewshot_config": {"sampler": "first_n"},
    "output_type": "generate_until",
    "doc_to_text": "{{Question.strip()}}\nA. {{A}}\nB. {{B}}\nC. {{C}}\nD. {{D}}\n答案：",
    "doc_to_target": "{{Answer}}",
    "target_delimiter": "",
    "generation_kwargs": {"until": ["\n"]},
    "filter_list": [{"name": "first-letter", "filter": [
        {"function": "regex", "regex_pattern": "([ABCD])"}, {"function": "take_first"}]}],
    "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
    "metadata": {"version": 1.0},
}


def cmmlu_subjects() -> list[dict]:
    """lm-eval's own cmmlu subject configs (dataset_name, description, task name)."""
    import lm_eval.tasks

    folder = Path(lm_eval.tasks.__file__).parent / "cmmlu"
    return [yaml.safe_load(p.read_text()) for p in sorted(folder.glob("cmmlu_*.yaml"))]


def main(root: Path = OUT) -> None:
    out = root / "cmmlu_gen"
    out.mkdir(parents=True, exist_ok=True)
    (out / "_template_yaml").write_text(yaml.safe_dump(TEMPLATE, allow_unicode=True, sort_keys=False))
    names = []
    for subject in cmmlu_subjects():
        name = subject["task"].replace("cmmlu_", "cmmlu_gen_", 1)
        names.append(name)
        task = {"include": "_template_yaml", "task": name, "dataset_name": subject["dataset_name"],
                "description": subject.get("description", "")}
        (out / f"{name}.yaml").write_text(yaml.safe_dump(task, allow_unicode=True, sort_keys=False))
    group = {"group": "cmmlu_gen", "task": names,
             "aggregate_metric_list": [{"metric": "exact_match", "aggregation": "mean", "weight_by_size": True,
                                        "filter_list": "first-letter"}],
             "metadata": {"version": 1.0}}
    (out / "_cmmlu_gen.yaml").write_text(yaml.safe_dump(group, sort_keys=False))
    print(f"wrote {len(names)} cmmlu_gen subjects to {out}")


if __name__ == "__main__":
    main()
