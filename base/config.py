"""Typed run configuration. Built once from Hydra in run.py, validated here, passed down.

Nothing in base/ reads Hydra: these dataclasses are the only way configuration enters.
"""
from __future__ import annotations

import sys
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from base.checks import ConfigError, check_choice, check_float, check_int, check_unique
from base.method.options import REASSIGN_MODES, RENORMALIZE_MODES, PredictorConfig

STAGES = ("calibrate", "fit", "evaluate", "throughput", "describe")
MAX_ARRIVAL_SPAN_S = 86_400  # a request stream's mean arrival span (requests / rate), at most a day
CACHE_ROUND = 256  # an engine's cache length for a set of requests: the longest rounded up to this
INITS = ("pretrained", "random")
DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda", "meta")
DEVICE_MAPS = ("auto",)  # or null
APPLY_TO = ("decode", "all")
EVAL_ORDERS = ("mixed", "lm_eval")
BATCHINGS = ("continuous", "static")
ADMISSIONS = ("fifo", "union")
ROUTINGS = ("uniform", "skewed")
MAX_SEED = 2**32 - 1  # numpy's generator (lm-eval seeds it with `seed`) takes seeds in [0, 2**32 - 1]
# Sampling temperatures: below MIN the decode engine clamps (base/runtime/sampling.py), so it and
# transformers' generate would sample differently (and logits / T overflows toward 1e-38); above MAX
# the next-token distribution is within exp(30 / 100) = 1.35x of uniform over the kept tokens for
# the logit ranges of trained models (~30): noise, not the model's text.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-5, 100.0
THROUGHPUT_MODES = ("steps", "stream", "serve")
PROFILE_BATCH = 16  # ThroughputConfig.profile_batch's default
PACKINGS = ("packed", "padded")
ADMISSION_KEYS = ("admission", "max_wait_rounds")  # SchedulerConfig's admission policy
# The packed prefill's stream lengths (one CUDA graph each; in an evaluation on a GPU, one compile at
# a bucket's first use). conf/experiment/serve.yaml adds the points between (96, 192, ...): in an
# interleaved A/B on an H100 (results/serve/grid_2026-12-06c) they cut the 64-request burst's prefill
# by 7 % and base M=16 served 2.0 % more tokens/s (dense 1.0 %). The default stays at powers of two:
# a finished run keeps its config hash, and a short run compiles fewer shapes (not measured).
DEFAULT_BUCKETS = (64, 128, 256, 512, 1024, 2048)
# Keys renamed or moved (issue 44), old -> new: an old key is refused at start, naming the new one
# (run.py); base/run/outputs.py hashes a configuration with them where runs recorded them.
RENAMED_KEYS = {"eval.gen_toks": "eval.gen_tokens", "eval.max_gen_toks": "eval.max_gen_tokens",
                "eval.admission": "scheduler.admission", "stream.admission": "scheduler.admission",
                "eval.max_wait_rounds": "scheduler.max_wait_rounds",
                "stream.max_wait_rounds": "scheduler.max_wait_rounds"}
# Engine options deleted after their A/Bs, with why (docs/engine.md, "The switches that remain"): an
# override of one is refused at start saying so (run.py), not as an unknown key. Those that runs were
# recorded with are also in base/run/outputs.py REMOVED_OPTIONS (the value that matches what runs now),
# which keeps such a run's config hash: delete an option in both places.
DELETED_KEYS = {"method.route_in_select": "it made base M=16's step 36 % slower",
                "throughput.fused_attention": "it made the step slower despite fewer kernels",
                "throughput.fold_input_norm": "it made the step slower despite fewer kernels",
                "throughput.pdl": "it made dense 1.7-1.9 % and base M=16 4.3-4.6 % slower",
                "throughput.regions": "layer and modules made the step slower than layer_combo, the form every "
                                      "compiled step now runs",
                "scheduler.compile_prefill": "false, the eager packed prefill, served base M=16 7 % fewer tokens/s "
                                             "than true; every packed prefill now runs compiled where the decode "
                                             "step is compiled (a GPU with throughput.compile)"}


@dataclass
class ModelConfig:
    name: str  # the conf/model/<name>.yaml key; names artifacts and outputs
    family: str  # registered family (base/hf/families.py): qwen3_moe, qwen2_moe, deepseek_v2, ...
    path: str  # hub id or local directory (relative paths resolve against the repo root)
    init: str = "pretrained"  # pretrained: load weights from path; random: build arch with random weights
    dtype: str = "bfloat16"
    device: str = "auto"  # auto = cuda if available else cpu; meta builds the shape without memory
    tokenizer: str | None = None  # path of a tokenizer; "bytes" = built-in byte-level; None = path
    trust_remote_code: bool = False
    experts_impl: str | None = None  # transformers experts implementation (eager, grouped_mm, ...,
    # base_triton); null: base_triton on CUDA, transformers' default elsewhere
    calib_files: list[str] | None = None  # this model's calibration text: replaces the default
    # calibration.files unless the command line sets calibration.files (run.py decides)
    arch: dict[str, Any] = field(default_factory=dict)  # HF config kwargs for the exact architecture
    routing: str = "uniform"  # init=random: uniform (as built) or skewed (base/hf/skew.py)
    skew_ratio: float = 0.6  # skewed: dense batch-16 union as a fraction of the uniform one
    device_map: str | None = None  # auto: whole decoder layers spread over the visible GPUs
    # (accelerate; base/hf/placement.py); null: the whole model on model.device

    def __post_init__(self) -> None:
        check_choice("model.init", self.init, INITS)
        check_choice("model.dtype", self.dtype, DTYPES)
        check_choice("model.device", self.device, DEVICES)
        if self.device_map is not None:
            check_choice("model.device_map", self.device_map, DEVICE_MAPS)
            if self.device not in ("auto", "cuda"):
                raise ConfigError(f"model.device_map={self.device_map} places the model over the GPUs; it needs "
                                  f"model.device=auto or cuda, got model.device={self.device}")
        if self.init == "random" and not self.arch:
            raise ConfigError(f"model {self.name}: init=random needs model.arch (the architecture numbers)")
        check_choice("model.routing", self.routing, ROUTINGS)
        if self.routing == "skewed" and self.init != "random":
            raise ConfigError("model.routing=skewed applies to random-weight models (model.init=random) only; "
                              "a trained model routes as it was trained")
        if not 0.0 < float(self.skew_ratio) <= 1.0:
            raise ConfigError(f"model.skew_ratio={self.skew_ratio} must be in (0, 1]")
        if self.routing != "skewed" and float(self.skew_ratio) != ModelConfig.skew_ratio:
            raise ConfigError(f"model.skew_ratio={self.skew_ratio} would be ignored: it sets model.routing=skewed's "
                              f"union; this run's routing is {self.routing}")


