"""Property test of the run schema (issue 28): an override drawn from a key's type, from outside its
range, from another type, a group option or a deletion either makes a run that passes validation
or is refused with a ConfigError (run.py prints it and exits 2), never another exception (which
run.py would show as a traceback).

    fast tier   validation only, as run.py's start does it: the launcher environment, the command
                line, composition (check_composition), the typed RunConfig and preflight (no weights
                load); a fixed, derandomised set of examples over the cheap groups
    slow        many more examples over every group, and drawn command lines through run.py end to
                end on the tiny model: exit code 0 or 2, never a traceback

The keys and their types are read from run.RunSchema, so a key added to the schema is drawn too.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import run
from base import config as C
from base.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
BASE = ["model=tiny_qwen3", "task=smoke", "logger=none"]


def schema_keys(schema: type = run.RunSchema, prefix: str = "") -> dict[str, object]:
    """Every leaf key of the schema -> its type (nested dataclasses are walked)."""
    hints = typing.get_type_hints(schema)
    keys: dict[str, object] = {}
    for f in dataclasses.fields(schema):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            keys.update(schema_keys(t, f"{prefix}{f.name}."))
        else:
            keys[prefix + f.name] = t
    return keys


KEYS = schema_keys()


def _choices() -> dict[str, tuple[str, ...]]:
    from base.hf.families import FAMILIES
    from base.method.routing import REASSIGN_MODES, RENORMALIZE_MODES
    from base.method.selectors import SELECTORS

    return {"model.init": C.INITS, "model.dtype": C.DTYPES, "model.device": C.DEVICES, "model.routing": C.ROUTINGS,
            "model.device_map": C.DEVICE_MAPS, "model.family": tuple(FAMILIES.names()),
            "model.experts_impl": ("eager", "grouped_mm", "batched_mm", "base_triton"),
            "method.name": ("dense", *SELECTORS.names()), "method.reassign": REASSIGN_MODES,
            "method.renormalize": RENORMALIZE_MODES, "method.apply_to": C.APPLY_TO, "method.backend": ("torch", "triton"),
            "method.budget_split": ("uniform", "sensitivity"), "predictor.fit_on": ("routed", "all"),
            "eval.order": C.EVAL_ORDERS, "eval.engine": ("auto", "on", "off"), "eval.batching": C.BATCHINGS,
            "scheduler.admission": C.ADMISSIONS, "throughput.mode": C.THROUGHPUT_MODES,
            "stage": C.STAGES, "logger.name": ("wandb", "none"), "logger.mode": ("offline", "disabled"),
            "throughput.methods": ("dense", "router_sum", "oea:1", "oea", "base:2", "dense:eager", "dense:fast", "x:")}


CHOICES = _choices()
# Keys naming files and folders: drawn from a table of paths (made per example) instead of text.
PATHS = {"outputs_dir", "artifacts_dir", "logger.dir", "predictor.path", "stream.lengths_from", "calibration.files",
         "model.path", "model.tokenizer", "task.include_path", "model.calib_files"}
NAMES = {"exp_name", "model.name", "task.name", "logger.project"}
ARCH = ("num_experts", "num_experts_per_tok", "hidden_size", "num_attention_heads", "num_key_value_heads",
        "max_position_embeddings", "num_hidden_layers", "vocab_size", "head_dim", "moe_intermediate_size")

ints = st.one_of(st.integers(-3, 40), st.sampled_from([2**31, 2**32, 2**63, -(2**63), 10**30]))
floats = st.one_of(st.floats(-2, 200, allow_nan=False).map(lambda x: f"{x:.4g}"),
                   st.sampled_from(["nan", "inf", "-inf", "1e300", "1e-300", "0", "-0.0"]))
words = st.text(alphabet="abcxyz_0123456789", min_size=1, max_size=8)
junk = st.sampled_from(["abc", "''", "[]", "{}", "[1,2]", "null", "-1", "1.5", "true", "~"])


def _path_values(tmp: Path) -> list[str]:
    (tmp / "a_dir").mkdir(exist_ok=True)
    (tmp / "a_file").write_text("not what any key expects\n")
    (tmp / "rows.jsonl").write_text('{"text": "some calibration text"}\n[1, 2]\n')
    return [str(tmp / "nowhere" / "x"), str(tmp / "a_dir"), str(tmp / "a_file"), str(tmp / "a_file" / "below"),
            str(tmp / "rows.jsonl"), "models/mini", "none", "bytes"]


def _scalar(t: object, key: str, paths: list[str]) -> st.SearchStrategy[str]:
    args = typing.get_args(t)
    optional = type(None) in args
    inner = [a for a in args if a is not type(None)] if args and typing.get_origin(t) is not list else [t]
    base = inner[0] if len(inner) == 1 else t
    if key in PATHS:
        one = st.sampled_from(paths)
        s = one.map(lambda p: f"[{p}]") if typing.get_origin(base) is list else one
    elif key in NAMES:
        s = words
    elif typing.get_origin(base) is list:
        (item,) = typing.get_args(base)
        item_s = (st.sampled_from(CHOICES[key]) if key in CHOICES else
                  ints.map(str) if item is int else floats if item is not str else words)
        s = st.lists(item_s, max_size=3).map(lambda xs: "[" + ",".join(xs) + "]")
    elif typing.get_origin(base) is dict:
        s = st.just("{}")
    elif key in CHOICES:
        s = st.one_of(st.sampled_from(CHOICES[key]), words)
    elif base is bool:
        s = st.sampled_from(["true", "false", "yes", "no", "on", "maybe", "2"])
    elif base is int:
        s = ints.map(str)
    elif base is float:
        s = floats
    else:
        s = words
    return st.one_of(s, junk, st.just("null")) if optional else st.one_of(s, junk)


def override(paths: list[str], groups: dict[str, list[str]]) -> st.SearchStrategy[str]:
    """One override: a schema key with a drawn value, an architecture number, a group option or a deletion."""
    keyed = st.sampled_from(sorted(KEYS)).flatmap(lambda k: _scalar(KEYS[k], k, paths).map(lambda v, k=k: f"{k}={v}"))
    arch = st.tuples(st.sampled_from(ARCH), ints).map(lambda kv: f"model.arch.{kv[0]}={kv[1]}")
    group = st.sampled_from([f"{g}={o}" for g, opts in groups.items() for o in opts] +
                            ["model=null", "method=nope", "task=null"])
    deletion = st.sampled_from(sorted(KEYS) + ["model", "eval", "throughput"]).map(lambda k: f"~{k}")
    return st.one_of(keyed, keyed, keyed, arch, group, deletion)


def validate(argv: list[str], tmp: Path) -> str:
    """run.py's start for `argv`, as far as it goes without loading weights: "ok" or the ConfigError."""
    try:
        run.check_launcher_env()
        run.check_command_line(argv)
        run.check_composition(argv)
        from hydra import compose, initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        from base.run.preflight import preflight

        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = compose(config_name="config", overrides=argv)
        preflight(run.build_config(cfg, tmp / "out", ",".join(argv)))
    except ConfigError as err:
        return f"refused: {err}"
    return "ok"


