"""Checks that run before a run writes anything: every bad input fails here with a message that
names the valid range or choice, never as a traceback halfway through a run.

    preflight(cfg)   # raises ConfigError

What needs the model reads only its config (no weights): the budget and k0 against its shape, the
weights and the largest decode batch's K/V cache against the device's memory, and with
model.device_map=auto whether it fits the visible GPUs (planned on the model built empty); a
request stream's prompts against this machine's memory. Then
the calibration files (when this run may calibrate) and whether num_tokens gives a fit enough tokens
per expert, an explicit predictor file (readable, fitted for this model), and the evaluation tasks, which are looked up and built once (unknown names,
missing or empty data).
"""
from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from base.checks import check_file, check_folder
from base.config import ConfigError, RunConfig, ThroughputConfig, calibration_tokens
from base.hf.compat import check_kernels_name_clash
from base.hf.families import FAMILIES
from base.hf.loading import hf_config
from base.method.selectors import SELECTORS
from base.run.context_checks import check_eval_requests, check_generation_lengths
from base.run.model_checks import (
    check_device_memory,
    check_family,
    check_names,
    check_prefill_buckets,
    check_stream_prompts,
    check_tokenizer,
    meta_model,
)
from base.run.provenance import named_commit


def preflight(cfg: RunConfig) -> None:
    check_kernels_name_clash()
    named_commit()  # BASE_COMMIT, if set, names a commit
    check_names(cfg)
    _check_device(cfg)
    check_decode_steps(cfg.throughput if cfg.stage == "throughput" else None, _on_gpu(cfg))
    check_folder("artifacts_dir", cfg.artifacts_dir)
    check_folder("outputs_dir", cfg.out_dir.parent)
    check_logger(cfg)
    family = FAMILIES.get(cfg.model.family)
    if cfg.model.init == "random":  # before transformers builds the config: it loops over the layers
        _check_arch(cfg, cfg.model.arch.get, family.experts_key, family.topk_key)
    hf = hf_config(cfg.model, cfg.root)
    check_family(cfg, hf)
    if cfg.model.init == "pretrained":
        _check_checkpoint(cfg, hf)
    _check_arch(cfg, lambda key: getattr(hf, key, None), family.experts_key, family.topk_key)
    cfg.check_model_shape(int(getattr(hf, family.experts_key)), int(getattr(hf, family.topk_key)))
    check_device_memory(cfg, hf)
    check_stream_prompts(cfg)
    check_prefill_buckets(cfg, hf)
    _check_artifact_inputs(cfg, hf, family)
    context = getattr(hf, "max_position_embeddings", None)
    if cfg.stage == "evaluate":
        check_tasks(cfg, context)
    if cfg.stage == "throughput" and cfg.throughput.mode in ("stream", "serve"):
        cfg.stream.task_lengths(cfg.root)  # a lengths_from file that is missing or holds no lengths fails here
    if cfg.stage == "throughput" and context:
        check_generation_lengths(cfg, context)
    if cfg.model.device_map is not None:
        _check_placement(cfg, hf)


# Sizes the model is built from: each at least 1 where the config has it (other integers, such as
# n_shared_experts or first_k_dense_replace, may be 0).
MAX_SIZE = 2**31 - 1  # tensor dimensions and their products must fit int64; no model is near this
# transformers' configs build a per-layer list when made (layer types), and the model a module per
# layer: a bound that keeps both finite (a billion layers hung the start); the models here have <= 48
MAX_LAYERS = 2**16
POSITIVE_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings")