@dataclass
class MethodConfig:
    name: str  # a registered selector, or "dense"
    reassign: str = "backfill"  # what a token does when its experts are dropped
    renormalize: str = "model"  # model: as the model does; always; never
    apply_to: str = "decode"  # decode: prefill stays dense; all: every forward
    k0: int | None = None  # oea, base_anchor: each token keeps its top-k0
    backend: str = "torch"  # torch reference, or triton kernels (kernels/)
    coverage: float | None = None  # adaptive budget: keep the fewest experts covering this share of the score
    budget_split: str = "uniform"  # uniform: `budget` in every layer; sensitivity: L x budget split by calibration
    # base and base_anchor: how far to trust the predicted norms (base/method/selectors.py shrunk): a
    # number in [0, 1] (0: every norm equal, router_sq's ranking; 1: base as fitted), or "auto": the
    # value the calibration-time diagnostic finds best at the run's budget (base/run/diagnose.py)
    shrink: str | None = None

    def __post_init__(self) -> None:
        from base.method.selectors import SELECTORS

        valid = ("dense", *SELECTORS.names())
        check_choice("method", self.name, valid)
        check_choice("method.reassign", self.reassign, REASSIGN_MODES)
        check_choice("method.renormalize", self.renormalize, RENORMALIZE_MODES)
        check_choice("method.apply_to", self.apply_to, APPLY_TO)
        check_choice("method.backend", self.backend, ("torch", "triton"))
        self.k0 = check_int("method.k0", self.k0, 1, allow_none=True)
        cls = SELECTORS.get(self.name) if self.name != "dense" else None
        if cls is not None and cls.needs_k0 and self.k0 is None:
            raise ConfigError(f"method={self.name} needs method.k0 (each token's top-k0 experts are kept)")
        check_choice("method.budget_split", self.budget_split, ("uniform", "sensitivity"))
        if self.budget_split == "sensitivity" and (cls is None or not cls.uses_budget or self.coverage is not None):
            raise ConfigError(f"method.budget_split=sensitivity splits a budget across layers: it needs a budgeted "
                              f"selector without method.coverage; got method={self.name}")
        if self.coverage is not None:
            from base.method.selectors import coverage_selectors

            try:
                self.coverage = float(self.coverage)
            except (TypeError, ValueError):
                raise ConfigError(f"method.coverage must be a number in (0, 1] or null, got {self.coverage!r}") from None
            if not 0 < self.coverage <= 1:
                raise ConfigError(f"method.coverage must be in (0, 1] or null, got {self.coverage}")
            if self.name not in coverage_selectors():
                raise ConfigError(f"method.coverage needs an additive-cost selector: {', '.join(coverage_selectors())}; "
                                  f"got method={self.name}")
        if self.shrink is not None:
            if cls is None or not cls.needs_predictor:
                raise ConfigError(f"method.shrink scales a predictor's norms: it needs base or base_anchor; got "
                                  f"method={self.name}")
            if str(self.shrink) != "auto":
                try:
                    value = float(self.shrink)
                except ValueError:
                    raise ConfigError(f"method.shrink={self.shrink!r} must be a number in [0, 1] or auto") from None
                self.shrink = str(check_float("method.shrink", value, low=0.0, high=1.0))

    def shrink_value(self) -> float | str | None:
        """method.shrink as the selector takes it: a float, "auto", or None (base as fitted)."""
        return None if self.shrink is None else ("auto" if self.shrink == "auto" else float(self.shrink))


@dataclass
class TaskConfig:
    name: str
    tasks: list[str]  # lm-eval task or group names
    include_path: str | None = None  # folder of extra lm-eval task YAMLs
    limit: int | None = None  # examples per task
    num_fewshot: int | None = None

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ConfigError(f"task {self.name}: tasks is empty")
        check_unique("task.tasks", list(self.tasks))
        # lm-eval slices each task's docs with itertools.islice, whose bound is sys.maxsize (2**63 at
        # most: a ValueError from inside lm-eval); a limit above a task's docs takes them all
        self.limit = check_int("task.limit", self.limit, 1, sys.maxsize, allow_none=True)
        self.num_fewshot = check_int("task.num_fewshot", self.num_fewshot, 0, allow_none=True)


@dataclass
class EvalConfig:
    order: str = "mixed"  # mixed: seeded shuffle of all tasks' requests; lm_eval: its length sort
    do_sample: bool = False
    temperature: float = 0.7
    top_p: float = 0.8
    top_k: int = 20
    max_gen_tokens: int | None = None  # cap over the tasks' own limit (their max_gen_toks)
    gen_tokens: int | None = None  # new tokens per request, set (replaces the tasks' own; the paper: 384)
    engine: str = "auto"  # decode through base/runtime/engine.py: auto = on a GPU (CUDA graphs); on; off
    confirm_unsafe_code: bool = False  # run tasks that execute model-written code (humaneval, mbpp)
    seed: int | None = None  # batching seed: the mixing order (which requests share a decode batch);
    # null = the run's seed. Changes nothing else (calibration, predictor and lm-eval keep `seed`)
    fidelity: bool = False  # also measure layer-output error, retained energy, next-token KL and the
    # teacher-forced log-likelihood change against dense, in the same decode batches (analysis only)
    batching: str = "continuous"  # continuous: a finished request's slot takes the next one
    # (base/runtime/continuous.py, admitted as scheduler.admission says), as a server does; static:
    # a batch ends with its longest request

    def __post_init__(self) -> None:
        check_choice("eval.order", self.order, EVAL_ORDERS)
        check_choice("eval.batching", self.batching, BATCHINGS)
        self.seed = check_int("eval.seed", self.seed, 0, allow_none=True)
        if self.seed is not None and self.order != "mixed":
            raise ConfigError(f"eval.seed={self.seed} would be ignored: it seeds eval.order=mixed's shuffle, and "
                              f"eval.order={self.order} keeps lm-eval's order")
        if not isinstance(self.fidelity, bool):
            raise ConfigError(f"eval.fidelity={self.fidelity!r} must be true or false")
        check_choice("eval.engine", self.engine, ("auto", "on", "off"))
        if self.batching == "continuous" and self.engine == "off":
            raise ConfigError("eval.engine=off decodes through transformers' generate, which batches statically: "
                              "use eval.batching=static with it, or eval.engine=auto|on")
        self.max_gen_tokens = check_int("eval.max_gen_tokens", self.max_gen_tokens, 1, allow_none=True)
        self.gen_tokens = check_int("eval.gen_tokens", self.gen_tokens, 1, allow_none=True)
        check_float("eval.temperature", self.temperature, low=MIN_TEMPERATURE, high=MAX_TEMPERATURE)
        check_float("eval.top_p", self.top_p, low=0.0, high=1.0, low_open=True)
        self.top_k = check_int("eval.top_k", self.top_k, 1)