CHEAP_GROUPS = {"model": ["tiny_qwen3", "tiny_olmoe", "mini"], "task": ["smoke", "mini_smoke"],
                "method": [p.stem for p in (ROOT / "conf/method").glob("*.yaml")], "logger": ["none", "wandb"]}


def _check(data, tmp: Path, groups: dict[str, list[str]], most: int) -> None:
    draws = data.draw(st.lists(override(_path_values(tmp), groups), min_size=1, max_size=most), label="overrides")
    argv = [*BASE, f"artifacts_dir={tmp}/artifacts", f"outputs_dir={tmp}/outputs", *draws]
    outcome = validate(argv, tmp)  # any exception but a ConfigError fails the test, naming the draws
    hypothesis.event(outcome.split(":")[0])  # --hypothesis-show-statistics: how many pass, how many are refused
    assert outcome == "ok" or outcome.startswith("refused: ")
    assert not (tmp / "out").exists()  # validation never writes the run folder


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_drawn_overrides_validate_or_fail_with_a_config_error(data, scratch):
    _check(data, scratch, CHEAP_GROUPS, most=3)


ALL_GROUPS = {g: [p.stem for p in (ROOT / "conf" / g).glob("*.yaml")] for g in ("model", "task", "method", "logger")}


@pytest.mark.slow
@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_drawn_overrides_over_every_group_validate_or_fail_with_a_config_error(data, scratch):
    _check(data, scratch, ALL_GROUPS, most=4)


