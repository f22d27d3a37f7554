"""Every bad input fails at start, before the run writes anything, with a message naming the valid
range or choice (issue 8's table). Each case goes through run.build_config and pipeline.run as
run.py does; the run folder must stay empty."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

import run
from base.config import ConfigError
from base.run.pipeline import run as run_pipeline

ROOT = Path(__file__).resolve().parents[1]
FAST = ["model=tiny_qwen3", "task=smoke", "logger=none"]


def _empty_task(tmp: Path) -> list[str]:
    (tmp / "tasks").mkdir()
    (tmp / "tasks" / "empty.jsonl").write_text("")
    yaml = (ROOT / "tasks/smoke/smoke_copy.yaml").read_text()
    data = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tmp / 'tasks' / 'empty.jsonl'}\n"
    yaml = yaml.replace("task: smoke_copy", "task: empty_copy").replace(
        "custom_dataset: !function utils.load_split\ndataset_kwargs:\n  file: copy.jsonl\n", data)
    assert data in yaml
    (tmp / "tasks" / "empty.yaml").write_text(yaml)
    return [f"task.include_path={tmp / 'tasks'}", "task.tasks=[empty_copy]"]


def _shaped_task(tmp: Path, kind: str) -> list[str]:
    """A local task shaped like the paper's boolq (log-likelihood) or humaneval (executes code)."""
    (tmp / "tasks").mkdir(exist_ok=True)
    (tmp / "tasks" / "qa.jsonl").write_text('{"question": "yes?", "answer": "yes"}\n')
    head = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tmp / 'tasks' / 'qa.jsonl'}\n" \
           "test_split: test\ndoc_to_text: '{{question}}'\nmetadata:\n  version: 1.0\n"
    if kind == "loglikelihood":
        body = ("task: shape_mc\noutput_type: multiple_choice\ndoc_to_choice: ['yes', 'no']\ndoc_to_target: 0\n"
                "metric_list:\n  - metric: acc\n")
    else:
        body = ("task: shape_code\noutput_type: generate_until\nunsafe_code: true\ndoc_to_target: '{{answer}}'\n"
                "generation_kwargs:\n  until: ['\\n']\nmetric_list:\n  - metric: exact_match\n")
    (tmp / "tasks" / f"{kind}.yaml").write_text(head + body)
    name = "shape_mc" if kind == "loglikelihood" else "shape_code"
    return [f"task.include_path={tmp / 'tasks'}", f"task.tasks=[{name}]"]


def _predictor_file(tmp: Path, kind: str) -> list[str]:
    """A predictor file that claims one thing and holds another (garbage, another model's, NaN
    weights, wrong shapes, no r2); the tiny model has 2 MoE layers, hidden 64, 16 experts."""
    import torch

    from base.method.predictor import Predictor

    path = tmp / "pred.safetensors"
    ours = {"name": "tiny_qwen3", "num_layers": 2, "num_experts": 16, "hidden": 64}
    w, b, meta = torch.zeros(2, 64, 16), torch.zeros(2, 16), {"model": ours, "r2": [0.5, 0.5]}
    if kind == "garbage":
        path.write_bytes(b"\x00\x01 not a safetensors file")
        return [f"predictor.path={path}", "method=base", "budget=2"]
    if kind == "other":  # a whole, consistent predictor of another model
        w, b, meta = torch.zeros(2, 8, 4), torch.zeros(2, 4), {
            "model": {"name": "olmoe", "num_layers": 2, "num_experts": 4, "hidden": 8}, "r2": [0.5, 0.5]}
    elif kind == "nan":
        w = torch.full_like(w, float("nan"))
    elif kind == "shape":
        w = torch.zeros(2, 64, 8)
    elif kind == "no_r2":
        meta = {"model": ours}
    Predictor(w, b, meta).save(path)
    return [f"predictor.path={path}", "method=base", "budget=2"]