@dataclass
class CalibConfig:
    files: list[str]  # local text or JSONL ("text" field) files, relative to the repo root
    num_tokens: int = 8192  # cut into seq_len windows (the last partial one dropped); files must hold as many
    seq_len: int = 128
    batch_size: int = 8
    all_experts: bool = False  # also record ||E_u(z)|| for every expert, not only routed ones
    # the calibration grows with the expert count: at least this many routed tokens per expert on
    # average, tokens_per_expert x E / K in all (`tokens`); num_tokens stays the floor (issue 41: a
    # 64-expert model left experts with fewer training tokens than weights at a fixed 8,192)
    tokens_per_expert: int = 1024

    def __post_init__(self) -> None:
        if not self.files:
            raise ConfigError("calibration.files is empty")
        self.num_tokens = check_int("calibration.num_tokens", self.num_tokens, 1)
        self.tokens_per_expert = check_int("calibration.tokens_per_expert", self.tokens_per_expert, 1)
        self.seq_len = check_int("calibration.seq_len", self.seq_len, 2, max(2, self.num_tokens))
        self.batch_size = check_int("calibration.batch_size", self.batch_size, 1)


def calibration_tokens(c: CalibConfig, num_experts: int, top_k: int) -> int:
    """The tokens a model's calibration runs on: num_tokens, or more where the expert count asks
    (tokens_per_expert routed tokens per expert on average: tokens_per_expert x E / K)."""
    return max(c.num_tokens, -(-c.tokens_per_expert * num_experts // top_k))


DIAGNOSE_RULES = ("router_sq", "base", "base_anchor:1")  # diagnose.rules=null: these beside the run's own


@dataclass
class DiagnoseConfig:
    """The calibration-time diagnostic (base/run/diagnose.py): before an evaluation of a budgeted
    rule, each rule of `rules` (null: the run's, router_sq, base, base_anchor with k0=1) decodes
    `prompts` held-out calibration prompts of `prompt_len` tokens free-running at the run's
    budget and batch size, `gen_tokens` new tokens each, scored by its agreement with dense; a
    rule significantly closer to dense than the run's is named in a warning and in report.json.
    Cached per model, calibration, budget and these settings."""

    enabled: bool = True
    prompts: int = 64
    prompt_len: int = 32
    gen_tokens: int = 16
    rules: list[str] | None = None  # entries as throughput.methods[]: router_sq, base_anchor:1, ...

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError(f"diagnose.enabled={self.enabled!r} must be true or false")
        self.prompts = check_int("diagnose.prompts", self.prompts, 2)
        self.prompt_len = check_int("diagnose.prompt_len", self.prompt_len, 1)
        self.gen_tokens = check_int("diagnose.gen_tokens", self.gen_tokens, 1)
        if self.rules is not None:
            for spec in self.rules:
                parse_method_spec(spec, "diagnose.rules[]", engine=False)
            check_unique("diagnose.rules", list(self.rules))


def parse_method_spec(spec: str, key: str = "throughput.methods[]", engine: bool = True) -> dict[str, Any]:
    """`router_sum`, `oea:2` (k0=2), `dense:grouped_mm` (an experts implementation) -> {"method",
    "k0", "impl"}, validated; `key` names the list in messages. A selector that reads k0 needs one,
    one that does not is refused one; `engine=False` (diagnose.rules: rules, not engines) refuses
    :IMPL."""
    from base.method.selectors import SELECTORS

    head, *forms = str(spec).split("+")
    if forms and not engine:
        raise ConfigError(f"{key}={spec!r}: a rule here takes no engine form (+{forms[0]})")
    if forms == ["compile_prefill"]:  # METHOD+FORM: a variant with an engine option of its own, until 2026-12-06
        raise ConfigError(f"{key}={spec!r}: +compile_prefill was removed after it won its A/B: every packed "
                          f"prefill now runs compiled where the decode step is compiled; write {head!r}")
    if forms:
        raise ConfigError(f"{key}={spec!r}: '+' takes nothing here: a method is NAME, NAME:K0 (e.g. oea:1) or "
                          f"dense:IMPL (an A/B of an engine key runs a b b a: experiments/gpu/roofline.sh PARTS=ab)")
    name, *opts = head.split(":")
    check_choice(key, name, ("dense", *SELECTORS.names()))
    out: dict[str, Any] = {"method": name, "k0": None, "impl": None}
    for opt in opts:
        if opt.isdigit():
            out["k0"] = check_int(f"{key}={spec!r} k0", opt, 1)
        elif opt and engine:
            out["impl"] = opt
        else:
            raise ConfigError(f"{key}={spec!r}: options are :K0 (each token's top-k0, e.g. oea:1)" +
                              (" and :IMPL (an experts implementation, e.g. dense:grouped_mm)" if engine else ""))
    reads_k0 = name != "dense" and SELECTORS.get(name).needs_k0
    if reads_k0 and out["k0"] is None:
        raise ConfigError(f"{key}={spec!r}: {name} needs its k0, e.g. {name}:1")
    if not reads_k0 and out["k0"] is not None:
        anchored = [n for n in SELECTORS.names() if SELECTORS.get(n).needs_k0]
        raise ConfigError(f"{key}={spec!r}: {name} reads no k0 (only {', '.join(anchored)} do)")
    return out


@dataclass
class ThroughputConfig:
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8, 16, 32, 64, 128])
    methods: list[str] | None = None  # null: dense and the run's method; entries as parse_method_spec
    budgets: list[int] | None = None  # for budgeted methods; null: the run's budget
    prompt_len: int = 256
    gen_tokens: int = 384  # new tokens per sequence, EOS ignored (the paper's setting); sizes the cache
    timed_steps: int | None = None  # decode steps timed (null: all gen_tokens - 1 after a GPU warm-up); the step's cost
    # does not depend on its position (static cache, masked), so fewer steps time the same step
    warmup: int = 4  # untimed graph replays before the timed ones
    repeats: int = 1  # timed passes per configuration, interleaved: the first in list order with the
    # other passes, then repeats - 1 more in rotated order; ms_per_step is the median over passes
    stats_steps: int = 16  # steps of the short passes: statistics, non-expert time, eager reference
    non_expert: bool = True  # CUDA: also time the step with the expert FFN skipped (dense, oea and
    # the first budget only: each is one more capture)
    eager_reference: bool = True  # CUDA: decode the first configuration eagerly once, for the record
    profile_batch: int | None = PROFILE_BATCH  # profile the step by kernel class at this batch size (null: never;
    # the default only where 16 is among batch_sizes, another value must be among them)
    compile: bool = True  # CUDA: each layer's attention half compiled once with Inductor's combo kernels, and
    # the attention's projections on kernels/skinny.py where the GPU's tuned table says they beat cuBLAS
    # (base/runtime/regional.py, base/hf/skinny_proj.py); false: the graph of the eager step
    mode: str = "steps"  # steps: full static batches, each decode step timed | stream: a request stream
    # through continuous batching with latency (base/runtime/stream.py; `stream.*`), batch_sizes = slots |
    # serve: a serving benchmark after `vllm bench serve` (base/runtime/serving.py; `serve.*`, requests
    # shaped by `stream.*`)

    @property
    def specs(self) -> list[dict[str, Any]] | None:
        return [parse_method_spec(m) for m in self.methods] if self.methods is not None else None

    def __post_init__(self) -> None:
        if not self.batch_sizes:
            raise ConfigError("throughput.batch_sizes is empty")
        self.batch_sizes = [check_int(f"throughput.batch_sizes[{i}]", b, 1) for i, b in enumerate(self.batch_sizes)]
        check_unique("throughput.batch_sizes", self.batch_sizes)
        self.budgets = None if self.budgets is None else [check_int(f"throughput.budgets[{i}]", b, 1)
                                                          for i, b in enumerate(self.budgets)]
        check_unique("throughput.budgets", self.budgets or [])
        for spec in self.methods or []:
            parse_method_spec(spec)  # fails with the valid choices
        check_unique("throughput.methods", list(self.methods or []))
        self.prompt_len = check_int("throughput.prompt_len", self.prompt_len, 1)
        self.gen_tokens = check_int("throughput.gen_tokens", self.gen_tokens, 2)
        self.warmup = check_int("throughput.warmup", self.warmup, 0)
        self.repeats = check_int("throughput.repeats", self.repeats, 1)
        self.stats_steps = check_int("throughput.stats_steps", self.stats_steps, 1)
        self.profile_batch = check_int("throughput.profile_batch", self.profile_batch, 1, allow_none=True)
        # the default (16) profiles when 16 is measured; another value must be one that is
        if (self.mode == "steps" and self.profile_batch not in (None, PROFILE_BATCH)
                and self.profile_batch not in self.batch_sizes):
            raise ConfigError(f"throughput.profile_batch={self.profile_batch} is not among throughput.batch_sizes="
                              f"{self.batch_sizes}: the profile is taken at a measured batch size; give one of them, or "
                              f"throughput.profile_batch=null for none")
        self.timed_steps = check_int("throughput.timed_steps", self.timed_steps, 1, self.gen_tokens - 1, allow_none=True,
                                     high_is="throughput.gen_tokens - 1")
        check_choice("throughput.mode", self.mode, THROUGHPUT_MODES)

    def warm_steps(self, graph: bool) -> int:
        """Untimed steps before a timed or statistics pass: with a CUDA graph, the capture's step and
        replays up to `warmup` (the cache holds gen_tokens new tokens); none when decoding eagerly."""
        return min(max(1, self.warmup), self.gen_tokens - 2) if graph else 0



