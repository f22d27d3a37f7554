"""Cached calibration statistics and predictors, keyed by model + calibration settings.

`budget=8` and `budget=16` of one model share them; `method=base` with no predictor yet runs
calibration and the fit first. Files are safetensors + JSON, never pickles.
Layout: <artifacts_dir>/<model name as one folder name>/<model+calibration hash>/{calib.safetensors,
calib.json, predictor-<fit hash>.safetensors, predictor-<fit hash>.json}.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from base.config import RunConfig, calibration_tokens
from base.files import clear_temp, clear_temp_if_idle, file_lock
from base.hf.calibrate import calibrate, read_texts, token_batches
from base.hf.families import MoeLayer
from base.hf.loading import resolve_path
from base.method.calibration import Calibration
from base.method.predictor import Predictor, fit_predictor
from base.method.selectors import Artifacts, Selector
from base.progress import progress


def _hash(obj: object) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]


CHUNK = 1 << 20  # bytes read per sample of a large file
WHOLE_LIMIT = 256 << 20  # files up to this size are hashed whole


def file_fingerprint(path: Path) -> str:
    """sha1 of a file's content; above WHOLE_LIMIT, of its size and 16 evenly spaced 1 MB chunks
    (a multi-GB checkpoint is fingerprinted in milliseconds; replacing weights changes the chunks)."""
    h = hashlib.sha1()
    size = path.stat().st_size
    with path.open("rb") as f:
        if size <= WHOLE_LIMIT:
            for block in iter(lambda: f.read(CHUNK), b""):
                h.update(block)
        else:
            h.update(str(size).encode())
            for i in range(16):
                f.seek(i * (size - CHUNK) // 15)
                h.update(f.read(CHUNK))
    return h.hexdigest()[:16]


def content_fingerprint(path: Path) -> str | None:
    """Fingerprint of a local file or directory (its files, sorted, dotfiles skipped); None for a
    hub id, whose content cannot be read offline."""
    if path.is_file():
        return file_fingerprint(path)
    if not path.is_dir():
        return None
    files = sorted(p for p in path.rglob("*") if p.is_file() and not any(x.startswith(".") for x in p.parts[len(path.parts):]))
    return _hash([[str(p.relative_to(path)), file_fingerprint(p)] for p in files])


def model_identity(cfg: RunConfig, layers: list[MoeLayer]) -> dict:
    """What makes calibration and predictor valid for a model: its config, its weights' and its
    tokenizer's content (local paths), and for random weights the architecture, seed and routing."""
    m = cfg.model
    ident = {"name": m.name, "family": m.family, "path": m.path, "init": m.init, "dtype": m.dtype,
             "num_layers": len(layers), "num_experts": layers[0].num_experts, "top_k": layers[0].top_k,
             "hidden": int(layers[0].router.weight.shape[-1])}
    if m.init == "pretrained":
        ident["weights"] = content_fingerprint(Path(resolve_path(m.path, cfg.root)))
    if m.tokenizer not in (None, "bytes"):
        ident["tokenizer"] = content_fingerprint(Path(resolve_path(m.tokenizer, cfg.root)))
    if m.init == "random":
        ident.update(arch=m.arch, seed=cfg.seed)
        if m.routing != "uniform":
            ident.update(routing=m.routing, skew_ratio=m.skew_ratio)
    return ident


def calibration_settings(cfg: RunConfig, num_experts: int | None = None, top_k: int | None = None) -> dict:
    """The calibration's settings as its artifacts are keyed (the token count as run: num_tokens, or
    more for a model whose expert count asks for it, calibration_tokens)."""
    c = cfg.calibration
    files = [str(cfg.resolve(f).relative_to(cfg.root)) if cfg.resolve(f).is_relative_to(cfg.root) else f
             for f in c.files]
    content = [content_fingerprint(cfg.resolve(f)) for f in c.files]  # edited text: new calibration
    tokens = c.num_tokens if num_experts is None or top_k is None else calibration_tokens(c, num_experts, top_k)
    return {"files": files, "content": content, "num_tokens": tokens, "seq_len": c.seq_len,
            "all_experts": c.all_experts}


def model_folder(name: str) -> str:
    """model.name as one folder name inside artifacts_dir: separators become '_' and a name of dots
    only gets a leading '_' (model.name=/abs/path or ../../x never leads the files elsewhere; the
    hash beside it tells names that end up alike apart)."""
    folder = name.replace("/", "_").replace("\\", "_").replace("\0", "_")
    return folder if folder.strip(".") else f"_{folder}"


def artifact_dir(cfg: RunConfig, identity: dict) -> Path:
    settings = calibration_settings(cfg, identity.get("num_experts"), identity.get("top_k"))
    return cfg.artifacts_dir / model_folder(cfg.model.name) / _hash([identity, settings])


def _load_cached(load, path: Path, check=None):
    """A cached artifact, or None (with a message) when its file cannot be read or `check(artifact)`
    finds it does not fit the model (its metadata or tensors contradict it)."""
    try:
        artifact = load(path)
    except Exception as err:  # noqa: BLE001 - truncated or foreign files raise many kinds
        print(f"[base] cached artifact {path} is unreadable ({type(err).__name__}); computing it again")
        return None
    try:
        if check is not None:
            check(artifact)
    except ValueError as err:  # ConfigError included
        print(f"[base] cached artifact {path} does not fit this model ({err}); computing it again")
        return None
    return artifact


def _made_since(path: Path, t0: float) -> bool:
    return path.exists() and path.stat().st_mtime >= t0


