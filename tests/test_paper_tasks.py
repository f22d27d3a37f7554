"""The paper's generative task variants (tasks/paper/, experiments/paper_tasks.py), offline."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_committed_cmmlu_gen_is_what_the_generator_writes_from_lm_evals_cmmlu(tmp_path):
    from experiments.paper_tasks import main

    main(tmp_path)
    fresh = {p.name: p.read_text() for p in (tmp_path / "cmmlu_gen").iterdir()}
    committed = {p.name: p.read_text() for p in (ROOT / "tasks/paper/cmmlu_gen").iterdir()}
    assert fresh == committed and len(fresh) == 67 + 2  # subjects, template, group


def test_cmmlu_gen_asks_by_generation_and_scores_the_first_letter(tmp_path):
    """The template on a local one-question dataset: the prompt, and an answer written in a sentence
    scored by its first A-D letter."""
    from lm_eval.api.instance import Instance
    from lm_eval.tasks import TaskManager

    data = tmp_path / "d.jsonl"
    data.write_text('{"Question": "1+1=?", "A": "1", "B": "2", "C": "3", "D": "4", "Answer": "B"}\n')
    (tmp_path / "t.yaml").write_text(
        f"include: {ROOT / 'tasks/paper/cmmlu_gen/_template_yaml'}\ntask: cg_local\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n    dev: {data}\n")
    task = TaskManager(include_path=str(tmp_path), include_defaults=False).load(["cg_local"])["tasks"]["cg_local"]
    doc = next(iter(task.test_docs()))
    assert task.OUTPUT_TYPE == "generate_until"
    assert task.doc_to_text(doc).endswith("D. 4\n答案：") and task.doc_to_target(doc) == "B"
    scores = {}
    for reply in (" 答案是 B。", "C"):
        inst = Instance(request_type="generate_until", doc=doc, arguments=("", {}), idx=0)
        inst.resps = [reply]
        for f in task._filters:
            f.apply([inst])
        scores[reply] = task.process_results(doc, [inst.filtered_resps["first-letter"]])["exact_match"]
    assert scores == {" 答案是 B。": 1.0, "C": 0.0}


@pytest.mark.slow  # indexes every lm-eval task (~15 s)
def test_task_paper_lists_only_generative_tasks_lm_eval_knows():
    import yaml
    from lm_eval.tasks import TaskManager

    cfg = yaml.safe_load((ROOT / "conf/task/paper.yaml").read_text())["task"]
    known = TaskManager(include_path=str(ROOT / cfg["include_path"])).all_tasks
    assert all(t in known for t in cfg["tasks"])
    assert "boolq" not in cfg["tasks"] and "cmmlu" not in cfg["tasks"]