def _calibration_file(tmp: Path, kind: str) -> list[str]:
    path = tmp / ("calib.jsonl" if kind == "malformed" else "calib.txt")
    path.write_text('{"text": "a line"}\n{"text": unquoted}\n' if kind == "malformed" else "too short")
    return [f"calibration.files=[{path}]", "method=calib_energy", "budget=2"]


def _a_file(tmp: Path) -> Path:
    (tmp / "a_file").write_text("")
    return tmp / "a_file"


def _damaged_checkpoint(tmp: Path) -> list[str]:
    """A real local checkpoint of the tiny model whose weights file is cut in half."""
    from base.hf.loading import load_model
    from tests.helpers import tiny_model_config

    folder = tmp / "ckpt"
    load_model(tiny_model_config("qwen3"), ROOT, seed=0).save_pretrained(folder)
    (w,) = folder.glob("*.safetensors")
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    return ["model.init=pretrained", f"model.path={folder}", "model.tokenizer=bytes", "method=dense"]


CASES = [
    (["seed=-1"], "seed=-1 is out of range: must be [0, 4294967295]"),
    (["stage=calibrate", "calibration.files=[missing.txt]"], "calibration.files: missing.txt does not exist"),
    ("garbage", "is not a readable predictor file"),
    ("other_model", "was fitted for another model"),
    (["predictor.path=/nonexistent/pred.safetensors", "method=base", "budget=2"], "does not exist"),
    (["eval.max_gen_tokens=0"], "eval.max_gen_tokens=0 is out of range: must be >= 1 or null"),
    # more shots than the task's few-shot docs (found by tests/test_schema_property.py: random.sample's ValueError)
    (["task.num_fewshot=2147483648"], "task.num_fewshot=2147483648: task smoke_copy has"),
    # beyond itertools.islice's bound, where lm-eval slices the docs (found by the same test: a ValueError)
    (["task.limit=9223372036854775808"], "task.limit=9223372036854775808 is out of range: must be [1, 9223372036854775807]"),
    (["eval.seed=-1"], "eval.seed=-1 is out of range: must be >= 0 or null"),
    (["eval.batching=dynamic"], "eval.batching='dynamic' is not valid; choose one of: continuous, static"),
    # files are checked by what they hold, not by what they claim
    ("nan_predictor", "holds non-finite weights (NaN or inf)"),
    ("shape_predictor", "do not match its model (2 MoE layers, hidden 64, 16 experts)"),
    ("no_r2_predictor", "lacks r2 in its metadata"),
    ("malformed_calibration", "does not parse (JSONDecodeError"),
    ("short_calibration", "tokens, fewer than calibration.seq_len=128"),
    # more tokens asked than the files hold: calibration would have used what they hold, unsaid
    (["method=calib_energy", "budget=2", "calibration.num_tokens=100000000"],
     "calibration.num_tokens asks for 100000000 calibration tokens, but calibration.files hold"),
    ("damaged_checkpoint", "is not a readable safetensors file"),
    # a hub id with no local tokenizer (offline here; a 404 online), met by a stage that tokenises
    (["stage=calibrate", "model.path=no-such-org/no-such-model", "model.init=random", "model.tokenizer=null"],
     "no tokenizer loads from no-such-org/no-such-model (OSError); set model.tokenizer to a tokenizer folder"),
    # model shapes changed by overrides
    (["model.arch.num_experts_per_tok=20"], "model.arch.num_experts_per_tok=20 is out of range: each token picks 1..16"),
    (["model.arch.num_attention_heads=3"], "model.arch.num_attention_heads=3 is not a multiple of model.arch.num_key_value_heads=2"),
    (["model.arch.hidden_size=-4"], "model.arch.hidden_size=-4 is out of range: must be in [1, 2147483647]"),
    # checked before transformers builds the config, which makes a list over the layers (this hung)
    (["model.arch.num_hidden_layers=1000000000"],
     "model.arch.num_hidden_layers=1000000000 is out of range: must be in [1, 65536]"),
    # a shape transformers' config validation refuses (found by tests/test_schema_property.py)
    (["model.arch.head_dim=5"], "is not a valid qwen3_moe config: RoPE requires an even rotary dimension"),
    # paths of the wrong kind
    ("folder_as_predictor", "is a folder (looked for"),
    # router_sq predicts no norms, but the diagnostic before its evaluation runs base, which does
    ("garbage_for_diagnostic", "(only the start-time diagnostic reads it, not method=router_sq: set "
                               "diagnose.enabled=false, or diagnose.rules without base, base_anchor and leave "
                               "predictor.path unset)"),
    (["method=router_sq", "budget=2", "calibration.num_tokens=32", "calibration.tokens_per_expert=1",
      "calibration.seq_len=16"], "needs at least 8: set calibration.num_tokens >= 41 (only the start-time diagnostic "
                                 "reads it, not method=router_sq: set diagnose.enabled=false, or diagnose.rules "
                                 "without base, base_anchor)"),
    # calib_freq reads the calibration but fits no predictor: the diagnostic's base does
    (["method=calib_freq", "budget=2", "calibration.num_tokens=32", "calibration.tokens_per_expert=1",
      "calibration.seq_len=16"], "(only the start-time diagnostic reads it, not method=calib_freq"),
    # the diagnostic's prompts are calibration text, whichever rules it runs
    (["method=router_sq", "budget=2", "diagnose.rules=[router_sum]", "calibration.files=[missing.txt]"],
     "calibration.files: missing.txt does not exist (looked for"),
    # a predictor no rule reads
    (["stage=throughput", "method=dense", "throughput.methods=[dense,router_sq]", "throughput.budgets=[2]",
      "predictor.path=p.st"],
     "predictor.path=p.st would be ignored: no rule of this run (nor of its diagnostic) predicts norms"),
    (["method=router_sq", "budget=2", "diagnose.enabled=false", "predictor.path=p.st"],
     "predictor.path=p.st would be ignored: no rule of this run"),
    (["method=router_sq", "budget=2", "diagnose.rules=[router_sum]", "predictor.path=p.st"],
     "predictor.path=p.st would be ignored: no rule of this run"),
    ("file_as_artifacts_dir", "is a file, not a folder; give a folder path"),
    (["method=base", "budget=2", "calibration.num_tokens=32", "calibration.tokens_per_expert=1", "calibration.seq_len=16"],
     "gives the predictor fit about 6.4 tokens per expert (16 experts, top-4, holdout 0.2); a meaningful fit needs at least 8"),
    # what a downstream library would reject, refused at start
    (["model=mini", "task=paper_standin", "method=dense", "eval.confirm_unsafe_code=true"],
     "would generate 384 new tokens, but mini has 256 positions in all"),
    (["scheduler.admission=union", "eval.batching=static"], "scheduler.admission=union chooses who takes a free slot: it needs"),
    (["model.experts_impl=deepgemm_megamoe"], "model.experts_impl='deepgemm_megamoe' is not valid"),  # FP8 checkpoints only
    (["task.include_path=no_such_folder"], "task.include_path=no_such_folder: no folder at"),
    (["+model.arch.num_expertz=4"], "model.arch.num_expertz is not a field of qwen3_moe's config; did you mean "
                                    "model.arch.num_experts?"),  # transformers keeps it as an attribute nothing reads
    (["model.experts_impl=deepgemm"], "model.experts_impl: deepgemm "),  # a hub kernel: `kernels`, CUDA, bf16
    (["stage=throughput", "throughput.mode=stream", "stream.prompt_len=[10,5]"], "stream.prompt_len=[10, 5]: low 10 is above high 5"),
    (["stage=throughput", "throughput.mode=stream", "stream.rate=0"], "stream.rate=0.0 is out of range: must be a number > 0.0"),
    (["stage=throughput", "throughput.mode=stream", "stream.lengths_from=nowhere/samples.jsonl"],
     "stream.lengths_from=nowhere/samples.jsonl: no such file"),
    (["stage=throughput", "throughput.mode=serve", "serve.rates=[null,0]"],
     "serve.rates[1]=0.0 is out of range: must be a number > 0.0"),
    (["stage=throughput", "throughput.mode=serve", "serve.rates=[4,4.0]"], "serve.rates=[4.0, 4.0] repeats a rate"),
    (["stage=throughput", "throughput.mode=serve", "serve.rates=[]"], "serve.rates is empty"),
    # a rule the kernel cannot run, asked for on it (it would run on the reference, recorded as triton)
    (["method=oracle", "budget=2", "method.backend=triton"], "method.backend=triton: oracle has no kernel form"),
    # k0 above the model's top-k in a list (method.k0 is refused the same way)
    (["stage=throughput", "throughput.prompt_len=16", "throughput.gen_tokens=9", "throughput.batch_sizes=[2]",
      "throughput.profile_batch=null", "throughput.methods=[dense,oea:9]"],
     "throughput.methods has oea:9: k0=9 exceeds the model's top-k (4 for tiny_qwen3)"),
    (["method=router_sq", "budget=2", "diagnose.rules=[base_anchor:7]"],
     "diagnose.rules has base_anchor:7: k0=7 exceeds the model's top-k (4 for tiny_qwen3)"),
    # issue 43: duplicates named twice were measured (or counted) twice; options a CPU never acts on
    (["task.tasks=[smoke_copy,smoke_copy]"], "task.tasks=['smoke_copy', 'smoke_copy'] names smoke_copy more than once"),
    (["stage=throughput", "throughput.batch_sizes=[2,2]"], "throughput.batch_sizes=[2, 2] names 2 more than once"),
    (["stage=throughput", "throughput.batch_sizes=[2]", "throughput.profile_batch=7"],
     "throughput.profile_batch=7 is not among throughput.batch_sizes=[2]"),
    (["stage=throughput", "throughput.mode=serve", "serve.repeats=0"], "serve.repeats=0 is out of range: must be >= 1"),
    (["stage=throughput", "throughput.mode=serve", "serve.slo_tpot_ms=0"], "serve.slo_tpot_ms=0.0 is out of range"),
    (["stage=throughput", "throughput.mode=serve", "stream.rate=4"],
     "stream.rate=4.0 is for throughput.mode=stream; throughput.mode=serve takes its request rates from serve.rates"),
    (["stage=throughput", "throughput.mode=serve", "scheduler.admission=union"],
     "scheduler.admission=union: throughput.mode=serve admits fifo only"),
    (["stage=throughput", "scheduler.admission=union"],
     "scheduler.admission=union would be ignored: throughput.mode=steps times full batches"),
    # a forgotten stage=throughput: an evaluation would run instead of the benchmark asked for
    (["method=router_sq", "throughput.methods=[dense,router_sum]"],
     "throughput.methods=['dense', 'router_sum'] would be ignored: only stage=throughput"),
    (["stream.rate=2"], "stream.rate=2.0 would be ignored: only stage=throughput"),
    (["stage=describe", "throughput.repeats=3"], "throughput.repeats=3 would be ignored: only stage=throughput"),
    (["scheduler.packing=ragged"], "scheduler.packing='ragged' is not valid; choose one of: packed, padded"),
    (["scheduler.chunked=true", "scheduler.packing=padded"], "scheduler.chunked=true rides prompt chunks in the decode"),
    # engine forms (METHOD+FORM) went with the last one, compile_prefill (2026-12-06: it won its A/B
    # and is the only prefill where regions compile); route_in_select, fused and fold lost theirs,
    # skinny won it and is in the default region
    (["stage=throughput", "throughput.mode=stream", "throughput.methods=[dense,base+compile_prefill]"],
     "throughput.methods[]='base+compile_prefill': +compile_prefill was removed after it won its A/B"),
    (["stage=throughput", "method.backend=triton", "throughput.methods=[dense,base+route_in_select]"],
     "throughput.methods[]='base+route_in_select': '+' takes nothing here: a method is NAME, NAME:K0"),
    (["stage=throughput", "throughput.methods=[dense,base+skinny]"],
     "throughput.methods[]='base+skinny': '+' takes nothing here"),
    (["method=base", "budget=4", "diagnose.rules=[base+x]"], "a rule here takes no engine form (+x)"),
    (["scheduler.buckets=[128,64]"], "scheduler.buckets=[128, 64] must be strictly increasing"),
    (["scheduler.chunked=true", "scheduler.chunk_tokens=4096"], "scheduler.chunk_tokens=4096 is out of range: must be [1, 2048]"),
    (["scheduler.max_wait_steps=-1"], "scheduler.max_wait_steps=-1 is out of range: must be >= 0"),
    (["eval.engine=off"], "eval.engine=off decodes through transformers' generate, which batches statically"),
    (["eval.temperature=-1"], "eval.temperature=-1.0 is out of range: must be a number >= 1e-05 and <= 100.0"),
    pytest.param(["task.tasks=[smoke_copyy]"], "unknown lm-eval task 'smoke_copyy'; close matches: smoke_copy",
                 marks=pytest.mark.slow),  # the close matches come from lm-eval's whole task index (~15 s)
    ("empty_task", "could not be built (its data is empty)"),
    (["method=base", "budget=null"], "method=base needs a budget (budget=1..number of experts); for no budget use method=dense"),
    (["method=oea", "method.k0=99", "budget=null"], "method.k0=99 exceeds the model's top-k (4 for tiny_qwen3)"),
    (["method=base_anchor", "method.k0=null"], "method=base_anchor needs method.k0"),
    (["method=base", "method.coverage=0"], "method.coverage must be in (0, 1] or null, got 0.0"),
    (["method=count", "method.coverage=0.9"], "method.coverage needs an additive-cost selector: base, calib_energy"),
    (["method=base", "method.budget_split=even"], "method.budget_split='even' is not valid; choose one of: uniform, sensitivity"),
    (["method=oea", "method.k0=1", "budget=null", "method.budget_split=sensitivity"],
     "method.budget_split=sensitivity splits a budget across layers: it needs a budgeted selector"),
    (["predictor.ridge=-1"], "predictor.ridge=-1.0 is out of range: must be a number >= 0.0 and <= 1000000.0"),
    (["calibration.seq_len=100000"], "calibration.seq_len=100000 is out of range: must be [2, 8192]"),
    (["stage=throughput", "method=base", "budget=null"], "throughput of base needs budgets: set budget= or"),
    ("loglikelihood", "score by log-likelihood and never decode: method=base changes decode steps only"),
    ("unsafe", "shape_code execute model-written code; to run them, set eval.confirm_unsafe_code=true"),
    (["budget=300"], "budget=300 exceeds the 16 experts of tiny_qwen3; choose 1..16 or null (dense)"),
]


