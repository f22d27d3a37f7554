"""Inputs that used to end in a traceback (issue 28's classes) fail at start with a ConfigError (exit
code 2 from run.py) naming the key or file and what is valid."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import run
from base.config import ConfigError
from base.run.preflight import preflight

ROOT = Path(__file__).resolve().parents[1]
FAST = ["model=tiny_qwen3", "task=smoke", "logger=none"]


def _preflight(compose, tmp_path: Path, overrides: list[str]) -> None:
    preflight(run.build_config(compose([*FAST, f"artifacts_dir={tmp_path}/a", *overrides]), tmp_path / "out"))


def _refused(compose, tmp_path: Path, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _preflight(compose, tmp_path, overrides)
    assert message in str(err.value)
    assert not (tmp_path / "out").exists() and not (tmp_path / "a").exists()


# ---- names a registry does not hold --------------------------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    (["model.family=nope"], "model.family='nope' is not valid; choose one of: deepseek_v2, gpt_oss, mixtral, olmoe"),
    (["model.experts_impl=fast"], "model.experts_impl='fast' is not valid; choose one of: base_triton, batched_mm"),
    (["stage=throughput", "method=dense", "throughput.methods=[dense,dense:fast]"],
     "throughput.methods[]='dense:fast': 'fast' is not an experts implementation; choose one of: base_triton"),
])
def test_an_unknown_registry_name_names_the_valid_ones(compose, tmp_path, overrides, message):
    _refused(compose, tmp_path, overrides, message)


# ---- composition: null groups, deleted keys, wrong types ----------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["model=null"], "model=null: a run needs a model; choose one of: deepseek_v2_lite,"),
    (["method=null"], "method=null: a run needs a method; choose one of: base, base_anchor,"),
    # a model.arch key the model's config does not set: the nearest of its keys, not Hydra's "use +"
    (["model=tiny_qwen3", "model.arch.num_expert=8"], "model.arch.num_expert is not set by model tiny_qwen3's config; did you mean "
                                  "model.arch.num_experts?"),
    (["model=mini", "model.arch.num_expert=8"], "model.arch.num_expert: model mini loads a checkpoint"),
    # a list for a group: Hydra would merge the options into one run, the last winning
    (["method=[base,dense]"], "method=[base,dense]: a run takes one method (a list merges its options into one run, "
                              "the last winning); to run each, sweep: python run.py -m method=base,dense"),
    (["task=[smoke,mini_smoke]"], "task=[smoke,mini_smoke]: a run takes one task"),
    (["model.name=null"], "field 'model.name' is not Optional; full_key: model.name"),
    (["~budget"], "budget has no value (deleted by a ~key override"),
    (["~model"], "model.name, model.family, model.path has no value"),
    (["~predictor"], "predictor has no value"),
    # an interpolation left without its key (found by tests/test_schema_property.py: a traceback before)
    (["~outputs_dir"], "outputs_dir has no value (deleted by a ~key override"),
    (["logger.dir=${nowhere}"], "logger.dir=${nowhere} refers to a key that has no value"),
    (["model=tiny_qwen3", "model.arch.vocab_size=${nowhere}"], "model.arch.vocab_size refers to a key that has no value"),
    (["budget=abc"], "Value 'abc' of type 'str' could not be converted to Integer; full_key: budget"),
    (["model=nope"], "Could not find 'model/nope'; Available options in 'model': deepseek_v2_lite, gpt_oss_120b"),
    (["-m", "budget=4,abc"], "Value 'abc' of type 'str' could not be converted to Integer"),  # a sweep's 2nd value
    (["-m", "method=dense,null"], "method=dense,null"),
])
def test_what_composition_refuses_is_a_config_error(argv, message):
    with pytest.raises(ConfigError) as err:
        run.check_composition(argv)
    assert message in str(err.value)


@pytest.mark.parametrize("argv", [["model=tiny_qwen3", "budget=4"], ["-m", "method=dense,base", "budget=4,8"],
                                  ["-m", "model=glob(tiny_q*)"], ["model=tiny_qwen3", "+model.arch.rope_theta=5.0"],
                                  ["experiment=stream"], ["hydra.run.dir=x", "hydra/launcher=joblib"]])
def test_valid_command_lines_compose(argv):
    run.check_composition(argv)


def test_a_deleted_key_fails_the_typed_config_too(compose, tmp_path):
    with pytest.raises(ConfigError, match="eval has no value"):
        run.build_config(compose([*FAST, "~eval"]), tmp_path)


# ---- values a library would reject ---------------------------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    (["seed=4294967296"], "seed=4294967296 is out of range: must be [0, 4294967295]"),  # numpy's seed range
    (["model.device=meta"], "model.device=meta builds the model without memory, so it has no weights to run"),
])
def test_values_a_library_rejects_are_refused(compose, tmp_path, overrides, message):
    _refused(compose, tmp_path, overrides, message)


def test_a_device_too_small_for_the_weights_is_refused(compose, tmp_path, monkeypatch):
    from base.run import model_checks

    monkeypatch.setattr(model_checks, "_capacity", lambda device: (10_000, "a 10 kB device"))
    _refused(compose, tmp_path, ["method=dense"], "model tiny_qwen3 needs 0.0 GB for its weights in float32, more than "
                                                   "a 10 kB device holds")
    monkeypatch.setattr(model_checks, "_capacity", lambda device: (10**12, "a 1 TB device"))
    _preflight(compose, tmp_path, ["method=dense"])


@pytest.mark.parametrize("family", ["qwen3", "deepseek", "gpt_oss", "olmoe", "mixtral", "qwen2"])
def test_the_kv_cache_estimate_is_what_the_engine_allocates(family):
    """kv_bytes_per_slot against the cache buffers a decode engine actually registers (DeepSeek's MLA
    and GPT-OSS's sliding layers included): the memory check's arithmetic, checked by allocation."""
    import torch

    from base.hf.loading import load_model
    from base.run.model_checks import kv_bytes_per_slot
    from base.runtime.engine import DecodeEngine
    from tests.helpers import tiny_model_config

    model = load_model(tiny_model_config(family), ROOT, seed=0)
    ids = torch.randint(3, 200, (2, 5))
    DecodeEngine(model, 2, 16).generate(ids, torch.ones_like(ids), 2, stop_at_eos=False)
    held = sum(b.numel() * b.element_size() for name, b in model.named_buffers()
               if name.endswith(("base_k_cache", "base_v_cache")))
    assert held == 2 * 16 * kv_bytes_per_slot(model.config, 4)


@pytest.mark.parametrize("overrides, key, slots", [
    (["batch_size={rows}"], "batch_size", 256),  # evaluate: the cache rounded up to 256 slots at least
    (["stage=throughput", "throughput.prompt_len=16", "throughput.gen_tokens=8", "throughput.timed_steps=4",
      "throughput.batch_sizes=[1,{rows}]"], "throughput.batch_sizes", 24),
    (["stage=throughput", "throughput.mode=serve", "stream.prompt_len=[8,300]", "stream.output_len=[2,6]",
      "throughput.batch_sizes=[{rows}]"], "throughput.batch_sizes", 512),
])
def test_a_decode_batch_too_large_for_the_device_is_refused(compose, tmp_path, monkeypatch, overrides, key, slots):
    """Beside the weights, the K/V cache of the largest decode batch must fit (a billion rows ended in
    the allocator's traceback halfway through a run): a device with room for 10 rows takes 10, not 11."""
    from base.hf.loading import load_model
    from base.run import model_checks
    from tests.helpers import tiny_model_config

    model = load_model(tiny_model_config("qwen3"), ROOT, seed=0)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    per_row = slots * (model_checks.kv_bytes_per_slot(model.config, 4) + 1)
    monkeypatch.setattr(model_checks, "_capacity", lambda device: (weights + 10 * per_row + per_row // 2, "a small device"))
    fill = lambda rows: [o.format(rows=rows) for o in overrides]
    _refused(compose, tmp_path, fill(11), f"{key}: 11 rows of {slots} cache slots need")
    _refused(compose, tmp_path, fill(11), "more than a small device holds")
    _refused(compose, tmp_path, fill(11), "at most 10 rows fit")
    _preflight(compose, tmp_path, fill(10))


@pytest.mark.parametrize("overrides, key", [
    (["throughput.mode=serve", "serve.requests={n}"], "serve.requests"),
    (["throughput.mode=stream", "throughput.batch_sizes=[1]", "stream.requests_per_slot={n}"],
     "stream.requests_per_slot={n} at 1 slots"),
])
def test_a_stream_whose_prompts_cannot_fit_in_memory_is_refused(compose, tmp_path, monkeypatch, overrides, key):
    """A billion requests spent minutes drawing prompts before the allocator failed: with room for the
    prompts of 10 requests (8 tokens at least, 8 bytes a token) 10 pass and 11 are refused."""
    from base.run import model_checks
    from base.run import preflight as pre

    monkeypatch.setattr(pre, "check_device_memory", lambda cfg, hf: None)  # the weights and buckets: other checks'
    monkeypatch.setattr(pre, "check_prefill_buckets", lambda cfg, hf: None)
    monkeypatch.setattr(model_checks, "_capacity", lambda device: (10 * 8 * 8 + 7, "a small machine"))
    common = ["stage=throughput", "stream.prompt_len=[8,16]", "stream.output_len=[2,6]"]
    fill = lambda n: [*common, *(o.format(n=n) for o in overrides)]
    _refused(compose, tmp_path, fill(11), f"{key.format(n=11)}: a stream of 11 requests holds at least")
    _refused(compose, tmp_path, fill(11), "more than a small machine holds (0.0 GB): at most 10 requests fit")
    _preflight(compose, tmp_path, fill(10))


@pytest.mark.parametrize("overrides, message", [
    # a stream that would wait for its arrivals longer than a day (1e-300: time.sleep overflowed mid-run)
    (["stage=throughput", "throughput.mode=serve", "serve.rates=[null,1e-300]"],
     "serve.rates[1]=1e-300: 12 requests at 1e-300 requests/s arrive over about 1.2e+301 s on average, more than a day"),
    (["stage=throughput", "throughput.mode=stream", "throughput.batch_sizes=[2]", "stream.rate=1e-5"],
     "stream.rate=1e-05: 16 requests at 1e-05 requests/s arrive over about 1.6e+06 s"),
    (["stage=throughput", "throughput.mode=serve", "serve.rates=[null]", "serve.search_steps=2",
      "serve.search_range=[1e-9,4]"], "serve.search_range[0]=1e-09: 12 requests at 1e-09 requests/s"),
    # a prefill bucket no device holds (the allocator's traceback mid-run, after the run folder was made)
    (["stage=throughput", "throughput.mode=serve", "stream.prompt_len=[8,16]", "stream.output_len=[2,6]",
      "scheduler.buckets=[1000000000000]"], "scheduler.buckets: a packed prefill of 1000000000000 tokens needs at least"),
    (["scheduler.buckets=[1000000000000]"], "scheduler.buckets: a packed prefill of 1000000000000 tokens"),  # evaluate
])
def test_a_run_that_could_not_finish_is_refused_at_start(compose, tmp_path, overrides, message):
    """Refused before anything runs (validation only here: were the check lost, the run itself
    would wait for days or fail halfway)."""
    _refused(compose, tmp_path, overrides, message)


def test_steps_that_do_not_fit_after_the_gpu_warm_up_are_refused():
    """On a GPU the warm-up replays come first out of gen_tokens: timed or statistics steps beyond
    what is left were cut without a word (timed_steps=7 of gen_tokens=8 with warmup=4 timed 3)."""
    from base.config import ThroughputConfig
    from base.run.preflight import check_decode_steps

    def tp(**kw) -> ThroughputConfig:
        return ThroughputConfig(**{"batch_sizes": [2], "gen_tokens": 8, "warmup": 4, "stats_steps": 3, **kw})

    with pytest.raises(ConfigError, match=r"throughput.timed_steps=4 does not fit: on a GPU 4 untimed warm-up step"):
        check_decode_steps(tp(timed_steps=4), on_gpu=True)
    with pytest.raises(ConfigError, match=r"throughput.stats_steps=4 does not fit.* at most 3 steps are left"):
        check_decode_steps(tp(stats_steps=4), on_gpu=True)
    check_decode_steps(tp(timed_steps=3), on_gpu=True)  # 4 + 3 = gen_tokens - 1
    check_decode_steps(tp(timed_steps=None), on_gpu=True)  # null: whatever is left
    check_decode_steps(tp(timed_steps=7, stats_steps=7), on_gpu=False)  # a CPU decodes eagerly: no warm-up
    with pytest.raises(ConfigError, match=r"throughput.timed_steps=7 does not fit: on a GPU 1 untimed"):
        check_decode_steps(tp(timed_steps=7, warmup=0), on_gpu=True)  # the capture's step is one at least


# ---- checkpoints ---------------------------------------------------------------------------------
def _tiny_checkpoint(tmp_path: Path, family: str = "qwen3") -> Path:
    from base.hf.loading import byte_tokenizer, load_model
    from tests.helpers import tiny_model_config

    folder = tmp_path / f"ckpt_{family}"
    load_model(tiny_model_config(family), ROOT, seed=0).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


@pytest.mark.parametrize("kind, message", [
    ("no_config", "no config.json in"),
    ("no_tokenizer", "turns text into no tokens (a folder without tokenizer.json"),
    ("other_family", ("holds a checkpoint of model_type 'olmoe', but model.family=qwen3_moe expects 'qwen3_moe'; "
                     "set model.family=olmoe")),
])
def test_a_checkpoint_folder_is_checked_by_what_it_holds(compose, tmp_path, kind, message):
    folder = _tiny_checkpoint(tmp_path, "olmoe" if kind == "other_family" else "qwen3")
    if kind == "no_config":
        (folder / "config.json").unlink()
    if kind == "no_tokenizer":
        for f in folder.glob("*token*"):
            f.unlink()
    _refused(compose, tmp_path, ["model.init=pretrained", f"model.path={folder}", "model.tokenizer=null",
                                 "method=dense"], message)


def test_a_whole_checkpoint_passes(compose, tmp_path):
    folder = _tiny_checkpoint(tmp_path)
    _preflight(compose, tmp_path, ["model.init=pretrained", f"model.path={folder}", "model.tokenizer=null",
                                   "method=dense"])


# ---- files read by content -----------------------------------------------------------------------
@pytest.mark.parametrize("row, message", [
    ("[1, 2]", "line 2 is a JSON list, not an object with a \"text\" string"),
    ('"plain"', "line 2 is a JSON str, not an object with a \"text\" string"),
    ('{"text": 5}', "line 2 is an object without a \"text\" string"),
    ('{"body": "abc"}', "line 2 is an object without a \"text\" string"),
])
def test_calibration_rows_must_be_objects_with_a_text_string(compose, tmp_path, row, message):
    path = tmp_path / "calib.jsonl"
    path.write_text('{"text": "a first line of text"}\n' + row + "\n")
    _refused(compose, tmp_path, [f"calibration.files=[{path}]", "method=calib_freq", "budget=2"],
             f"calibration.files: {path} does not parse (ValueError: {message})")


@pytest.mark.parametrize("line", ["not json", "[5, 4]", '{"prompt_tokens": "5", "new_tokens": 4}',
                                  '{"prompt_tokens": -3, "new_tokens": 4}', '{"prompt_tokens": true, "new_tokens": 4}'])
def test_a_lengths_file_with_a_bad_line_names_the_line(compose, tmp_path, line):
    path = tmp_path / "samples.jsonl"
    path.write_text('{"prompt_tokens": 30, "new_tokens": 8}\n\n' + line + "\n")
    _refused(compose, tmp_path, ["stage=throughput", "throughput.mode=stream", f"stream.lengths_from={path}",
                                 "method=dense"], f"stream.lengths_from={path}: line 3 is not a JSON object whose "
                                                  f"prompt_tokens and new_tokens are whole numbers >= 0")


def test_a_cached_calibration_whose_content_contradicts_the_model_is_computed_again(capsys):
    from base.run.artifacts import _load_cached
    from tests.test_predictor import IDENTITY, planted, synthetic_calibration

    calib = synthetic_calibration(*planted())

    def check(c):
        c.check_content(IDENTITY)

    assert _load_cached(lambda p: calib, Path("cached"), check) is calib  # it fits: used as it is
    for edit in (lambda c: c.meta.update(num_experts=8), lambda c: c.meta.update(model={**IDENTITY, "name": "x"}),
                 lambda c: setattr(c.layers[1], "norms_NK", None),
                 lambda c: c.layers[0].idx_NK.fill_(IDENTITY["num_experts"])):
        bad = synthetic_calibration(*planted())
        edit(bad)
        assert _load_cached(lambda p, b=bad: b, Path("cached"), check) is None
        assert "does not fit this model" in capsys.readouterr().out


# ---- the launcher's environment and folders that cannot be made ----------------------------------
@pytest.mark.parametrize("key, value, message", [
    ("BASE_SWEEP_STARTED", "yesterday", "BASE_SWEEP_STARTED='yesterday' must be a time in seconds since the epoch"),
    ("BASE_SWEEP_STARTED", "nan", "BASE_SWEEP_STARTED='nan' must be a time"),
    ("BASE_RAY_GPUS", "inf", "BASE_RAY_GPUS='inf' must be a number >= 0"),
    ("BASE_RAY_CPUS", "nan", "BASE_RAY_CPUS='nan' must be a number >= 0"),
])
def test_malformed_launcher_environment_is_refused(monkeypatch, key, value, message):
    monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        run.check_launcher_env()


@pytest.mark.parametrize("path, message", [
    ("{tmp}/" + "x" * 300 + "/runs", "bytes; this file system allows"),
    pytest.param("/proc/base-moe-outputs", "cannot create folders in /proc",
                 marks=pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")),
])
def test_an_outputs_dir_that_cannot_be_created_is_refused(tmp_path, path, message):
    from base.checks import check_folder

    with pytest.raises(ConfigError, match=message):
        check_folder("outputs_dir", Path(path.format(tmp=tmp_path)))
    assert list(tmp_path.iterdir()) == []  # the probe left nothing
    check_folder("outputs_dir", tmp_path / "a" / "b")
    assert list(tmp_path.iterdir()) == []


# ---- run.py: exit code 2, no traceback -----------------------------------------------------------
def _run_py(tmp_path: Path, args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args, env, message", [
    (["model=null"], None, "error: model=null: a run needs a model"),
    (["budget=abc"], None, "error: Error merging override budget=abc"),
    pytest.param(["~budget"], None, "error: budget has no value", marks=pytest.mark.slow),
    pytest.param(["outputs_dir=/proc/x"], None, "error: outputs_dir=/proc/x: cannot create folders in /proc",
                 marks=pytest.mark.slow),
    pytest.param([], {"BASE_SWEEP_STARTED": "abc"}, "error: BASE_SWEEP_STARTED='abc'", marks=pytest.mark.slow),
    pytest.param(["-m", "budget=2,abc"], None, "could not be converted to Integer", marks=pytest.mark.slow),
])
def test_run_py_exits_2_without_a_traceback(tmp_path, args, env, message):
    proc = _run_py(tmp_path, [*args, *FAST, "stage=describe"], env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr and "Traceback" not in proc.stderr + proc.stdout
    assert list(tmp_path.iterdir()) == []  # refused before Hydra made a folder


def test_a_cached_predictor_fitted_for_another_model_is_fitted_again(capsys):
    import torch

    from base.method.predictor import Predictor
    from base.run.artifacts import _load_cached

    ours = {"name": "tiny", "num_layers": 2, "num_experts": 4, "hidden": 8}
    pred = Predictor(torch.zeros(2, 8, 4), torch.zeros(2, 4), {"model": {**ours, "name": "other"}, "r2": [0.5, 0.5]})
    assert _load_cached(lambda p: pred, Path("cached"), lambda p: p.check_model(ours, Path("cached"))) is None
    assert "was fitted for another model" in capsys.readouterr().out
    pred.meta["model"] = ours
    assert _load_cached(lambda p: pred, Path("cached"), lambda p: p.check_model(ours, Path("cached"))) is pred


# ---- one spelling of an error ---------------------------------------------------------------------
def test_every_error_message_starts_with_error():
    """What the code prints or exits with as an error starts `error: ` (never `Error:`/`ERROR:`),
    as run.py's own (usage lines excepted)."""
    import re

    files = subprocess.run(["git", "ls-files", "*.py", "*.sh"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    said = re.compile(r"""(SystemExit\(f?["'](?!error: |usage: )|["'](Error|ERROR): )""")
    found = [f"{f}:{n}: {line.strip()}" for f in files if not f.startswith("tests/")
             for n, line in enumerate((ROOT / f).read_text().splitlines(), 1) if said.search(line)]
    assert not found, "\n".join(found)