def ensure_calibration(cfg: RunConfig, model: nn.Module, tokenizer, layers: list[MoeLayer],
                       recompute: bool = False) -> tuple[Calibration, Path]:
    """The cached calibration, or a new one. Jobs of a sweep that need the same one queue on its
    lock: the first computes, the others load it (with recompute, one made since the sweep
    started counts as recomputed: force=true recomputes once per sweep, not once per job)."""
    identity = model_identity(cfg, layers)
    directory = artifact_dir(cfg, identity)
    marker = directory / "calib.json"  # written last: its presence marks a complete calibration

    def fits(calib: Calibration) -> None:  # a cached file whose content contradicts the model is recomputed
        calib.check_content(identity)

    if marker.exists() and not recompute:
        calib = _load_cached(Calibration.load, directory, fits)
        if calib is not None:
            clear_temp_if_idle(directory)
            return calib, directory
    with file_lock(directory):
        if marker.exists() and (not recompute or _made_since(marker, cfg.started)):
            calib = _load_cached(Calibration.load, directory, fits)
            if calib is not None:  # another job made it while this one waited
                print(f"[base] calibration reused: {directory}", flush=True)
                return calib, directory
        clear_temp(directory)
        text = read_texts([cfg.resolve(f) for f in cfg.calibration.files])
        settings = calibration_settings(cfg, identity["num_experts"], identity["top_k"])
        batches = token_batches(tokenizer, text, dataclasses.replace(cfg.calibration, num_tokens=settings["num_tokens"]))
        meta = {"model": identity, "calibration": settings}
        calib = calibrate(model, layers, batches, cfg.calibration, meta)
        calib.save(directory)
        print(f"[base] calibration computed: {directory}", flush=True)
    return calib, directory


def predictor_path(cfg: RunConfig, identity: dict) -> Path:
    if cfg.predictor.path:
        return cfg.resolve(cfg.predictor.path)
    fit = {k: v for k, v in asdict(cfg.predictor).items() if k != "path"}
    return artifact_dir(cfg, identity) / f"predictor-{_hash([fit, cfg.seed])}.safetensors"


def ensure_predictor(cfg: RunConfig, model: nn.Module, tokenizer, layers: list[MoeLayer],
                     refit: bool = False, recalibrate: bool = True) -> tuple[Predictor, Path]:
    """The cached predictor, or a new fit; refit=True fits again (and, with recalibrate, first
    recomputes the calibration it is fitted on). Shared across jobs as ensure_calibration."""
    identity = model_identity(cfg, layers)
    path = predictor_path(cfg, identity)
    # a cached fit that names another model is recomputed; a user's own file is refused (check_model)
    fits = None if cfg.predictor.path else (lambda pred: pred.check_model(identity, path))
    if path.exists() and not refit:
        pred = _load_cached(Predictor.load, path, fits)
        if pred is not None:
            pred.check_model(identity, path)
            if not cfg.predictor.path:  # a user's own folder is theirs to tidy
                clear_temp_if_idle(path.parent)
            return pred, path
    if cfg.predictor.path:
        raise FileNotFoundError(f"predictor.path={cfg.predictor.path} does not exist or is unreadable")
    calib, _ = ensure_calibration(cfg, model, tokenizer, layers, recompute=refit and recalibrate)
    with file_lock(path.parent):
        if path.exists() and (not refit or _made_since(path, cfg.started)):
            pred = _load_cached(Predictor.load, path, fits)
            if pred is not None:  # another job fitted it while this one waited
                print(f"[base] predictor reused: {path}", flush=True)
                return pred, path
        clear_temp(path.parent)
        with progress(total=len(calib.layers), desc="fit predictor", unit="layer") as bar:
            device = next(model.parameters()).device
            pred = fit_predictor(calib, cfg.predictor, seed=cfg.seed, progress=bar.update,
                                 device=device if device.type == "cuda" else "cpu")
        pred.save(path)
        print(f"[base] predictor fitted: {path}", flush=True)
    return pred, path


def selector_artifacts(cfg: RunConfig, selector_cls: type[Selector], model: nn.Module, tokenizer,
                       layers: list[MoeLayer]) -> tuple[Artifacts, dict]:
    """Whatever the selector needs, computed (and cached) on demand; plus where it came from."""
    arts, info = Artifacts(), {}
    if selector_cls.needs_calibration:
        calib, directory = ensure_calibration(cfg, model, tokenizer, layers, recompute=cfg.force)
        arts.freq_LE, arts.energy_LE = calib.freq_LE, calib.energy_LE
        info["calibration"] = str(directory)
    if cfg.method.reassign == "similar":
        from base.method.similarity import expert_similarity_EE

        calib, directory = ensure_calibration(cfg, model, tokenizer, layers, recompute=cfg.force)
        arts.sim_LEE = torch.stack([expert_similarity_EE(lyr.experts, lc.z_NH, lyr.num_experts)
                                    for lyr, lc in zip(layers, calib.layers)])
        info["similarity"] = f"output cosine similarity on calibration inputs ({directory})"
    if selector_cls.needs_predictor:
        pred, path = ensure_predictor(cfg, model, tokenizer, layers, refit=cfg.force,
                                      recalibrate=not selector_cls.needs_calibration)
        arts.pred_w_LHE, arts.pred_b_LE = pred.w_LHE, pred.b_LE
        info["predictor"] = str(path)
        info["predictor_r2"] = pred.meta["r2"]
        if pred.meta.get("warnings"):
            info["predictor_warnings"] = pred.meta["warnings"]
    return arts, info
