"""Every config group composes; invalid values fail at start with the valid choices or range."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import MissingConfigException

import run
from base.config import ConfigError
from base.hf.loading import num_experts

ROOT = Path(__file__).resolve().parents[1]


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))


@pytest.mark.parametrize("group", ["model", "method", "task", "logger"])
@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_every_option_composes_and_validates(compose, group, tmp_path):
    for option in _options(group):
        cfg = compose([f"{group}={option}"])
        rc = run.build_config(cfg, tmp_path)
        assert getattr(rc, group).name == option


@pytest.mark.slow
def test_experiments_compose(compose, tmp_path):
    for option in _options("experiment"):
        run.build_config(compose([f"experiment={option}"]), tmp_path)


@pytest.mark.parametrize(
    "override, message",
    [
        ("budget=0", "budget=0 is out of range: must be >= 1 or null"),
        ("batch_size=0", "batch_size=0 is out of range"),
        ("stage=train", "stage='train' is not valid; choose one of: calibrate, fit, evaluate, throughput, describe"),
        ("method.reassign=swap", "method.reassign='swap' is not valid; choose one of: backfill, drop"),
        ("eval.order=sorted", "eval.order='sorted' is not valid; choose one of: mixed, lm_eval"),
        ("eval.engine=maybe", "eval.engine='maybe' is not valid; choose one of: auto, on, off"),
        ("throughput.methods=[bogus]", "throughput.methods[]='bogus' is not valid; choose one of: dense,"),
        ("throughput.methods=[oea]", "oea needs its k0, e.g. oea:1"),
        ("throughput.budgets=[0]", "throughput.budgets[0]=0 is out of range: must be >= 1"),
        ("throughput.batch_sizes=[]", "throughput.batch_sizes is empty"),
        ("throughput.timed_steps=400", "throughput.timed_steps=400 is out of range: must be [1, 383]"),
        ("model.routing=skewed", "model.routing=skewed applies to random-weight models (model.init=random) only"),
        ("model.routing=zipf", "model.routing='zipf' is not valid; choose one of: uniform, skewed"),
    ],
)
def test_invalid_values_fail_with_valid_choices(compose, tmp_path, override, message):
    with pytest.raises(ConfigError) as err:
        run.build_config(compose([override]), tmp_path)
    assert message in str(err.value)


def test_throughput_budget_above_the_experts_fails_before_loading(compose, tmp_path):
    rc = run.build_config(compose(["model=qwen3_30b", "model.init=random", "stage=throughput",
                                   "throughput.budgets=[16,200]"]), tmp_path)
    with pytest.raises(ConfigError, match="throughput.budgets has 200, above the 128 experts of qwen3_30b"):
        rc.check_budget(128)


def test_unknown_method_lists_selectors(compose, tmp_path):
    cfg = compose(["method=router_sum"])
    cfg.method.name = "magic"
    with pytest.raises(ConfigError) as err:
        run.build_config(cfg, tmp_path)
    for name in ("dense", "router_sum", "base", "oracle", "oea", "calib_freq"):
        assert name in str(err.value)


@pytest.mark.parametrize("group", ["model", "method", "task"])
def test_unknown_group_option_names_valid_choices(compose, group):
    with pytest.raises(MissingConfigException) as err:
        compose([f"{group}=nope"])
    for option in _options(group)[:3]:
        assert option in str(err.value)


def test_budget_above_expert_count_fails(compose, tmp_path):
    rc = run.build_config(compose(["model=qwen3_30b", "model.init=random", "budget=300"]), tmp_path)
    assert num_experts(rc.model, ROOT) == 128
    with pytest.raises(ConfigError, match="budget=300 exceeds the 128 experts of qwen3_30b; choose 1..128"):
        rc.check_budget(num_experts(rc.model, ROOT))


def test_dense_ignores_budget(compose, tmp_path):
    assert run.build_config(compose(["method=dense", "budget=8"]), tmp_path).budget is None


def test_missing_pretrained_weights_fail_with_a_way_out(compose, tmp_path):
    rc = run.build_config(compose(["model=qwen3_30b", "model.path=/nonexistent/qwen3"]), tmp_path)
    with pytest.raises(ConfigError, match="model.path at a local checkpoint directory, or use model.init=random"):
        num_experts(rc.model, ROOT)


def test_calibration_files_on_the_command_line_beat_the_models_own(compose, tmp_path):
    own = run.build_config(compose(["model=mini"]), tmp_path)
    assert own.calibration.files == ["data/calibration/mini.jsonl"]  # mini's calib_files
    override = "calibration.files=[data/calibration/stdlib.txt]"
    given = run.build_config(compose(["model=mini", override]), tmp_path, overrides=override)
    assert given.calibration.files == ["data/calibration/stdlib.txt"]


def test_the_schema_is_run_config_s_keys(compose, tmp_path):
    """RunSchema (Hydra's typed schema) is made from RunConfig: the same keys in the same order,
    each group typed by its dataclass, plus run.py's folder keys; a group added to RunConfig is
    composed, typed and built without a second list."""
    import dataclasses
    import typing

    from base.config import RunConfig, config_fields

    schema = typing.get_type_hints(run.RunSchema)
    assert [k for k in schema if k not in {k for k, _, _ in run.FOLDER_KEYS}] == [k for _, k, _ in config_fields()]
    assert schema["eval"] is not None and dataclasses.is_dataclass(schema["scheduler"]) and schema["exp_name"] is str
    built = run.build_config(compose(["model=tiny_qwen3", "exp_name=named"]), tmp_path)
    assert built.experiment == "named" and built.out_dir == tmp_path and built.root == ROOT
    filled = {f.name for f in dataclasses.fields(RunConfig) if f.metadata.get("filled")}
    assert filled == {"out_dir", "root", "overrides", "run_key", "started"}
    with pytest.raises(ConfigError, match="Value 'maybe' is not a valid bool"):  # typed: composition refuses it
        run.check_composition(["scheduler.overlap=maybe"])