def _changed(group: str, obj: Any, keys: Any) -> list[str]:
    """`group.key=value` for each of `keys` whose value differs from the dataclass default."""
    defaults = {f.name: f.default if f.default is not MISSING else f.default_factory() for f in fields(obj)
                if f.default is not MISSING or f.default_factory is not MISSING}
    return [f"{group}.{k}={getattr(obj, k)}" for k in keys if k in defaults and getattr(obj, k) != defaults[k]]


def _length_range(what: str, value: Any) -> list[int]:
    """[lo, hi] token lengths, drawn uniformly; one value (or lo == hi) is fixed."""
    values = value if isinstance(value, (list, tuple)) else [value]
    if not 1 <= len(values) <= 2:
        raise ConfigError(f"{what}={value!r} must be a length or [low, high]")
    lo, hi = (check_int(f"{what}[]", v, 1) for v in (values[0], values[-1]))
    if lo > hi:
        raise ConfigError(f"{what}={value!r}: low {lo} is above high {hi}")
    return [lo, hi]


def cache_length(longest: int) -> int:
    """The cache slots an engine gets for requests of at most `longest` prompt + new tokens (one
    length for every set of similar requests, so their graphs and compiled regions are shared)."""
    return -(-longest // CACHE_ROUND) * CACHE_ROUND


@dataclass
class StreamConfig:
    """throughput.mode=stream: requests through continuous batching, as a server receives them."""

    requests_per_slot: int = 8  # requests = slots x this, so that slots are refilled many times
    prompt_len: list[int] = field(default_factory=lambda: [128, 512])  # tokens, uniform in [low, high]
    output_len: list[int] = field(default_factory=lambda: [32, 256])  # new tokens, uniform (EOS ignored)
    rate: float | None = None  # Poisson arrivals per second; null: every request at once
    stats_requests_per_slot: int = 2  # the statistics pass (union, kept experts): a shorter stream
    lengths_from: str | None = None  # a run's samples.jsonl: draw (prompt, output) lengths from a
    # task's own requests instead of prompt_len / output_len

    def __post_init__(self) -> None:
        self.requests_per_slot = check_int("stream.requests_per_slot", self.requests_per_slot, 1)
        self.prompt_len = _length_range("stream.prompt_len", self.prompt_len)
        self.output_len = _length_range("stream.output_len", self.output_len)
        if self.output_len[0] < 2:
            raise ConfigError(f"stream.output_len={self.output_len}: at least 2 new tokens (one decode step)")
        if self.rate is not None:
            self.rate = check_float("stream.rate", self.rate, low=0.0, low_open=True)
        self.stats_requests_per_slot = check_int("stream.stats_requests_per_slot", self.stats_requests_per_slot, 1)

    def longest(self, lengths: list[tuple[int, int]] | None = None) -> int:
        """A stream's longest request, prompt + new tokens: of `lengths` (lengths_from's pairs), else the highs."""
        return max(p + o for p, o in lengths) if lengths else self.prompt_len[1] + self.output_len[1]

    def task_lengths(self, root: Path) -> list[tuple[int, int]] | None:
        """The (prompt, output) token lengths of `lengths_from`'s requests, or None."""
        if self.lengths_from is None:
            return None
        import json

        path = Path(self.lengths_from) if Path(self.lengths_from).is_absolute() else root / self.lengths_from
        if path.is_dir():
            raise ConfigError(f"stream.lengths_from={self.lengths_from} is a folder; give a run's samples.jsonl")
        if not path.is_file():
            raise ConfigError(f"stream.lengths_from={self.lengths_from}: no such file (a run's samples.jsonl)")
        pairs = []
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            p, n = (row.get("prompt_tokens"), row.get("new_tokens")) if isinstance(row, dict) else (None, None)
            counts = all(v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0) for v in (p, n))
            if not isinstance(row, dict) or not counts:
                raise ConfigError(f"stream.lengths_from={self.lengths_from}: line {number} is not a JSON object whose "
                                  f"prompt_tokens and new_tokens are whole numbers >= 0 (or null): {line[:80]!r}")
            if p and n and n >= 2:  # requests that decoded at least one step
                pairs.append((p, n))
        if not pairs:
            raise ConfigError(f"stream.lengths_from={self.lengths_from}: no request with prompt_tokens and at least "
                              f"2 new_tokens (samples.jsonl of an evaluate run made since issue 18)")
        return pairs