def _check_arch(cfg: RunConfig, value: Callable[[str], Any], experts_key: str, topk_key: str) -> None:
    """The architecture numbers (`value(key)`: from model.arch, or the built config of a random or
    checkpoint model) describe a model that can be built and run: positive sizes, 1 <= top-k <=
    experts, heads that divide as attention needs."""
    def where(key: str) -> str:
        return f"model.arch.{key}" if key in cfg.model.arch else f"{key} (model {cfg.model.name}'s config)"

    for key in (*POSITIVE_SIZES, topk_key, experts_key):
        v = value(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise ConfigError(f"{where(key)}={v!r} must be a whole number")
        most = MAX_LAYERS if key == "num_hidden_layers" else MAX_SIZE
        if key != topk_key and isinstance(v, int) and not 1 <= v <= most:  # top-k: against the experts below
            raise ConfigError(f"{where(key)}={v} is out of range: must be in [1, {most}]")
    E, k = value(experts_key), value(topk_key)
    if isinstance(k, int) and isinstance(E, int) and not 1 <= k <= E:
        raise ConfigError(f"{where(topk_key)}={k} is out of range: each token picks 1..{E} of the {E} experts "
                          f"({where(experts_key)})")
    heads, kv = value("num_attention_heads"), value("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        raise ConfigError(f"{where('num_attention_heads')}={heads} is not a multiple of "
                          f"{where('num_key_value_heads')}={kv}: grouped-query attention shares each key-value "
                          f"head among a whole number of query heads")
    hidden = value("hidden_size")
    if value("head_dim") is None and isinstance(hidden, int) and isinstance(heads, int) and hidden % heads:
        raise ConfigError(f"{where('hidden_size')}={hidden} is not a multiple of {where('num_attention_heads')}="
                          f"{heads}, and no head_dim is set")


def check_logger(cfg: RunConfig, reach: Callable[[tuple[str, int]], bool] | None = None) -> None:
    """logger=wandb logger.mode=online needs a login and the wandb server: without either, wandb
    failed after minutes of retries, after the run had started. `reach` (tests): the connection probe."""
    import os
    from pathlib import Path

    if cfg.logger.name != "wandb" or cfg.logger.mode != "online":
        return
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    logged_in = bool(os.environ.get("WANDB_API_KEY")) or (netrc.is_file() and host.split(":")[0] in netrc.read_text())
    if not logged_in:
        raise ConfigError("logger.mode=online needs a wandb login (WANDB_API_KEY, or `wandb login`); or keep "
                          "logger.mode=offline and sync later (the run prints the command)")
    name, _, port = host.partition(":")
    if not (reach or _reachable)((name, int(port or 443))):
        raise ConfigError(f"logger.mode=online: the wandb server {name} cannot be reached from here; use "
                          f"logger.mode=offline and sync later (the run prints the command)")


def _reachable(address: tuple[str, int], timeout_s: float = 5.0) -> bool:
    import socket

    try:
        with socket.create_connection(address, timeout=timeout_s):
            return True
    except OSError:
        return False


def _check_placement(cfg: RunConfig, hf) -> None:
    """model.device_map=auto: the model fits the visible GPUs (planned on the model built empty)."""
    import torch

    if not torch.cuda.is_available():
        return
    from base.hf.placement import device_map_for, empty_model

    device_map_for(empty_model(hf, getattr(torch, cfg.model.dtype), {"trust_remote_code": cfg.model.trust_remote_code}))


def _check_artifact_inputs(cfg: RunConfig, hf, family) -> None:
    """What the run's calibration and predictor come from: a given predictor file, else the
    calibration files and a fit of a meaningful size. What only the start-time diagnostic reads
    (its rules' artifacts; calibration.files, whose held-out text are its prompts) is checked the
    same way, its refusals saying so and how to run without it."""
    path = cfg.predictor.path
    sizes = int(getattr(hf, family.experts_key)), int(getattr(hf, family.topk_key))

    def reads(names: list[str]) -> tuple[bool, bool]:  # (a predictor, calibration)
        rules = [SELECTORS.get(n) for n in names if n != "dense"]
        return any(r.needs_predictor for r in rules), any(r.needs_calibration for r in rules)

    own = cfg.own_rules()
    pred, calib = reads(own)
    pred = pred or cfg.stage == "fit"
    calib = (calib or cfg.stage == "calibrate" or (pred and not path)  # a fit reads the calibration
             or (cfg.method.reassign == "similar" and any(n != "dense" for n in own)))  # so does `similar`
    _check_inputs(cfg, hf, sizes, pred, calib)
    if not cfg.diagnostic_rules():
        return
    extra = [n for n in cfg.built_rules() if n not in own]
    d_pred, d_calib = reads(extra)
    d_pred = d_pred and not pred
    d_calib = (d_calib or (d_pred and not path)) and not calib
    readers = [n for n in extra if any(reads([n]))]

    def hint(err: ConfigError, rules_way: bool) -> ConfigError:
        way = f", or diagnose.rules without {', '.join(readers)}" if rules_way else ""
        unset = " and leave predictor.path unset" if path else ""
        return ConfigError(f"{err} (only the start-time diagnostic reads it, not method={cfg.method.name}: set "
                           f"diagnose.enabled=false{way}{unset})")

    if not calib:  # its prompts, whichever rules it runs
        try:
            _check_calibration_files(cfg)
        except ConfigError as err:
            raise hint(err, False) from None
    try:
        _check_inputs(cfg, hf, sizes, d_pred, d_calib, files=False)
    except ConfigError as err:
        raise hint(err, True) from None


def _check_inputs(cfg: RunConfig, hf, sizes: tuple[int, int], pred: bool, calib: bool, files: bool = True) -> None:
    """A predictor's inputs (`pred`: predictor.path's file, else a fit of a meaningful size) and the
    calibration's (`calib`: its files, unless `files` is off, and the tokens they hold)."""
    if pred and cfg.predictor.path:
        _check_predictor_file(cfg, hf)
    if calib:
        if files:
            _check_calibration_files(cfg)
        _check_calibration_tokens(cfg, calibration_tokens(cfg.calibration, *sizes))
    if pred and not cfg.predictor.path:
        _check_fit_size(cfg, *sizes)


def _check_device(cfg: RunConfig) -> None:
    import torch

    if cfg.model.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("model.device=cuda but this machine has no CUDA GPU; use model.device=auto (the CPU "
                          "here) or cpu")


def _on_gpu(cfg: RunConfig) -> bool:
    from base.hf.loading import pick_device

    return cfg.model.device != "meta" and pick_device(cfg.model.device).type == "cuda"


def check_decode_steps(tp: ThroughputConfig | None, on_gpu: bool) -> None:
    """On a GPU the throughput passes replay the captured step `warmup` times first (at least once)
    and the cache holds gen_tokens new tokens: the timed steps and the statistics passes' steps must
    fit after the warm-up, else they were cut to what fits without a word. (On a CPU nothing warms up.)"""
    if tp is None or tp.mode != "steps" or not on_gpu:
        return
    warm = tp.warm_steps(graph=True)
    room = tp.gen_tokens - 1 - warm
    for key, steps in (("throughput.timed_steps", tp.timed_steps), ("throughput.stats_steps", tp.stats_steps)):
        if steps is not None and steps > room:
            raise ConfigError(f"{key}={steps} does not fit: on a GPU {warm} untimed warm-up step(s) (throughput.warmup="
                              f"{tp.warmup}) come first and the cache holds throughput.gen_tokens={tp.gen_tokens} new "
                              f"tokens, so at most {room} steps are left; lower {key} or warmup, or raise gen_tokens")


def _check_checkpoint(cfg: RunConfig, hf) -> None:
    """A local checkpoint folder holds readable weights and a tokenizer (its config was read already)."""
    from pathlib import Path

    from base.hf.loading import resolve_path

    folder = Path(resolve_path(cfg.model.path, cfg.root))
    if not folder.is_dir():
        return  # a hub id: transformers' own messages (offline: not reachable)
    weights = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin"))
    if not weights:
        raise ConfigError(f"model.path={cfg.model.path}: no weights (*.safetensors or *.bin) in {folder}")
    for w in weights:
        if w.suffix != ".safetensors":
            continue
        try:
            from safetensors import safe_open

            with safe_open(str(w), "pt") as f:
                f.keys()
        except Exception as err:  # noqa: BLE001 - truncated or foreign files raise many kinds
            raise ConfigError(f"model.path={cfg.model.path}: {w.name} is not a readable safetensors file "
                              f"({type(err).__name__}: {err}); the checkpoint is damaged or incomplete") from None
    _tokenizer(cfg, getattr(hf, "vocab_size", None))


def _tokenizer(cfg: RunConfig, vocab_size: int | None = None):
    """The run's tokenizer, or a ConfigError naming where it was looked for (a hub id with no local
    copy fails here offline, not as a traceback inside calibration), or what is wrong with it."""
    from base.hf.loading import load_tokenizer

    try:
        tok = load_tokenizer(cfg.model, cfg.root)
    except Exception as err:  # noqa: BLE001 - hub, file and parse errors all mean "no tokenizer here"
        raise ConfigError(f"model {cfg.model.name}: no tokenizer loads from {cfg.model.tokenizer or cfg.model.path} "
                          f"({type(err).__name__}); set model.tokenizer to a tokenizer folder, or "
                          f"model.tokenizer=bytes for a random-weight model") from None
    check_tokenizer(cfg, tok, vocab_size)
    return tok


def _check_calibration_files(cfg: RunConfig) -> None:
    """Every file exists and parses."""
    from base.hf.calibrate import read_texts

    for f in cfg.calibration.files:
        path = cfg.resolve(f)
        check_file("calibration.files", path, f)
        if not path.is_file():
            raise ConfigError(f"calibration.files: {f} does not exist (looked for {path}); give local .txt or "
                              f".jsonl files, relative to the repo root or absolute")
        if path.stat().st_size == 0:
            raise ConfigError(f"calibration.files: {f} is empty")
        try:
            read_texts([path])
        except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
            raise ConfigError(f"calibration.files: {f} does not parse ({type(err).__name__}: {err}); .jsonl files "
                              f"hold one JSON object per line with a \"text\" field, .txt files UTF-8 text") from None


def _check_calibration_tokens(cfg: RunConfig, needed: int | None = None) -> None:
    """Together the files hold the tokens calibration cuts into windows."""
    from base.hf.calibrate import read_texts

    text = read_texts([cfg.resolve(f) for f in cfg.calibration.files])
    tokens = len(_tokenizer(cfg)(text, add_special_tokens=False, verbose=False)["input_ids"])
    if tokens < cfg.calibration.seq_len:
        raise ConfigError(f"calibration.files hold {tokens} tokens, fewer than calibration.seq_len="
                          f"{cfg.calibration.seq_len}: give more text or a shorter seq_len")
    needed = cfg.calibration.num_tokens if needed is None else needed
    if tokens < needed:  # calibration would quietly use what the files hold
        why = ("calibration.num_tokens" if needed == cfg.calibration.num_tokens else
               f"calibration.tokens_per_expert={cfg.calibration.tokens_per_expert} (x experts / top-k)")
        raise ConfigError(f"{why} asks for {needed} calibration tokens, but calibration.files hold {tokens} tokens for "
                          f"this model's tokenizer: lower it to fit, or give more text")


MIN_PAIRS_PER_EXPERT = 8  # below this a per-expert linear fit is mostly constants and noise


def _check_fit_size(cfg: RunConfig, num_experts: int, top_k: int) -> None:
    """A predictor fit gets, per expert, about num_tokens * (1 - holdout) * k / E routed tokens;
    too few and the fit is meaningless (fewer than the weights: fit_predictor warns in the report)."""
    per_expert = calibration_tokens(cfg.calibration, num_experts, top_k) * (1 - cfg.predictor.holdout) * top_k / num_experts
    if cfg.predictor.fit_on == "routed" and per_expert < MIN_PAIRS_PER_EXPERT:
        need = int(MIN_PAIRS_PER_EXPERT * num_experts / (top_k * (1 - cfg.predictor.holdout))) + 1
        raise ConfigError(f"calibration.num_tokens={cfg.calibration.num_tokens} gives the predictor fit about "
                          f"{per_expert:.1f} tokens per expert ({num_experts} experts, top-{top_k}, holdout "
                          f"{cfg.predictor.holdout}); a meaningful fit needs at least {MIN_PAIRS_PER_EXPERT}: set "
                          f"calibration.num_tokens >= {need}")


def _check_predictor_file(cfg: RunConfig, hf) -> None:
    from base.method.predictor import Predictor

    path = cfg.resolve(cfg.predictor.path)
    check_file("predictor.path", path, cfg.predictor.path)
    if not path.is_file():
        raise ConfigError(f"predictor.path={cfg.predictor.path} does not exist (looked for {path}); leave it "
                          f"null to fit (and cache) a predictor for this model")
    try:
        pred = Predictor.load(path)
    except ConfigError as err:  # it reads, but does not hold what a predictor must
        raise ConfigError(f"predictor.path={cfg.predictor.path}: {err}") from None
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same clear message
        raise ConfigError(f"predictor.path={cfg.predictor.path} is not a readable predictor file "
                          f"({type(err).__name__}); refit with predictor.path=null force=true") from None
    family = FAMILIES.get(cfg.model.family)
    want = {"name": cfg.model.name, "num_experts": int(getattr(hf, family.experts_key)),
            "hidden": int(hf.hidden_size), "num_layers": _moe_layers(cfg, hf)}
    have = {k: pred.meta.get("model", {}).get(k) for k in want}
    if have != want:
        raise ConfigError(f"predictor.path={cfg.predictor.path} was fitted for another model ({have}); this run "
                          f"uses {want}")


def _moe_layers(cfg: RunConfig, hf) -> int:
    """The model's MoE layers, counted on the model built without memory (meta device)."""
    from base.hf.families import find_moe_layers

    return len(find_moe_layers(meta_model(cfg, hf)))


def check_tasks(cfg: RunConfig, context: int | None = None) -> None:
    """Every task name is known to lm-eval and every task builds (its data exists and is not empty),
    and its new tokens fit the model's context (`context` positions)."""
    from base.eval.gen_lengths import new_tokens
    from base.eval.lmeval_logging import quiet_expected_warnings
    from base.eval.tasks import task_manager

    quiet_expected_warnings()
    include = str(cfg.resolve(cfg.task.include_path)) if cfg.task.include_path else None
    if include is not None and not Path(include).is_dir():
        raise ConfigError(f"task.include_path={cfg.task.include_path}: no folder at {include} (it holds the task "
                          f"YAMLs of task.tasks)")
    tm = task_manager(include, tuple(cfg.task.tasks))
    known = set(tm.all_tasks)
    for name in cfg.task.tasks:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=5)
            hint = f"; close matches: {', '.join(close)}" if close else ""
            raise ConfigError(f"task {cfg.task.name}: unknown lm-eval task {name!r}{hint}")
    try:
        leaves = tm.load(list(cfg.task.tasks))["tasks"]
    except Exception as err:  # noqa: BLE001 - lm-eval raises anything, StopIteration for empty data
        why = "its data is empty" if isinstance(err, StopIteration) else f"{type(err).__name__}: {err}"
        raise ConfigError(f"task {cfg.task.name}: {', '.join(cfg.task.tasks)} could not be built ({why})") from None
    scored = sorted(n for n, t in leaves.items() if t.OUTPUT_TYPE != "generate_until")
    if scored and cfg.method.name != "dense":
        raise ConfigError(f"task {cfg.task.name}: {', '.join(scored[:8])}{' ...' if len(scored) > 8 else ''} "
                          f"score by log-likelihood and never decode: method={cfg.method.name} changes decode steps "
                          f"only, so it would equal dense there; use generative tasks")
    unsafe = sorted(n for n, t in leaves.items() if getattr(t, "UNSAFE_CODE", False))
    if unsafe and not cfg.eval.confirm_unsafe_code:
        raise ConfigError(f"task {cfg.task.name}: {', '.join(unsafe)} execute model-written code; to run them, "
                          f"set eval.confirm_unsafe_code=true (passes lm-eval's confirm_run_unsafe_code and sets "
                          f"HF_ALLOW_CODE_EVAL=1)")
    for name, task in sorted(leaves.items()) if context else ():
        if task.OUTPUT_TYPE != "generate_until":
            continue
        new = new_tokens(task.config.generation_kwargs or {}, cfg.eval)
        if new >= context:
            raise ConfigError(f"task {cfg.task.name}: {name} would generate {new} new tokens, but {cfg.model.name} "
                              f"has {context} positions in all: set eval.gen_tokens or eval.max_gen_tokens below {context}")
    if context:
        check_eval_requests(cfg, leaves, _tokenizer(cfg), context)