@pytest.mark.parametrize("case, message", CASES,
                         ids=[(c.values if hasattr(c, "values") else c)[1][:40] for c in CASES])
def test_bad_input_fails_at_start_with_a_clear_message(compose, tmp_path, case, message):
    builders = {"garbage": lambda: _predictor_file(tmp_path, "garbage"),
                "other_model": lambda: _predictor_file(tmp_path, "other"),
                "nan_predictor": lambda: _predictor_file(tmp_path, "nan"),
                "shape_predictor": lambda: _predictor_file(tmp_path, "shape"),
                "no_r2_predictor": lambda: _predictor_file(tmp_path, "no_r2"),
                "malformed_calibration": lambda: _calibration_file(tmp_path, "malformed"),
                "short_calibration": lambda: _calibration_file(tmp_path, "short"),
                "damaged_checkpoint": lambda: _damaged_checkpoint(tmp_path),
                "garbage_for_diagnostic": lambda: [*_predictor_file(tmp_path, "garbage")[:1], "method=router_sq",
                                                   "budget=2"],
                "folder_as_predictor": lambda: [f"predictor.path={tmp_path}", "method=base", "budget=2"],
                "file_as_artifacts_dir": lambda: [f"artifacts_dir={_a_file(tmp_path)}", "method=base", "budget=2"],
                "empty_task": lambda: _empty_task(tmp_path),
                "loglikelihood": lambda: [*_shaped_task(tmp_path, "loglikelihood"), "method=base", "budget=2"],
                "unsafe": lambda: _shaped_task(tmp_path, "unsafe")}
    overrides = case if isinstance(case, list) else builders[case]()
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as err:
        cfg = compose([*FAST, f"artifacts_dir={tmp_path}/artifacts", *overrides])
        rc = run.build_config(cfg, out)
        run_pipeline(rc, OmegaConf.to_yaml(cfg))
    assert message in str(err.value)
    assert not out.exists() and not (tmp_path / "artifacts").exists()  # nothing written