@dataclass
class ServeConfig:
    """throughput.mode=serve: Poisson arrivals at several rates, repeats with the variants' order
    rotated, per-request latency and goodput (base/runtime/serving.py). The requests' lengths come
    from `stream.*`; admission is FIFO."""

    rates: list[float | None] = field(default_factory=lambda: [None, 4.0, 16.0])  # requests/s of
    # each stream's Poisson arrivals; null: the closed burst (every request at once)
    requests: int = 12  # requests per stream: the same prompts and lengths at every rate
    repeats: int = 3  # each repeat serves every (rate, variant), the variants' order rotated
    slo_ttft_ms: float = 500.0  # goodput counts the requests with TTFT and TPOT within these
    slo_tpot_ms: float = 25.0
    search_steps: int = 0  # > 0: bisect for the highest rate meeting the SLOs, one stream per step
    search_range: list[float] = field(default_factory=lambda: [1.0, 64.0])  # requests/s, low and high
    search_attainment: float = 0.9  # a rate is sustained when this share of its requests meet both SLOs

    def __post_init__(self) -> None:
        if not self.rates:
            raise ConfigError("serve.rates is empty: give request rates (requests/s) and/or null for the burst")
        self.rates = [None if r is None else check_float(f"serve.rates[{i}]", r, low=0.0, low_open=True)
                      for i, r in enumerate(self.rates)]
        if len(set(self.rates)) != len(self.rates):
            raise ConfigError(f"serve.rates={self.rates} repeats a rate; give each once")
        self.requests = check_int("serve.requests", self.requests, 1)
        self.repeats = check_int("serve.repeats", self.repeats, 1)
        self.slo_ttft_ms = check_float("serve.slo_ttft_ms", self.slo_ttft_ms, low=0.0, low_open=True)
        self.slo_tpot_ms = check_float("serve.slo_tpot_ms", self.slo_tpot_ms, low=0.0, low_open=True)
        self.search_steps = check_int("serve.search_steps", self.search_steps, 0)
        rng = list(self.search_range) if isinstance(self.search_range, (list, tuple)) else None
        if rng is None or len(rng) != 2:
            raise ConfigError(f"serve.search_range={self.search_range!r}: give [low, high] in requests/s, 0 < low < high")
        low = check_float("serve.search_range[0]", rng[0], low=0.0, low_open=True)
        high = check_float("serve.search_range[1]", rng[1], low=0.0, low_open=True)
        if not low < high:
            raise ConfigError(f"serve.search_range={[low, high]}: low must be below high (requests/s)")
        self.search_range = [low, high]
        self.search_attainment = check_float("serve.search_attainment", self.search_attainment, low=0.0,
                                             low_open=True, high=1.0)


