"""Cached calibration and predictors are keyed on content: replaced weights or edited calibration
text give new artifacts, and force=true recomputes them in every stage."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import run
from base.hf.families import find_moe_layers
from base.hf.loading import load_model
from base.run.artifacts import (
    artifact_dir,
    calibration_settings,
    content_fingerprint,
    file_fingerprint,
    model_identity,
)

ROOT = Path(__file__).resolve().parents[1]


def _saved_tiny(compose, tmp_path: Path):
    """tiny_qwen3 saved as a local checkpoint, and a RunConfig that loads it from there."""
    rc = run.build_config(compose(["model=tiny_qwen3", "task=smoke"]), tmp_path / "out")
    model = load_model(rc.model, ROOT, seed=0)
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    overrides = ["model=tiny_qwen3", "task=smoke", "model.init=pretrained", f"model.path={ckpt}",
                 f"artifacts_dir={tmp_path}/art", "calibration.files=[data/calibration/stdlib.txt]"]
    rc = run.build_config(compose(overrides), tmp_path / "out", overrides=",".join(overrides))
    return rc, model, ckpt


def test_replacing_the_weights_at_the_same_path_changes_the_artifact_key(compose, tmp_path):
    rc, model, ckpt = _saved_tiny(compose, tmp_path)
    layers = find_moe_layers(model)
    before = artifact_dir(rc, model_identity(rc, layers))
    assert artifact_dir(rc, model_identity(rc, layers)) == before  # stable
    with torch.no_grad():
        layers[0].experts.gate_up_proj.mul_(2.0)
    model.save_pretrained(ckpt)  # same path, other weights
    assert artifact_dir(rc, model_identity(rc, layers)) != before


def test_editing_calibration_text_changes_the_key(compose, tmp_path):
    text = tmp_path / "calib.txt"
    text.write_text("def f(x):\n    return x + 1\n")
    rc = run.build_config(compose(["model=tiny_qwen3", f"calibration.files=[{text}]"]), tmp_path / "o",
                          overrides=f"calibration.files=[{text}]")
    before = calibration_settings(rc)
    text.write_text("def f(x):\n    return x + 2\n")
    assert calibration_settings(rc) != before and calibration_settings(rc)["files"] == before["files"]


def test_large_files_are_fingerprinted_by_samples_that_see_a_change(tmp_path, monkeypatch):
    import base.run.artifacts as art

    monkeypatch.setattr(art, "WHOLE_LIMIT", 4 << 20)  # sample files above 4 MB
    big = tmp_path / "w.bin"
    data = bytearray(8 << 20)
    big.write_bytes(bytes(data))
    before = file_fingerprint(big)
    data[0] = 1  # inside the first sampled chunk
    big.write_bytes(bytes(data))
    assert file_fingerprint(big) != before
    assert content_fingerprint(tmp_path / "missing") is None  # a hub id: nothing to read


@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_force_recomputes_calibration_and_predictor_in_evaluate(compose, tmp_path):
    from omegaconf import OmegaConf

    from base.run.pipeline import run as run_pipeline

    stamps = []
    for i, force in enumerate((False, True)):
        cfg = compose(["model=tiny_qwen3", "task=smoke", "logger=none", "method=base", "budget=3",
                       f"artifacts_dir={tmp_path}/art", f"force={str(force).lower()}"])
        report = run_pipeline(run.build_config(cfg, tmp_path / f"out{i}"), OmegaConf.to_yaml(cfg, resolve=True))
        pred = Path(report["artifacts"]["predictor"])
        calib = next((tmp_path / "art").rglob("calib.json"))
        stamps.append((pred.stat().st_mtime_ns, calib.stat().st_mtime_ns))
    assert stamps[1][0] > stamps[0][0] and stamps[1][1] > stamps[0][1]


@pytest.mark.slow
def test_a_damaged_cached_predictor_is_fitted_again(compose, tmp_path):
    from omegaconf import OmegaConf

    from base.run.pipeline import run as run_pipeline

    def go(i: int) -> dict:
        cfg = compose(["model=tiny_qwen3", "task=smoke", "logger=none", "method=base", "budget=3",
                       f"artifacts_dir={tmp_path}/art", f"exp_name=e{i}"])
        return run_pipeline(run.build_config(cfg, tmp_path / f"out{i}"), OmegaConf.to_yaml(cfg, resolve=True))

    pred = Path(go(0)["artifacts"]["predictor"])
    pred.write_bytes(pred.read_bytes()[:100])  # truncated, as by a crash mid-write elsewhere
    again = go(1)
    assert Path(again["artifacts"]["predictor"]) == pred and len(pred.read_bytes()) > 100
