"""Inputs that used to run to the end with exit code 0 and a wrong result (issue 28) fail instead,
with a message naming the key: non-finite predictor fits, checkpoints missing tensors, prompts
longer than the model's context leaves them, meaningless sampling, options the run never reads."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import run
from base.config import ConfigError
from base.run.preflight import preflight

ROOT = Path(__file__).resolve().parents[1]
FAST = ["model=tiny_qwen3", "task=smoke", "logger=none"]  # tiny_qwen3: 512 positions


def _refused(compose, tmp_path: Path, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        preflight(run.build_config(compose([*FAST, f"artifacts_dir={tmp_path}/a", *overrides]), tmp_path / "out"))
    assert message in str(err.value)
    assert not (tmp_path / "out").exists() and not (tmp_path / "a").exists()


# ---- predictor fits ------------------------------------------------------------------------------
@pytest.mark.parametrize("ridge", ["inf", "1e300", "-1", "nan"])
def test_a_ridge_that_would_fit_nan_or_zero_weights_is_refused(compose, tmp_path, ridge):
    _refused(compose, tmp_path, ["stage=fit", f"predictor.ridge={ridge}"], "predictor.ridge=")


def test_a_fit_with_non_finite_weights_is_refused_and_not_returned():
    from base.config import PredictorConfig
    from base.method.predictor import fit_predictor
    from tests.test_predictor import planted, synthetic_calibration

    calib = synthetic_calibration(*planted())
    calib.layers[1].z_NH[5, 2] = float("inf")  # a calibration input that overflowed
    with pytest.raises(ConfigError, match=r"non-finite weights for \d+ \(layer, expert\) pairs, first layer 1"):
        fit_predictor(calib, PredictorConfig())
    fit_predictor(synthetic_calibration(*planted()), PredictorConfig())  # the same calibration, finite: fits


def test_a_singular_fit_names_the_ridge():
    from base.config import PredictorConfig
    from base.method.predictor import fit_predictor
    from tests.test_predictor import planted, synthetic_calibration

    calib = synthetic_calibration(*planted())
    for layer in calib.layers:
        layer.z_NH[:, 1] = layer.z_NH[:, 0]  # collinear inputs: no unique least-squares fit without a ridge
    with pytest.raises(ConfigError, match="is singular with predictor.ridge=0.0"):
        fit_predictor(calib, PredictorConfig(ridge=0.0))


# ---- checkpoints ---------------------------------------------------------------------------------
def _checkpoint(tmp_path: Path, edit) -> Path:
    from safetensors.torch import load_file, save_file

    from base.hf.loading import load_model
    from tests.helpers import tiny_model_config

    folder = tmp_path / "ckpt"
    load_model(tiny_model_config("qwen3"), ROOT, seed=0).save_pretrained(folder)
    (weights,) = folder.glob("*.safetensors")
    tensors = load_file(str(weights))
    save_file(edit(tensors), str(weights), metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("kind, message", [
    ("missing", ("tensors 3 missing (model.layers.1.mlp.experts.down_proj, model.layers.1.mlp.experts.gate_up_proj, "
                "model.layers.1.mlp.gate.weight)")),
    ("unexpected", "tensors 1 unexpected (model.layers.7.mlp.gate.weight)"),
])
def test_a_checkpoint_missing_or_adding_tensors_fails_the_load_naming_them(tmp_path, kind, message):
    """transformers would initialise the missing layer at random (accuracy 1.0 -> 0.125 on mini)."""
    from dataclasses import replace

    from base.hf.loading import load_model
    from tests.helpers import tiny_model_config

    def edit(t: dict) -> dict:
        if kind == "missing":
            return {k: v for k, v in t.items() if not k.startswith("model.layers.1.mlp.")}
        return {**t, "model.layers.7.mlp.gate.weight": t["model.layers.0.mlp.gate.weight"].clone()}

    folder = _checkpoint(tmp_path, edit)
    cfg = replace(tiny_model_config("qwen3"), init="pretrained", path=str(folder))
    with pytest.raises(ConfigError) as err:
        load_model(cfg, ROOT)
    assert message in str(err.value) and f"model.path={folder}" in str(err.value)


def test_a_whole_checkpoint_loads(tmp_path):
    from dataclasses import replace

    from base.hf.loading import load_model
    from tests.helpers import tiny_model_config

    folder = _checkpoint(tmp_path, lambda t: t)
    load_model(replace(tiny_model_config("qwen3"), init="pretrained", path=str(folder)), ROOT)


# ---- prompt + new tokens against the context -----------------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    # smoke's prompts are 5-12 tokens; 505 new tokens fit 512 positions alone, not with the prompt
    (["eval.gen_tokens=505"], "plus 505 new tokens needs"),
    (["stage=throughput", "throughput.prompt_len=500", "throughput.gen_tokens=40", "method=dense"],
     ("throughput.prompt_len=500 + throughput.gen_tokens=40: a prompt of 500 tokens plus 40 new tokens needs 540 "
     "positions, but tiny_qwen3 has 512")),
    (["stage=throughput", "throughput.mode=stream", "stream.prompt_len=[100,480]", "stream.output_len=[2,40]",
      "method=dense"], "a prompt of 480 tokens plus 40 new tokens needs 520 positions"),
])
def test_prompt_plus_new_tokens_beyond_the_context_is_refused(compose, tmp_path, overrides, message):
    _refused(compose, tmp_path, overrides, message)


def test_a_replayed_request_beyond_the_context_is_refused(compose, tmp_path):
    lengths = tmp_path / "samples.jsonl"
    lengths.write_text("\n".join(json.dumps(r) for r in [{"prompt_tokens": 30, "new_tokens": 8},
                                                           {"prompt_tokens": 500, "new_tokens": 20}]))
    _refused(compose, tmp_path, ["stage=throughput", "throughput.mode=stream", f"stream.lengths_from={lengths}",
                                 "method=dense"], "(its longest request): a prompt of 500 tokens plus 20 new tokens")


def test_requests_that_fit_pass(compose, tmp_path):
    preflight(run.build_config(compose([*FAST, "eval.gen_tokens=400", "method=dense"]), tmp_path / "o"))
    preflight(run.build_config(compose([*FAST, "stage=throughput", "method=dense", "throughput.prompt_len=472",
                                        "throughput.gen_tokens=40"]), tmp_path / "o"))


class _Req:
    def __init__(self, context: str, max_gen_toks: int) -> None:
        self.args = (context, {"until": ["\n"], "max_gen_toks": max_gen_toks})
        self.task_name, self.doc_id = "t", 0


@pytest.mark.parametrize("batching, refused", [("continuous", False), ("static", True)])
def test_decoding_never_cuts_a_prompt(compose, tmp_path, batching, refused):
    """The guard at decode time: under static batching a prompt shares its batch's largest new-token
    count, so a long prompt beside a long generation would be cut; continuous gives each its own."""
    from base.eval.lm import BudgetedLM
    from base.hf.loading import load_model, load_tokenizer

    rc = run.build_config(compose([*FAST, "method=dense", f"eval.batching={batching}"]), tmp_path / "o")
    model, tok = load_model(rc.model, ROOT), load_tokenizer(rc.model, ROOT)
    lm = BudgetedLM(model, tok, 2, rc.eval, 0, None, max_length=64)
    lm.batches.run = lambda reqs, disable_tqdm=False: ["" for _ in reqs]  # decoding is not under test
    requests = [_Req("x" * 50, 8), _Req("y", 40)]  # 50 + 8 and 1 + 40 fit 64; 50 + 40 does not
    if refused:
        with pytest.raises(ConfigError, match="a prompt of 50 tokens plus 40 new tokens needs 90 positions"):
            lm.generate_until(requests)
    else:
        assert lm.generate_until(requests) == ["", ""]


# ---- sampling and options the run would ignore ---------------------------------------------------
@pytest.mark.parametrize("temperature", ["inf", "1e-40", "1000", "nan"])
def test_a_temperature_that_makes_sampling_noise_or_overflow_is_refused(compose, tmp_path, temperature):
    _refused(compose, tmp_path, ["eval.do_sample=true", f"eval.temperature={temperature}"],
             "must be a number >= 1e-05 and <= 100.0")


@pytest.mark.parametrize("overrides, message", [
    (["method=router_sum", "budget=2", "method.k0=2"], "method.k0=2 would be ignored: only base_anchor, lynx, oea, xshare"),
    (["method=dense", "method.reassign=drop", "method.backend=triton"],
     "method.reassign=drop, method.backend=triton would be ignored: dense selects no experts"),
    (["method=dense", "eval.temperature=0.3", "eval.top_k=5"],
     "eval.temperature=0.3, eval.top_k=5 would be ignored: greedy decoding (eval.do_sample=false) does not sample"),
    (["method=dense", "scheduler.max_wait_rounds=9"], "scheduler.max_wait_rounds=9 would be ignored: scheduler.admission=fifo"),
    (["stage=throughput", "throughput.mode=stream", "scheduler.max_wait_rounds=9"],
     "scheduler.max_wait_rounds=9 would be ignored: scheduler.admission=fifo"),
    (["stage=throughput", "method=dense", "stream.rate=3"], "stream.rate=3.0 would be ignored: throughput.mode=steps"),
    (["stage=throughput", "method=dense", "throughput.mode=stream", "serve.repeats=5"],
     "serve.repeats=5 would be ignored: only throughput.mode=serve (stage=throughput) reads serve.*"),
    (["method=dense", "serve.requests=5"],  # an evaluate run reads no serve.* either
     "serve.requests=5 would be ignored: only throughput.mode=serve (stage=throughput) reads serve.*"),
    (["eval.batching=static", "scheduler.chunked=true"],
     "scheduler.chunked=True would be ignored: eval.batching=static decodes fixed batches"),
    (["scheduler.min_prompt_tokens=512"], "scheduler.min_prompt_tokens=512 would be ignored: with scheduler.max_wait_steps=0"),
    (["scheduler.chunk_tokens=64"], "scheduler.chunk_tokens=64 would be ignored: only scheduler.chunked=true"),
    (["stage=fit", "predictor.fit_on=all"], "predictor.fit_on=all fits on every expert's norm, which only a calibration"),
    (["stage=throughput", "method=dense", "throughput.methods=[dense,router_sum:2]"],
     "throughput.methods[]='router_sum:2': router_sum reads no k0"),
    (["stage=throughput", "method=dense", "throughput.methods=[dense,base_anchor]"],
     "throughput.methods[]='base_anchor': base_anchor needs its k0, e.g. base_anchor:1"),
    (["diagnose.rules=[xshare]"], "diagnose.rules[]='xshare': xshare needs its k0"),
    (["eval.order=lm_eval", "eval.seed=5"], "eval.seed=5 would be ignored: it seeds eval.order=mixed's shuffle"),
    (["stats.enabled=false", "stats.energy=true"], "stats.energy=true would be ignored: stats.enabled=false"),
    (["model.skew_ratio=0.3"], "model.skew_ratio=0.3 would be ignored: it sets model.routing=skewed's union"),
    (["diagnose.rules=[dense:grouped_mm]"], "diagnose.rules[]='dense:grouped_mm': options are :K0"),
    (["stage=throughput", "throughput.methods=[dense,oea:1]", "method.k0=2"],
     "method.k0=2 would be ignored: only base_anchor, lynx, oea, xshare read it (throughput.methods gives each its own"),
])
def test_an_option_the_run_never_reads_is_refused_naming_it(compose, tmp_path, overrides, message):
    with pytest.raises(ConfigError) as err:
        run.build_config(compose([*FAST, *overrides]), tmp_path / "o")
    assert message in str(err.value)


@pytest.mark.parametrize("overrides", [
    ["method=oea", "method.k0=2", "budget=null"], ["method=base", "method.reassign=drop"],
    ["method=dense", "eval.do_sample=true", "eval.temperature=0.3"], ["scheduler.admission=union", "scheduler.max_wait_rounds=9"],
    ["stage=throughput", "throughput.mode=stream", "stream.rate=3"], ["stage=fit", "method.k0=2"],
    ["stage=throughput", "throughput.methods=[dense,base]", "method=dense", "throughput.budgets=[2]", "method.backend=triton"],
    ["scheduler.min_prompt_tokens=64", "scheduler.max_wait_steps=4"], ["scheduler.chunked=true", "scheduler.chunk_tokens=64"],
    ["predictor.fit_on=all", "calibration.all_experts=true"], ["diagnose.rules=[router_sq,base_anchor:2]"],
])
def test_options_the_run_reads_pass(compose, tmp_path, overrides):
    run.build_config(compose([*FAST, *overrides]), tmp_path / "o")


@pytest.mark.parametrize("overrides, budget", [
    (["method=oea", "method.k0=1", "budget=4"], None), (["method=dense", "budget=4"], None), (["method=base", "budget=4"], 4),
])
def test_a_rule_that_ignores_the_budget_records_none(compose, tmp_path, overrides, budget):
    """oea keeps every token's top-k0 whatever the budget: its run says budget None, as dense's does,
    so a budget sweep over it is one run, not copies labelled with budgets they never used."""
    assert run.build_config(compose([*FAST, *overrides]), tmp_path / "o").budget == budget


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (ROOT / "conf/experiment").glob("*.yaml")))
def test_every_experiment_builds(compose, tmp_path, experiment):
    """No committed experiment sets an option its runs would not read."""
    run.build_config(compose([f"experiment={experiment}"]), tmp_path / "o")


def test_a_negative_few_shot_count_is_refused(compose, tmp_path):
    with pytest.raises(ConfigError, match="task.num_fewshot=-1 is out of range: must be >= 0 or null"):
        run.build_config(compose([*FAST, "task.num_fewshot=-1"]), tmp_path / "o")
