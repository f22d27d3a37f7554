"""Issue 43: damaged inputs fail, they do not score.

- a checkpoint with one NaN in an expert weight (it scored 0.44 where the model scores 0.875) is
  refused at load, naming the tensor;
- a checkpoint missing one expert's tensor is refused naming it (it was a traceback);
- a predictor whose tensors were changed after its fit (experts permuted, shapes kept) is
  refused; one fitted on other weights of the same shape is refused as another model's.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from base.config import ConfigError, ModelConfig
from base.hf.loading import load_model
from base.method.predictor import Predictor

ROOT = Path(__file__).resolve().parents[1]


def _copy_of_mini(tmp_path: Path, change) -> ModelConfig:
    folder = tmp_path / "mini"
    shutil.copytree(ROOT / "models" / "mini", folder)
    weights = load_file(folder / "model.safetensors")
    change(weights)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    cfg = yaml.safe_load((ROOT / "conf" / "model" / "mini.yaml").read_text())
    return ModelConfig(**{**cfg, "path": str(folder)})


def test_a_nan_in_an_expert_weight_is_refused_naming_the_tensor(tmp_path):
    def one_nan(w):
        key = next(k for k in w if "experts" in k)
        w[key] = w[key].clone()
        w[key].view(-1)[7] = float("nan")

    with pytest.raises(ConfigError, match=r"1 weight tensor hold NaN or infinite values \(model\.layers\.0\.mlp\.experts"):
        load_model(_copy_of_mini(tmp_path, one_nan), ROOT)


def test_a_missing_expert_tensor_is_refused_naming_it(tmp_path):
    def drop_one(w):
        del w[next(k for k in w if "experts" in k)]

    with pytest.raises(ConfigError, match=r"does not match its config.json: tensors 1 of another shape \(model\.layers\.0"):
        load_model(_copy_of_mini(tmp_path, drop_one), ROOT)


def _predictor(seed: int = 0) -> Predictor:
    g = torch.Generator().manual_seed(seed)
    meta = {"model": {"name": "mini", "num_layers": 2, "num_experts": 4, "hidden": 3, "weights": "aaaa"},
            "r2": [0.9, 0.9]}
    return Predictor(torch.randn(2, 3, 4, generator=g), torch.randn(2, 4, generator=g), meta)


def test_a_predictor_whose_experts_were_permuted_after_its_fit_is_refused(tmp_path):
    path = tmp_path / "predictor.safetensors"
    _predictor().save(path)
    assert Predictor.load(path).w_LHE.shape == (2, 3, 4)  # as saved: fine
    t = load_file(path)
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
    save_file({"w_LHE": t["w_LHE"][..., [1, 0, 2, 3]].contiguous(), "b_LE": t["b_LE"][:, [1, 0, 2, 3]].contiguous()},
              path, metadata=metadata)
    with pytest.raises(ConfigError, match="its weights are not the ones it was fitted with"):
        Predictor.load(path)


def test_a_predictor_fitted_on_other_weights_of_the_same_shape_is_another_models():
    pred = _predictor()
    pred.check_model({"name": "mini", "num_layers": 2, "num_experts": 4, "hidden": 3, "weights": "aaaa"}, Path("p"))
    with pytest.raises(ConfigError, match=r"was fitted for another model \(weights=aaaa\); this run uses \(weights=bbbb\)"):
        pred.check_model({"name": "mini", "num_layers": 2, "num_experts": 4, "hidden": 3, "weights": "bbbb"}, Path("p"))