@dataclass
class SchedulerConfig:
    """Whom the continuous-batching engine admits, how it prefills and when
    (base/runtime/scheduler.py): evaluation with eval.batching=continuous and throughput.mode=stream
    or serve all serve through it.

    A prefill (a round of its own, or chunks riding in mixed steps) starts when a slot is free and
    the round it would admit (the first waiting requests the free slots take) holds
    `min_prompt_tokens` prompt tokens, or a free slot and a waiting request have both waited
    `max_wait_steps` steps, or no slot is decoding; otherwise the running slots decode first.
    Fewer, larger rounds stream each layer's expert weights fewer times; the price is TTFT."""

    packing: str = "packed"  # packed: a round's prompts as one token stream, no padding, varlen
    # attention (kernels/varlen_attention.py), one CUDA graph per token bucket | padded: left-padded
    # to the round's longest prompt, eager (the engine before issue 26)
    chunked: bool = False  # prompt chunks share a step with the decoding slots (mixed steps)
    chunk_tokens: int = 256  # prompt tokens per mixed step at most
    buckets: list[int] = field(default_factory=lambda: list(DEFAULT_BUCKETS))  # packed stream
    # lengths: a forward is padded to the smallest bucket that holds it (one graph per bucket)
    min_prompt_tokens: int = 1  # prompt tokens of the round admitted now that start a prefill (1: at once)
    max_wait_steps: int = 0  # ... or steps a free slot and a waiting request have both waited
    overlap: bool = True  # the host reads step i's tokens while step i+1 runs (no per-step sync); false:
    # it also waits for each step before launching the next. Timing only: the schedule is the same
    admission: str = "fifo"  # who takes a free slot: fifo (arrival order; evaluation: the mixed order) |
    # union: the waiting request whose predicted experts overlap the running batch most (base/runtime/admission.py)
    max_wait_rounds: int = 4  # union: a request passed over this many admission rounds goes next

    def __post_init__(self) -> None:
        check_choice("scheduler.packing", self.packing, PACKINGS)
        check_choice("scheduler.admission", self.admission, ADMISSIONS)
        self.max_wait_rounds = check_int("scheduler.max_wait_rounds", self.max_wait_rounds, 0)
        for key in ("chunked", "overlap"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"scheduler.{key}={getattr(self, key)!r} must be true or false")
        if not self.buckets:
            raise ConfigError(f"scheduler.buckets is empty: give token counts, e.g. {list(DEFAULT_BUCKETS)}")
        self.buckets = [check_int(f"scheduler.buckets[{i}]", b, 1) for i, b in enumerate(self.buckets)]
        if self.buckets != sorted(set(self.buckets)):
            raise ConfigError(f"scheduler.buckets={self.buckets} must be strictly increasing")
        # a mixed step's chunk is one packed stream: it fits the largest bucket
        self.chunk_tokens = check_int("scheduler.chunk_tokens", self.chunk_tokens, 1,
                                      self.buckets[-1] if self.chunked else None)
        self.min_prompt_tokens = check_int("scheduler.min_prompt_tokens", self.min_prompt_tokens, 1)
        self.max_wait_steps = check_int("scheduler.max_wait_steps", self.max_wait_steps, 0)
        if self.chunked and self.packing != "packed":
            raise ConfigError("scheduler.chunked=true rides prompt chunks in the decode step's packed stream: "
                              "it needs scheduler.packing=packed")
        # base/runtime/scheduler.py prefill_due: a prefill starts when enough prompt tokens wait OR the
        # oldest has waited max_wait_steps, so at 0 waiting steps the token threshold never holds one back
        if self.min_prompt_tokens > 1 and self.max_wait_steps == 0:
            raise ConfigError(f"scheduler.min_prompt_tokens={self.min_prompt_tokens} would be ignored: with "
                              f"scheduler.max_wait_steps=0 a prefill starts at once; set max_wait_steps >= 1 (the "
                              f"steps a waiting request may be held back for more prompt tokens)")


@dataclass
class DescribeConfig:
    gpu_gb: float = 141.0  # stage=describe: GPUs of this size (GB) for the count it reports (H200 141, H100 80)

    def __post_init__(self) -> None:
        self.gpu_gb = check_float("describe.gpu_gb", self.gpu_gb, low=0.0, low_open=True)


@dataclass
class StatsConfig:
    enabled: bool = True
    energy: bool = False  # true retained energy: runs every routed expert (analysis only)

    def __post_init__(self) -> None:
        if self.energy and not self.enabled:
            raise ConfigError("stats.energy=true would be ignored: stats.enabled=false records no statistics")


@dataclass
class LoggerConfig:
    name: str = "wandb"  # wandb | none
    mode: str = "offline"  # offline | online
    project: str = "base-moe"
    dir: str = "outputs/wandb"  # every run's offline files, in one place: `wandb sync <dir>/wandb` uploads them

    def __post_init__(self) -> None:
        check_choice("logger", self.name, ("wandb", "none"))
        check_choice("logger.mode", self.mode, ("offline", "online", "disabled"))


# RunConfig's fields run.py fills in itself: no key of conf/config.yaml (config_fields)
FILLED = {"filled": True}


