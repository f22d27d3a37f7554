"""Checks that run before a run writes anything: every bad input fails here with a message that
names the valid range or choice, never as a traceback halfway through a run.

    preflight(cfg)   # raises ConfigError

What needs the model reads only its config (no weights): the budget and k0 against its shape, and
with model.device_map=auto whether it fits the visible GPUs (planned on the model built empty). Then
the calibration files (when this run may calibrate), an explicit predictor file (readable, fitted
for this model), and the evaluation tasks, which are looked up and built once (unknown names,
missing or empty data).
"""
from __future__ import annotations

import difflib

from base.config import ConfigError, RunConfig
from base.hf.families import FAMILIES
from base.hf.loading import hf_config
from base.method.selectors import SELECTORS


def preflight(cfg: RunConfig) -> None:
    hf = hf_config(cfg.model, cfg.root)
    family = FAMILIES.get(cfg.model.family)
    cfg.check_model_shape(int(getattr(hf, family.experts_key)), int(getattr(hf, family.topk_key)))
    methods = _methods(cfg)
    needs_pred = any(SELECTORS.get(m).needs_predictor for m in methods)
    needs_calib = cfg.stage in ("calibrate", "fit") or any(SELECTORS.get(m).needs_calibration for m in methods)
    if cfg.predictor.path and (needs_pred or cfg.stage == "fit"):
        _check_predictor_file(cfg, hf)
    elif needs_calib or needs_pred:
        _check_calibration_files(cfg)
    if cfg.stage == "evaluate":
        check_tasks(cfg)
    if cfg.stage == "throughput" and cfg.throughput.mode == "stream":
        cfg.stream.task_lengths(cfg.root)  # a lengths_from file that is missing or holds no lengths fails here
    if cfg.model.device_map is not None:
        _check_placement(cfg, hf)


def _check_placement(cfg: RunConfig, hf) -> None:
    """model.device_map=auto: the model fits the visible GPUs (planned on the model built empty)."""
    import torch

    if not torch.cuda.is_available():
        return
    from base.hf.placement import device_map_for, empty_model

    device_map_for(empty_model(hf, getattr(torch, cfg.model.dtype), {"trust_remote_code": cfg.model.trust_remote_code}))


def _methods(cfg: RunConfig) -> list[str]:
    """The selectors this run may build (throughput runs several)."""
    if cfg.stage == "throughput" and cfg.throughput is not None and cfg.throughput.specs:
        names = [s["method"] for s in cfg.throughput.specs]
    else:
        names = [cfg.method.name]
    return [n for n in names if n != "dense"]


def _check_calibration_files(cfg: RunConfig) -> None:
    for f in cfg.calibration.files:
        path = cfg.resolve(f)
        if not path.is_file():
            raise ConfigError(f"calibration.files: {f} does not exist (looked for {path}); give local .txt or "
                              f".jsonl files, relative to the repo root or absolute")
        if path.stat().st_size == 0:
            raise ConfigError(f"calibration.files: {f} is empty")


def _check_predictor_file(cfg: RunConfig, hf) -> None:
    from base.method.predictor import Predictor

    path = cfg.resolve(cfg.predictor.path)
    if not path.is_file():
        raise ConfigError(f"predictor.path={cfg.predictor.path} does not exist (looked for {path}); leave it "
                          f"null to fit (and cache) a predictor for this model")
    try:
        pred = Predictor.load(path)
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same clear message
        raise ConfigError(f"predictor.path={cfg.predictor.path} is not a readable predictor file "
                          f"({type(err).__name__}); refit with predictor.path=null force=true") from None
    family = FAMILIES.get(cfg.model.family)
    want = {"name": cfg.model.name, "num_experts": int(getattr(hf, family.experts_key)),
            "hidden": int(hf.hidden_size)}
    have = {k: pred.meta.get("model", {}).get(k) for k in want}
    if have != want:
        raise ConfigError(f"predictor.path={cfg.predictor.path} was fitted for another model ({have}); this run "
                          f"uses {want}")


def check_tasks(cfg: RunConfig) -> None:
    """Every task name is known to lm-eval and every task builds (its data exists and is not empty)."""
    from base.eval.lmeval_logging import quiet_expected_warnings
    from base.eval.tasks import task_manager

    quiet_expected_warnings()
    include = str(cfg.resolve(cfg.task.include_path)) if cfg.task.include_path else None
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

