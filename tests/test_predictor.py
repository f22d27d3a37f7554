"""The log-norm predictor (base/method/predictor.py) and the calibration record it is fitted on.

A synthetic Calibration plants log||E_u(z)|| = z @ W_true[:, u] + b_true[u] + noise; the fit must
recover W_true and b_true and predict fresh tokens with R^2 > 0.95.

Shapes: N tokens, H hidden, E experts, K top-k, L MoE layers, n rows of one regression.
"""
from __future__ import annotations

import json

import pytest
import torch

from base.config import PredictorConfig
from base.method.calibration import Calibration, LayerCalib
from base.method.predictor import Predictor, fit_predictor, ridge_fit

L, E, K, H, N = 2, 4, 2, 6, 800
IDENTITY = {"name": "synthetic", "num_layers": L, "num_experts": E, "hidden": H}


def planted(seed: int = 0, noise: float = 0.01):
    g = torch.Generator().manual_seed(seed)
    W_LHE = torch.randn(L, H, E, generator=g, dtype=torch.float64) * 0.5
    b_LE = torch.randn(L, E, generator=g, dtype=torch.float64) * 0.5
    return W_LHE, b_LE, g, noise


def synthetic_calibration(W_LHE, b_LE, g, noise, n: int = N, all_experts: bool = False) -> Calibration:
    layers = []
    for li in range(L):
        z_NH = torch.randn(n, H, generator=g).to(torch.float16)  # stored as fp16, as calibrate() does
        log_NE = z_NH.double() @ W_LHE[li] + b_LE[li] + noise * torch.randn(n, E, generator=g, dtype=torch.float64)
        idx_NK = torch.rand(n, E, generator=g).topk(K, dim=-1).indices
        layers.append(LayerCalib(
            z_NH=z_NH,
            idx_NK=idx_NK,
            w_NK=torch.softmax(torch.randn(n, K, generator=g), -1),
            norms_NK=log_NE.gather(1, idx_NK).exp().float(),
            norms_NE=log_NE.exp().float() if all_experts else None,
        ))
    meta = {"model": IDENTITY, "calibration": {"num_tokens": n}, "num_layers": L, "num_experts": E,
            "top_k": K, "num_tokens": n, "hidden": H}
    return Calibration(layers, meta)


def r2(pred: torch.Tensor, y: torch.Tensor) -> float:
    return float(1 - (pred - y).pow(2).sum() / (y - y.mean()).pow(2).sum())


# ---- ridge_fit ---------------------------------------------------------------------------------
def test_ridge_fit_recovers_a_planted_linear_relation():
    g = torch.Generator().manual_seed(1)
    x_nH = torch.randn(500, 8, generator=g, dtype=torch.float64)
    w_H = torch.randn(8, generator=g, dtype=torch.float64)
    y_n = x_nH @ w_H + 0.7 + 0.01 * torch.randn(500, generator=g, dtype=torch.float64)
    w, b = ridge_fit(x_nH, y_n, ridge=1e-6)
    assert torch.allclose(w, w_H, atol=5e-3)
    assert float(b) == pytest.approx(0.7, abs=5e-3)


@pytest.mark.parametrize(("n", "dim"), [(40, 10), (10, 40)])  # primal (n >= H) and dual (n < H) solves
def test_ridge_fit_is_the_ridge_optimum(n, dim):
    """Gradient of ||x w + b - y||^2 + lam ||w||^2 vanishes, lam = ridge * mean diag of the centred Gram."""
    g = torch.Generator().manual_seed(n)
    x_nH = torch.randn(n, dim, generator=g, dtype=torch.float64) + 3.0
    y_n = torch.randn(n, generator=g, dtype=torch.float64)
    ridge = 0.1
    w, b = ridge_fit(x_nH, y_n, ridge)
    xc = x_nH - x_nH.mean(0)
    lam = ridge * torch.diag(xc.T @ xc).mean()
    resid_n = x_nH @ w + b - y_n
    assert torch.allclose(x_nH.T @ resid_n + lam * w, torch.zeros(dim, dtype=torch.float64), atol=1e-8)
    assert float(resid_n.sum()) == pytest.approx(0.0, abs=1e-8)


# ---- fit_predictor -----------------------------------------------------------------------------
@pytest.mark.parametrize("fit_on", ["routed", "all"])
def test_fit_predictor_recovers_planted_weights(fit_on):
    W_LHE, b_LE, g, noise = planted()
    calib = synthetic_calibration(W_LHE, b_LE, g, noise, all_experts=fit_on == "all")
    pred = fit_predictor(calib, PredictorConfig(ridge=1e-4, holdout=0.2, fit_on=fit_on), seed=0)
    assert pred.w_LHE.shape == (L, H, E) and pred.b_LE.shape == (L, E)
    assert torch.allclose(pred.w_LHE.double(), W_LHE, atol=0.02)
    assert torch.allclose(pred.b_LE.double(), b_LE, atol=0.02)
    assert len(pred.meta["r2"]) == L and min(pred.meta["r2"]) > 0.95
    assert min(pred.meta["r2_within"]) > 0.95
    assert pred.meta["model"] == IDENTITY and pred.meta["fit"]["fit_on"] == fit_on

    # Fresh tokens: predict log||E_u(z)|| on routed pairs.
    fresh = synthetic_calibration(W_LHE, b_LE, torch.Generator().manual_seed(99), noise, n=300)
    for li, lc in enumerate(fresh.layers):
        z_NH = lc.z_NH.float()
        got_NK = (z_NH @ pred.w_LHE[li]).gather(1, lc.idx_NK) + pred.b_LE[li][lc.idx_NK]
        assert r2(got_NK.flatten(), lc.norms_NK.log().flatten()) > 0.95