# End to end: small values only, so that a run that passes validation finishes in seconds on a CPU.
E2E = [*BASE, "task.limit=4", "calibration.num_tokens=2048", "throughput.batch_sizes=[2]", "throughput.gen_tokens=6",
       "throughput.prompt_len=8", "throughput.warmup=0", "throughput.stats_steps=2", "throughput.profile_batch=null",
       "stream.requests_per_slot=1", "stream.prompt_len=[4,8]", "stream.output_len=[2,6]", "serve.requests=2",
       "serve.repeats=1", "serve.rates=[null]"]
E2E_KEYS = ["budget", "batch_size", "seed", "stage", "method.k0", "method.reassign", "method.coverage", "eval.gen_tokens",
            "eval.max_gen_tokens", "eval.temperature", "eval.do_sample", "eval.batching", "eval.top_p", "task.limit",
            "task.num_fewshot", "predictor.ridge", "calibration.seq_len", "throughput.mode", "throughput.gen_tokens",
            "stream.prompt_len", "model.device"]
small = st.one_of(st.integers(-2, 12).map(str), junk, st.just("null"))


def _e2e_override() -> st.SearchStrategy[str]:
    def value(key: str) -> st.SearchStrategy[str]:
        if key in CHOICES:
            return st.one_of(st.sampled_from(CHOICES[key]), junk)
        if key in ("eval.temperature", "eval.top_p", "predictor.ridge", "method.coverage"):
            return st.one_of(floats.filter(lambda v: v in ("nan", "inf", "0") or float(v) < 5), junk)
        if key == "stream.prompt_len":
            return st.lists(st.integers(-1, 12).map(str), max_size=3).map(lambda xs: "[" + ",".join(xs) + "]")
        if key == "eval.do_sample":
            return st.sampled_from(["true", "false", "maybe"])
        return small

    group = st.sampled_from(["method=dense", "method=router_sum", "method=oea", "method=base", "method=calib_freq"])
    return st.one_of(st.sampled_from(E2E_KEYS).flatmap(lambda k: value(k).map(lambda v, k=k: f"{k}={v}")), group)


@pytest.mark.slow
@settings(max_examples=12, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(draws=st.lists(_e2e_override(), min_size=1, max_size=3, unique_by=lambda o: o.split("=")[0]))
def test_drawn_command_lines_run_or_exit_2_without_a_traceback(draws):
    """run.py itself: a drawn command line finishes (0) or is refused (2); a traceback never."""
    with tempfile.TemporaryDirectory() as d:
        argv = [a for a in E2E if a.split("=")[0] not in {o.split("=")[0] for o in draws}] + draws
        proc = subprocess.run([sys.executable, str(ROOT / "run.py"), f"outputs_dir={d}/out",
                               f"artifacts_dir={Path(tempfile.gettempdir()) / 'base-moe-e2e-artifacts'}", *argv], cwd=d, capture_output=True,
                              text=True, timeout=900, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
        said = proc.stderr[-3000:] + proc.stdout[-1000:]
        hypothesis.event(f"exit {proc.returncode}")
        assert proc.returncode in (0, 2), f"{draws}: exit {proc.returncode}\n{said}"
        assert "Traceback" not in proc.stderr + proc.stdout, f"{draws}:\n{said}"
        if proc.returncode == 2:
            assert "error: " in proc.stderr
