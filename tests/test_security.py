"""A checkpoint's own code and model-written code run only when their switch is the boolean true.

Crafted inputs: a local checkpoint whose config names a custom class (transformers' `auto_map`)
in a module that writes a marker file when imported, and a task whose scoring function (called
only once generations exist) writes a marker. With the switch off, or `no`, nothing runs (no
marker), and the run is refused at start with nothing written."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import run
from base.checks import ConfigError
from base.run.preflight import preflight

FAST = ["model=tiny_qwen3", "task=smoke", "logger=none"]


def assert_refused_at_start(compose, tmp: Path, overrides: list[str], match: str, marker: Path) -> None:
    """The run with `overrides` is refused by preflight, before the crafted code runs or anything is written."""
    rc = run.build_config(compose([*FAST, *overrides]), tmp / "out")
    with pytest.raises(ConfigError, match=match):
        preflight(rc)
    assert not marker.exists() and not (tmp / "out").exists()


def evil_checkpoint(tmp: Path) -> tuple[Path, Path]:
    ckpt, marker = tmp / "ckpt", tmp / "remote_code_ran"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({
        "model_type": "evil", "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"}}))
    (ckpt / "configuration_evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import PretrainedConfig\n\nclass EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n")
    return ckpt, marker


@pytest.mark.parametrize("switch", ["false", "no", "off"])
def test_a_checkpoints_code_does_not_run_unless_trusted(compose, tmp_path, switch):
    ckpt, marker = evil_checkpoint(tmp_path)
    assert_refused_at_start(compose, tmp_path, ["model.init=pretrained", f"model.path={ckpt}", "model.tokenizer=bytes",
                                                f"model.trust_remote_code={switch}"],
                            "asks to run its own Python code", marker)


def test_a_trusted_checkpoints_code_runs(compose, tmp_path):
    """The other side: `true` is what lets it run (so the test above can fail)."""
    ckpt, marker = evil_checkpoint(tmp_path)
    cfg = compose([*FAST, "model.init=pretrained", f"model.path={ckpt}", "model.tokenizer=bytes",
                   "model.trust_remote_code=true"])
    with pytest.raises(Exception):  # noqa: B017 - the crafted class is no model; what matters is the marker
        preflight(run.build_config(cfg, tmp_path / "out"))
    assert marker.exists()


def code_task(tmp: Path) -> tuple[list[str], Path]:
    tasks, marker = tmp / "tasks", tmp / "model_code_ran"
    tasks.mkdir()
    (tasks / "data.jsonl").write_text('{"question": "copy ab =", "answer": "ab"}\n')
    (tasks / "utils.py").write_text(
        "import datasets, json, pathlib\nHERE = pathlib.Path(__file__).parent\n"
        "def load_split(**_):\n    rows = [json.loads(l) for l in (HERE / 'data.jsonl').read_text().splitlines()]\n"
        "    return datasets.DatasetDict({'test': datasets.Dataset.from_list(rows)})\n"
        f"def process(doc, results):\n    open({str(marker)!r}, 'w').write(results[0])\n    return {{'exact_match': 0.0}}\n")
    (tasks / "code.yaml").write_text(
        "task: crafted_code\nunsafe_code: true\ncustom_dataset: !function utils.load_split\ntest_split: test\n"
        "output_type: generate_until\ndoc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n"
        "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 3\nprocess_results: !function utils.process\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\nmetadata:\n  version: 1.0\n")
    return [f"task.include_path={tasks}", "task.tasks=[crafted_code]", "method=dense"], marker


@pytest.mark.parametrize("switch", ["false", "no"])
def test_model_written_code_is_not_run_unless_confirmed(compose, tmp_path, switch):
    overrides, marker = code_task(tmp_path)
    assert_refused_at_start(compose, tmp_path, [*overrides, f"eval.confirm_unsafe_code={switch}"],
                            "execute model-written code", marker)


def test_confirmed_model_written_code_runs(compose, tmp_path):
    from omegaconf import OmegaConf

    from base.run.pipeline import run as run_pipeline

    overrides, marker = code_task(tmp_path)
    cfg = compose([*FAST, *overrides, "eval.confirm_unsafe_code=yes", f"artifacts_dir={tmp_path}/a"])
    run_pipeline(run.build_config(cfg, tmp_path / "out"), OmegaConf.to_yaml(cfg, resolve=True))
    assert marker.exists()