def test_fit_on_all_needs_every_experts_norms():
    calib = synthetic_calibration(*planted())
    with pytest.raises(ValueError, match="all_experts"):
        fit_predictor(calib, PredictorConfig(fit_on="all"))


def test_noise_only_targets_give_low_r2():
    """The reported R^2 is a real held-out score: with no planted relation it is near zero."""
    W_LHE, b_LE, g, _ = planted()
    calib = synthetic_calibration(torch.zeros_like(W_LHE), b_LE, g, noise=0.5)
    pred = fit_predictor(calib, PredictorConfig(ridge=1e-2))
    assert max(pred.meta["r2_within"]) < 0.1


# ---- save / load / identity --------------------------------------------------------------------
def test_predictor_save_load_roundtrip(tmp_path):
    pred = fit_predictor(synthetic_calibration(*planted(), n=200), PredictorConfig())
    path = tmp_path / "sub" / "predictor.safetensors"
    pred.save(path)
    back = Predictor.load(path)
    assert torch.equal(back.w_LHE, pred.w_LHE) and torch.equal(back.b_LE, pred.b_LE)
    assert back.meta == json.loads(json.dumps(pred.meta))
    assert json.loads(path.with_suffix(".json").read_text()) == back.meta
    assert not path.with_suffix(".tmp").exists()


def test_check_model_accepts_its_model_and_rejects_another(tmp_path):
    pred = fit_predictor(synthetic_calibration(*planted(), n=200), PredictorConfig())
    source = tmp_path / "predictor.safetensors"
    pred.check_model(dict(IDENTITY), source)
    other = {**IDENTITY, "num_experts": 64}
    with pytest.raises(ValueError) as err:
        pred.check_model(other, source)
    message = str(err.value)
    assert "another model" in message and str(source) in message
    assert "num_experts=4" in message and "num_experts=64" in message
    with pytest.raises(ValueError, match="another model"):
        pred.check_model({**IDENTITY, "name": "qwen3_30b"}, source)


# ---- calibration statistics --------------------------------------------------------------------
def test_calibration_freq_and_energy_by_hand(tmp_path):
    # E = 4, K = 2, three tokens; expert 3 is never routed.
    lc = LayerCalib(
        z_NH=torch.zeros(3, 2, dtype=torch.float16),
        idx_NK=torch.tensor([[0, 1], [1, 2], [0, 1]]),
        w_NK=torch.full((3, 2), 0.5),
        norms_NK=torch.tensor([[1.0, 2.0], [3.0, 1.0], [3.0, 4.0]]),
    )
    calib = Calibration([lc], {"num_experts": 4, "num_layers": 1, "model": {}, "calibration": {}})
    assert calib.freq_LE[0].tolist() == pytest.approx([2 / 3, 1.0, 1 / 3, 0.0])
    mean_all = (1 + 4 + 9 + 1 + 9 + 16) / 6
    assert calib.energy_LE[0].tolist() == pytest.approx([(1 + 9) / 2, (4 + 9 + 16) / 3, 1.0, mean_all])

    calib.save(tmp_path)
    back = Calibration.load(tmp_path)
    assert back.meta == calib.meta and back.layers[0].norms_NE is None
    for key in ("z_NH", "idx_NK", "w_NK", "norms_NK"):
        assert torch.equal(getattr(back.layers[0], key), getattr(lc, key))


def test_a_fit_on_too_few_tokens_says_so_in_its_metadata():
    """Enough tokens: no warning. Few tokens (fewer per expert than its H weights) and an expert no
    token routes to (a constant): both named in meta['warnings'], which the report carries."""
    W, b, g, noise = planted()
    assert "warnings" not in fit_predictor(synthetic_calibration(W, b, g, noise), PredictorConfig()).meta
    thin = synthetic_calibration(W, b, g, noise, n=12)
    for lc in thin.layers:
        lc.idx_NK[lc.idx_NK == 3] = (lc.idx_NK[lc.idx_NK == 3] + 1) % 3  # expert 3 never routed
        lc.idx_NK = torch.sort(lc.idx_NK, dim=-1).values
    warnings = fit_predictor(thin, PredictorConfig()).meta["warnings"]
    assert any(f"{L} of {L * E} (layer, expert) fits had fewer than 2" in w for w in warnings)
    assert any(f"than its {H} weights" in w for w in warnings)


@pytest.mark.gpu
def test_gpu_the_fit_on_the_gpu_is_the_cpu_fit():
    """A GPU run solves its regressions on the GPU (base/run/artifacts.py passes the model's device):
    the same weights as the CPU's to float64 rounding, stored on the CPU."""
    W_LHE, b_LE, g, noise = planted()
    calib = synthetic_calibration(W_LHE, b_LE, g, noise)
    cfg = PredictorConfig(ridge=1e-2, holdout=0.2)
    cpu, gpu = fit_predictor(calib, cfg, seed=0), fit_predictor(calib, cfg, seed=0, device="cuda")
    assert gpu.w_LHE.device.type == "cpu" and gpu.b_LE.device.type == "cpu"
    torch.testing.assert_close(gpu.w_LHE, cpu.w_LHE, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gpu.b_LE, cpu.b_LE, rtol=1e-5, atol=1e-6)
    assert gpu.meta["r2"] == pytest.approx(cpu.meta["r2"], abs=1e-6)