@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_run_py_prints_the_message_without_a_traceback(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), f"outputs_dir={tmp_path}", *FAST,
                           "method=oea", "method.k0=99", "budget=null"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 2
    assert "error: method.k0=99 exceeds the model's top-k" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    written = [p for p in tmp_path.rglob("*") if p.is_file() and ".hydra" not in p.parts and p.suffix != ".log"]
    assert written == []  # Hydra's own .hydra/ and log aside, the run wrote nothing


@pytest.mark.parametrize("override, message", [
    ("exp_name=../../escaped", "exp_name='../../escaped' must be a plain folder name"),
    ("exp_name=ok,/tmp/escaped", "exp_name='/tmp/escaped' must be a plain folder name"),  # one of a sweep's names
    ("outputs_dir={tmp}/a_file/runs", "is a file, not a folder; give a folder path"),
])
def test_outputs_stay_in_outputs_dir(tmp_path, override, message):
    """Refused on the command line, before Hydra makes a folder: nothing appears anywhere."""
    import subprocess
    import sys

    _a_file(tmp_path)
    work = tmp_path / "work" / "deep"
    work.mkdir(parents=True)
    sweep = ["-m"] if "," in override else []
    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), *sweep, *FAST, "stage=describe",
                           override.format(tmp=tmp_path)], cwd=work, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a_file", "deep", "work"]