@dataclass(kw_only=True)
class RunConfig:
    """The run, as conf/config.yaml's keys give it (in its order) and run.py completes it. This is the
    one list of the configuration's groups and top-level keys: run.py builds Hydra's typed schema
    and this object from config_fields(), so a key or group added here is added everywhere."""

    model: ModelConfig
    method: MethodConfig
    task: TaskConfig
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    budget: int | None  # distinct routed experts kept per MoE layer per decode step; null = dense
    batch_size: int  # concurrent decode requests sharing the budget
    seed: int
    stage: str
    force: bool = False
    experiment: str = field(default="default", metadata={"key": "exp_name"})
    artifacts_dir: Path = field(metadata={"yaml": str})
    eval: EvalConfig = field(default_factory=EvalConfig)
    calibration: CalibConfig | None = None
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    throughput: ThroughputConfig | None = None
    stream: StreamConfig = field(default_factory=StreamConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    stats: StatsConfig = field(default_factory=StatsConfig)
    describe: DescribeConfig = field(default_factory=DescribeConfig)
    diagnose: DiagnoseConfig = field(default_factory=DiagnoseConfig)
    out_dir: Path = field(metadata=FILLED)
    root: Path = field(metadata=FILLED)  # repo root: relative paths in configs resolve against it
    overrides: str = field(default="", metadata=FILLED)  # the run's command-line overrides (its folder name
    # may be shortened)
    run_key: str = field(default="", metadata=FILLED)  # the overrides that name its folder (Hydra's
    # override_dirname): the folder's marker
    started: float = field(default=0.0, metadata=FILLED)  # when the command (a sweep's launching process)
    # started: with force, an artifact made since then was recomputed by another job of this sweep and is reused

    def __post_init__(self) -> None:
        check_choice("stage", self.stage, STAGES)
        self.budget = check_int("budget", self.budget, 1, allow_none=True)
        from base.method.selectors import SELECTORS

        if self.method.name == "dense" or (self.stage != "throughput" and not SELECTORS.get(self.method.name).uses_budget):
            # dense keeps every routed expert, oea every token's top-k0, whatever the budget says (the run
            # and its records say none). A throughput run's budget is its other methods' (throughput.methods)
            self.budget = None
        self.batch_size = check_int("batch_size", self.batch_size, 1)
        self.seed = check_int("seed", self.seed, 0, MAX_SEED)
        self._check_method_budget()
        if self.predictor.fit_on == "all" and not self.calibration.all_experts:
            raise ConfigError("predictor.fit_on=all fits on every expert's norm, which only a calibration with "
                              "calibration.all_experts=true records; set both, or leave fit_on=routed")
        self._check_unused_options()
        self._check_backend()
        self._check_serve()
        self._check_admission()
        self._check_arrival_span()

    def _check_unused_options(self) -> None:
        """An option moved off its default that this run never reads is refused, naming it: ignored,
        it would make a run other than the one asked for (method.k0=2 on router_sum, sampling
        settings with greedy decoding, method options on dense)."""
        from base.method.selectors import SELECTORS

        unused: list[tuple[list[str], str]] = []  # (key=value, ...), why this run does not read them
        tp = self.throughput
        if self.stage == "evaluate" or (self.stage == "throughput" and tp is not None):
            specs = tp.specs if self.stage == "throughput" and tp is not None else None
            anchored = [n for n in SELECTORS.names() if SELECTORS.get(n).needs_k0]
            if self.method.k0 is not None and (specs or self.method.name not in anchored):
                unused.append(([f"method.k0={self.method.k0}"], f"only {', '.join(anchored)} read it" +
                               (" (throughput.methods gives each its own, e.g. oea:1)" if specs else "")))
            if all(name == "dense" for name in self.own_rules()):
                unused.append((_changed("method", self.method, ("reassign", "renormalize", "apply_to", "backend")),
                               "dense selects no experts"))
        if not self.scheduler.chunked:
            unused.append((_changed("scheduler", self.scheduler, ("chunk_tokens",)),
                           "only scheduler.chunked=true rides prompt chunks"))
        if self.stage == "evaluate" and self.eval.batching == "static":
            unused.append((_changed("scheduler", self.scheduler,  # admission: _check_admission says why
                                    [f.name for f in fields(SchedulerConfig) if f.name not in ADMISSION_KEYS]),
                           "eval.batching=static decodes fixed batches, without the continuous scheduler"))
        if self.stage == "evaluate":
            if not self.eval.do_sample:
                unused.append((_changed("eval", self.eval, ("temperature", "top_p", "top_k")),
                               "greedy decoding (eval.do_sample=false) does not sample"))
        if self.stage == "throughput" and tp is not None and tp.mode == "steps":
            unused.append((_changed("stream", self.stream, [f.name for f in fields(StreamConfig)]) +
                           _changed("scheduler", self.scheduler, ADMISSION_KEYS),
                           "throughput.mode=steps times full batches, no request stream"))
        elif self.scheduler.admission == "fifo" and self.stage in ("evaluate", "throughput"):
            unused.append((_changed("scheduler", self.scheduler, ("max_wait_rounds",)),
                           "scheduler.admission=fifo waits on no one"))
        if self.stage == "evaluate" or (self.stage == "throughput" and tp is not None and tp.mode != "serve"):
            unused.append((_changed("serve", self.serve, [f.name for f in fields(ServeConfig)]),
                           "only throughput.mode=serve (stage=throughput) reads serve.*"))
        if self.stage != "throughput" and tp is not None:  # a forgotten stage=throughput would run another stage
            read = ("batch_sizes", "prompt_len", "gen_tokens") if self.stage == "describe" else ()
            unused.append((_changed("throughput", tp, [f.name for f in fields(ThroughputConfig) if f.name not in read]) +
                           _changed("stream", self.stream, [f.name for f in fields(StreamConfig)]),
                           "only stage=throughput (experiment=throughput, stream or serve) reads throughput.* and "
                           "stream.*" + (" (stage=describe sizes the KV cache from throughput.batch_sizes, prompt_len "
                                         "and gen_tokens)" if self.stage == "describe" else "")))
        if self.predictor.path and self.stage != "fit" and not self._reads_predictor():
            unused.append(([f"predictor.path={self.predictor.path}"],
                           f"stage={self.stage} reads no predictor" if self.stage in ("calibrate", "describe") else
                           "no rule of this run (nor of its diagnostic) predicts norms: base and base_anchor do"))
        unused = [(keys, why) for keys, why in unused if keys]
        if unused:
            said = "; ".join(f"{', '.join(keys)} would be ignored: {why}" for keys, why in unused)
            raise ConfigError(f"{said} (method={self.method.name}, stage={self.stage}). Leave such options at "
                              f"their defaults, or choose a setting that reads them")

    def _check_backend(self) -> None:
        """method.backend=triton runs a rule on the selection kernel only where the kernel can rank
        its experts (a per-pair score term or a static score); another rule would run on the PyTorch
        reference while its report said triton."""
        from base.method.selectors import SELECTORS

        if self.method.backend != "triton":
            return
        off = [n for n in self.own_rules() if n != "dense" and SELECTORS.get(n).kernel_term is None
               and not SELECTORS.get(n).static_score]
        if off:
            on = [n for n in SELECTORS.names() if n not in off]
            why = " (oracle ranks by each expert's true output norm, computed in the forward)" if "oracle" in off else ""
            raise ConfigError(f"method.backend=triton: {', '.join(off)} has no kernel form{why}, so it would run on "
                              f"the PyTorch reference; use method.backend=torch, or a rule the kernel runs: "
                              f"{', '.join(on)}")

    def _reads_predictor(self) -> bool:
        from base.method.selectors import SELECTORS

        return any(SELECTORS.get(n).needs_predictor for n in self.built_rules())

    def _check_serve(self) -> None:
        """throughput.mode=serve takes its arrivals from serve.rates and admits FIFO."""
        if self.stage != "throughput" or self.throughput is None or self.throughput.mode != "serve":
            return
        if self.stream.rate is not None:
            raise ConfigError(f"stream.rate={self.stream.rate} is for throughput.mode=stream; throughput.mode=serve "
                              f"takes its request rates from serve.rates (null: the burst)")
        if self.scheduler.admission != "fifo":
            raise ConfigError(f"scheduler.admission={self.scheduler.admission}: throughput.mode=serve admits fifo only "
                              f"(union admission predicts each request's experts with a dense forward first)")

    def _check_admission(self) -> None:
        """Union admission chooses who takes a free slot: an evaluation needs continuous batching."""
        if self.stage == "evaluate" and self.scheduler.admission != "fifo" and self.eval.batching != "continuous":
            raise ConfigError(f"scheduler.admission={self.scheduler.admission} chooses who takes a free slot: it needs "
                              f"eval.batching=continuous")

    def _check_arrival_span(self) -> None:
        """A Poisson stream waits for its arrivals in real time: at a rate so low that its requests
        arrive over more than a day it is no benchmark (at 1e-300 requests/s the wait overflowed
        time.sleep halfway through the run)."""
        tp = self.throughput
        if self.stage != "throughput" or tp is None or tp.mode not in ("stream", "serve"):
            return
        if tp.mode == "serve":
            n = self.serve.requests
            rates = [(f"serve.rates[{i}]", r) for i, r in enumerate(self.serve.rates) if r is not None]
            if self.serve.search_steps:
                rates.append(("serve.search_range[0]", self.serve.search_range[0]))
        else:
            n = max(tp.batch_sizes) * self.stream.requests_per_slot
            rates = [("stream.rate", self.stream.rate)] if self.stream.rate is not None else []
        for key, rate in rates:
            if n / rate > MAX_ARRIVAL_SPAN_S:
                raise ConfigError(f"{key}={rate:g}: {n} requests at {rate:g} requests/s arrive over about {n / rate:.3g} s "
                                  f"on average, more than a day ({MAX_ARRIVAL_SPAN_S} s), and the stream waits for them "
                                  f"in real time: choose a rate of at least {n / MAX_ARRIVAL_SPAN_S:.3g} requests/s")

    def _check_method_budget(self) -> None:
        """A budgeted selector evaluated with no budget would run dense under its name."""
        from base.method.selectors import SELECTORS

        name = self.method.name
        if self.stage == "evaluate" and name != "dense" and SELECTORS.get(name).uses_budget and self.budget is None \
                and self.method.coverage is None:
            raise ConfigError(f"method={name} needs a budget (budget=1..number of experts); "
                              f"for no budget use method=dense")
        if self.stage == "throughput" and self.throughput is not None and not self.throughput.budgets \
                and self.budget is None:
            specs = self.throughput.specs or [{"method": name}]
            budgeted = [s["method"] for s in specs if s["method"] != "dense" and SELECTORS.get(s["method"]).uses_budget]
            if budgeted:
                raise ConfigError(f"throughput of {', '.join(budgeted)} needs budgets: set budget= or "
                                  f"throughput.budgets=[...]")

    def own_rules(self) -> list[str]:
        """The rules an evaluation or throughput run decodes with, dense included: throughput.methods'
        in a throughput run that lists them, else the run's own (calibrate, fit and describe: none)."""
        tp = self.throughput
        if self.stage == "throughput" and tp is not None and tp.specs:
            return list(dict.fromkeys(s["method"] for s in tp.specs))
        return [self.method.name] if self.stage in ("evaluate", "throughput") else []

    def built_rules(self) -> list[str]:
        """The selectors the run builds, dense left out: its own rules and its diagnostic's."""
        names = [*self.own_rules(), *(s["method"] for s in self.diagnostic_rules())]
        return [n for n in dict.fromkeys(names) if n != "dense"]

    def diagnostic_rules(self) -> list[dict[str, Any]]:
        """The rules an evaluation's diagnostic (base/run/diagnose.py) decodes beside the run's own,
        parsed as throughput.methods[] entries; [] where it does not run (off, another stage, or a
        run without a budgeted rule)."""
        from base.method.selectors import SELECTORS

        m = self.method
        if self.stage != "evaluate" or not self.diagnose.enabled or m.name == "dense" or self.budget is None \
                or not SELECTORS.get(m.name).uses_budget:
            return []
        return [parse_method_spec(r, "diagnose.rules[]", engine=False) for r in self.diagnose.rules or DIAGNOSE_RULES]

    def check_model_shape(self, num_experts: int, top_k: int) -> None:
        """Checks that need the model's shape (read from its config, before any weights load)."""
        self.check_budget(num_experts)
        if self.method.k0 is not None and self.method.k0 > top_k:
            raise ConfigError(f"method.k0={self.method.k0} exceeds the model's top-k ({top_k} for "
                              f"{self.model.name}): it would keep every routed expert; choose 1..{top_k}")
        tp = self.throughput
        listed = [("throughput.methods", spec) for spec in
                  ((tp.specs or []) if (tp is not None and self.stage == "throughput") else [])]
        for key, spec in listed + [("diagnose.rules", spec) for spec in self.diagnostic_rules()]:
            if spec["k0"] is not None and spec["k0"] > top_k:
                raise ConfigError(f"{key} has {spec['method']}:{spec['k0']}: k0={spec['k0']} exceeds the model's "
                                  f"top-k ({top_k} for {self.model.name}): it would keep every routed expert; "
                                  f"choose k0 in 1..{top_k}")

    def check_budget(self, num_experts: int) -> None:
        """The budget can only be checked once the model's expert count is known."""
        if self.budget is not None and self.budget > num_experts:
            raise ConfigError(
                f"budget={self.budget} exceeds the {num_experts} experts of {self.model.name}; "
                f"choose 1..{num_experts} or null (dense)"
            )
        for b in (self.throughput.budgets or []) if (self.throughput and self.stage == "throughput") else []:
            if b > num_experts:
                raise ConfigError(f"throughput.budgets has {b}, above the {num_experts} experts of "
                                  f"{self.model.name}; choose budgets in 1..{num_experts}")

    def resolve(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else self.root / p


def config_fields() -> list[tuple[Any, str, Any]]:
    """RunConfig's fields that are keys of conf/config.yaml, in its order: (field, its key there,
    its type there: a group's dataclass, or a value's type)."""
    import typing
    from dataclasses import is_dataclass

    hints = typing.get_type_hints(RunConfig)
    out = []
    for f in fields(RunConfig):
        if f.metadata.get("filled"):
            continue
        kind = f.metadata.get("yaml", hints[f.name])
        group = next((t for t in (kind, *typing.get_args(kind)) if is_dataclass(t)), None)
        out.append((f, f.metadata.get("key", f.name), group or kind))
    return out