def test_describe_reads_no_calibration(compose, tmp_path):
    """stage=describe plans memory only: calibration files it will never read are not checked."""
    from base.run.preflight import preflight

    cfg = compose([*FAST, "stage=describe", "method=base", "budget=2", "calibration.files=[missing.txt]"])
    preflight(run.build_config(cfg, tmp_path / "out"))


def test_a_rule_without_artifacts_reads_calibration_only_for_its_diagnostic(compose, tmp_path):
    """router_sq reads no calibration: with the diagnostic off (or its rules without base and
    base_anchor) a calibration too small for a predictor fit is not its concern."""
    from base.run.preflight import preflight

    small = ["method=router_sq", "budget=2", "calibration.num_tokens=32", "calibration.tokens_per_expert=1",
             "calibration.seq_len=16"]
    for extra in (["diagnose.enabled=false"], ["diagnose.rules=[router_sum]"],
                  ["diagnose.enabled=false", "calibration.files=[missing.txt]"]):  # nothing reads them
        preflight(run.build_config(compose([*FAST, *small, *extra]), tmp_path / "out"))
    with pytest.raises(ConfigError, match="only the start-time diagnostic reads it, not method=router_sq"):
        preflight(run.build_config(compose([*FAST, *small]), tmp_path / "out"))


def test_run_folder_names_hold_no_path_separators():
    assert run.run_name("model.path=/data/ckpt,calibration.files=[..\\x.txt]") == "model.path=_data_ckpt,calibration.files=[.._x.txt]"


def test_a_predictor_fitted_for_this_model_passes_preflight(compose, tmp_path):
    """The other-model check compares name, experts and hidden size: a matching file passes."""
    import torch

    from base.hf.loading import hf_config
    from base.method.predictor import Predictor
    from base.run.preflight import preflight

    path = tmp_path / "p.safetensors"
    rc = run.build_config(compose([*FAST, f"predictor.path={path}", "method=base", "budget=2"]), tmp_path / "o")
    H = hf_config(rc.model, ROOT).hidden_size
    E = hf_config(rc.model, ROOT).num_experts
    meta = {"model": {"name": "tiny_qwen3", "num_layers": 2, "num_experts": E, "hidden": H}, "r2": [0.5, 0.5]}
    Predictor(torch.zeros(2, H, E), torch.zeros(2, E), meta).save(path)
    preflight(rc)


def test_dense_may_score_by_log_likelihood_and_confirmed_code_tasks_pass(compose, tmp_path):
    from base.run.preflight import check_tasks

    mc = run.build_config(compose([*FAST, "method=dense", *_shaped_task(tmp_path, "loglikelihood")]), tmp_path / "o")
    check_tasks(mc)  # no budget: nothing to refuse
    code = run.build_config(compose([*FAST, "eval.confirm_unsafe_code=true", *_shaped_task(tmp_path, "unsafe")]),
                            tmp_path / "o")
    check_tasks(code)


def test_task_paper_sets_the_papers_decoding(compose, tmp_path):
    rc = run.build_config(compose(["task=paper"]), tmp_path)
    e = rc.eval
    assert (e.do_sample, e.temperature, e.top_p, e.top_k, e.gen_tokens) == (True, 0.7, 0.8, 20, 384)
    assert rc.task.tasks[0] == "gsm8k" and "humaneval" in rc.task.tasks
    assert run.build_config(compose(["task=paper", "eval.gen_tokens=64"]), tmp_path).eval.gen_tokens == 64


# A value of the wrong type, or a key the schema does not have, fails when Hydra composes the
# configuration (run.py's RunSchema), naming the key: before anything runs or is written.
@pytest.mark.parametrize("override, key", [
    ("budget=abc", "budget"), ("eval.seed=abc", "eval.seed"), ("eval.fidelity=maybe", "eval.fidelity"),
    ("method.coverage=abc", "method.coverage"), ("force=maybe", "force"),
    ("model.trust_remote_code=maybe", "model.trust_remote_code"), ("eval.confirm_unsafe_code=sure", "eval.confirm_unsafe_code"),
    ("bogus=1", "bogus"), ("method.bogus=1", "method.bogus"),
    ("method.route_in_select=true", "method.route_in_select"),  # removed: it lost its A/B (issue 42/44)
    ("throughput.fused_attention=true", "throughput.fused_attention"),  # removed: lost its A/B (2026-12-05)
    ("throughput.fold_input_norm=true", "throughput.fold_input_norm"),  # likewise
    ("throughput.pdl=true", "throughput.pdl"),  # removed: lost its A/Bs (issue 42 item 4, 2026-12-05)
    ("throughput.regions=modules", "throughput.regions"),  # removed: layer, modules lost to layer_combo (issue 42)
])
def test_a_value_of_the_wrong_type_fails_at_composition_naming_the_key(compose, override, key):
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    with pytest.raises((HydraException, OmegaConfBaseException)) as err:
        compose([*FAST, override])
    assert key.split(".")[-1] in str(err.value)


@pytest.mark.parametrize("text, value", [("no", False), ("false", False), ("off", False), ("yes", True),
                                         ("true", True), ("on", True)])
def test_switches_are_booleans_that_mean_what_they_say(compose, tmp_path, text, value):
    cfg = compose([*FAST, f"force={text}", f"model.trust_remote_code={text}", f"eval.confirm_unsafe_code={text}",
                   f"eval.do_sample={text}"])
    rc = run.build_config(cfg, tmp_path)
    assert (rc.force, rc.model.trust_remote_code, rc.eval.confirm_unsafe_code, rc.eval.do_sample) == (value,) * 4


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_the_machine_lacks_is_refused_at_start(compose, tmp_path):
    with pytest.raises(ConfigError, match="model.device=cuda but this machine has no CUDA GPU"):
        cfg = compose([*FAST, "model.device=cuda"])
        run_pipeline(run.build_config(cfg, tmp_path / "out"), OmegaConf.to_yaml(cfg))
    assert not (tmp_path / "out").exists()
