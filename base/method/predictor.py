"""The per-layer linear predictor of log||E_u(z)|| from the MoE-layer input z, for every expert u.

Ridge regression per expert on the calibration tokens routed to it (or on all tokens with
`fit_on=all`); the solve uses whichever of the primal (H x H) and dual (n x n) forms is smaller.

Shapes: N tokens, H hidden, E experts, K top-k, L MoE layers, n tokens routed to one expert.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor

from base.checks import ConfigError
from base.files import atomic_save_tensors, atomic_write_text
from base.method.calibration import Calibration
from base.method.options import MAX_RIDGE, PredictorConfig


@dataclass
class Predictor:
    w_LHE: Tensor
    b_LE: Tensor
    meta: dict  # model identity, calibration and fit settings, held-out R^2 per layer

    def tensors_sha1(self) -> str:
        """The fitted weights' content: recorded when saved, compared when loaded (a file whose tensors
        were changed afterwards, e.g. its experts permuted with the shapes kept, is refused)."""
        h = hashlib.sha1()
        for t in (self.w_LHE, self.b_LE):
            h.update(t.detach().cpu().contiguous().float().numpy().tobytes())
        return h.hexdigest()[:16]

    def save(self, path: Path) -> None:
        self.meta["tensors_sha1"] = self.tensors_sha1()
        atomic_write_text(path.with_suffix(".json"), json.dumps(self.meta, indent=2))
        atomic_save_tensors({"w_LHE": self.w_LHE.contiguous(), "b_LE": self.b_LE.contiguous()}, path,
                            metadata={"meta": json.dumps(self.meta)})  # last: its presence marks it complete

    @classmethod
    def load(cls, path: Path) -> Predictor:
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            meta = json.loads(f.metadata()["meta"])
        t = load_file(str(path))
        pred = cls(t["w_LHE"], t["b_LE"], meta)
        pred.check_content(path)
        return pred

    def check_content(self, source: Path) -> None:
        """What the file holds, not only what it claims: the fields a run reads, tensor shapes that
        agree with its model fields, and finite values."""
        model = self.meta.get("model")
        missing = [k for k in ("num_layers", "num_experts", "hidden") if not isinstance((model or {}).get(k), int)]
        if missing or not isinstance(self.meta.get("r2"), list):
            raise ConfigError(f"predictor {source} lacks {', '.join(missing) or 'r2'} in its metadata: not a file "
                              f"this project wrote; refit with predictor.path=null force=true")
        L, E, H = model["num_layers"], model["num_experts"], model["hidden"]
        if tuple(self.w_LHE.shape) != (L, H, E) or tuple(self.b_LE.shape) != (L, E):
            raise ConfigError(f"predictor {source}: weights {tuple(self.w_LHE.shape)} and bias {tuple(self.b_LE.shape)} "
                              f"do not match its model ({L} MoE layers, hidden {H}, {E} experts)")
        if not (torch.isfinite(self.w_LHE).all() and torch.isfinite(self.b_LE).all()):
            raise ConfigError(f"predictor {source} holds non-finite weights (NaN or inf); refit with "
                              f"predictor.path=null force=true")
        recorded = self.meta.get("tensors_sha1")  # files fitted before 2026-12-05 record none
        if recorded is not None and recorded != self.tensors_sha1():
            raise ConfigError(f"predictor {source}: its weights are not the ones it was fitted with (their content "
                              f"hash differs from the one recorded at the fit); refit with predictor.path=null force=true")

    def check_model(self, identity: dict, source: Path) -> None:
        """Fail clearly when the predictor was fitted for another model: its shape, and the content of
        the weights and tokenizer it was fitted on (a checkpoint of the same shape with other weights,
        such as its experts permuted, is another model)."""
        mine = self.meta["model"]
        keys = [k for k in ("name", "num_layers", "num_experts", "hidden", "weights", "tokenizer", "arch", "seed",
                            "routing", "skew_ratio") if k in mine or k in identity]
        differ = [k for k in keys if mine.get(k) != identity.get(k)]
        if differ:
            have = ", ".join(f"{k}={mine.get(k)}" for k in differ)
            want = ", ".join(f"{k}={identity.get(k)}" for k in differ)
            raise ConfigError(f"predictor {source} was fitted for another model ({have}); this run uses ({want})")


def ridge_fit(x_nH: Tensor, y_n: Tensor, ridge: float) -> tuple[Tensor, Tensor]:
    """(w_H, b) minimising ||x w + b - y||^2 + lam ||w||^2, lam = ridge * mean diag of the centred Gram."""
    x_mean, y_mean = x_nH.mean(0), y_n.mean()
    xc, yc = x_nH - x_mean, y_n - y_mean
    n, H = xc.shape
    lam = ridge * (xc.pow(2).sum() / H).clamp_min(1e-12)
    if n >= H:
        w = torch.linalg.solve(xc.T @ xc + lam * torch.eye(H, dtype=xc.dtype, device=xc.device), xc.T @ yc)
    else:
        w = xc.T @ torch.linalg.solve(xc @ xc.T + lam * torch.eye(n, dtype=xc.dtype, device=xc.device), yc)
    return w, y_mean - x_mean @ w


def _pairs(layer, rows: Tensor, fit_on: str) -> tuple[Tensor, Tensor, Tensor]:
    """(token row, expert, log-norm) for the pairs of the given token rows."""
    if fit_on == "all":
        norms = layer.norms_NE[rows]
        E = norms.shape[1]
        return rows.repeat_interleave(E), torch.arange(E).repeat(rows.numel()), norms.reshape(-1).clamp_min(1e-12).log()
    K = layer.idx_NK.shape[1]
    return rows.repeat_interleave(K), layer.idx_NK[rows].reshape(-1), layer.norms_NK[rows].reshape(-1).clamp_min(1e-12).log()


def fit_predictor(calib: Calibration, cfg: PredictorConfig, seed: int = 0,
                  progress: Callable[[int], None] | None = None, device: torch.device | str = "cpu") -> Predictor:
    """One ridge fit per (layer, expert) on the calibration's routed (or all) pairs, with held-out
    R^2 per layer; `progress(1)` after each layer (a progress bar's update). The solves run on
    `device` (the model's: a GPU run's fit of Qwen3-30B-A3B's 6,144 regressions took 199 s on the
    host's CPU); everything else, and the result, stays on the CPU."""
    E, L, H = calib.meta["num_experts"], calib.meta["num_layers"], calib.meta["hidden"]
    if cfg.fit_on == "all" and calib.layers[0].norms_NE is None:
        raise ValueError("predictor.fit_on=all needs calibration.all_experts=true")
    w_LHE = torch.zeros(L, H, E)
    b_LE = torch.zeros(L, E)
    r2, r2_within, constant, pairs_min = [], [], [], []
    for li, layer in enumerate(calib.layers):
        N = layer.z_NH.shape[0]
        perm = torch.randperm(N, generator=torch.Generator().manual_seed(seed + li))
        n_hold = max(1, int(N * cfg.holdout))
        hold, train = perm[:n_hold], perm[n_hold:]
        z = layer.z_NH.double()
        z_dev = z.to(device)
        t_rows, t_exp, t_y = _pairs(layer, train, cfg.fit_on)
        counts_E = torch.bincount(t_exp, minlength=E)
        constant.append(int((counts_E < 2).sum()))
        pairs_min.append(int(counts_E.min()))
        for u in range(E):
            sel = t_exp == u
            if sel.sum() < 2:
                b_LE[li, u] = t_y.mean() if t_y.numel() else 0.0
                continue
            try:
                w, b = ridge_fit(z_dev[t_rows[sel].to(device)], t_y[sel].double().to(device), cfg.ridge)
            except torch.linalg.LinAlgError:  # ridge=0 on collinear inputs: no unique least-squares fit
                raise ConfigError(f"the predictor fit of layer {li} expert {u} is singular with predictor.ridge="
                                  f"{cfg.ridge}: its calibration inputs are collinear; set predictor.ridge > 0 "
                                  f"(the default is 0.01)") from None
            w_LHE[li, :, u], b_LE[li, u] = w.float().cpu(), float(b)
        # Held-out R^2 on routed pairs: against the pooled mean, and within experts (the token-
        # dependent part a static per-expert energy cannot capture).
        h_rows, h_exp, h_y = _pairs(layer, hold, "routed")
        pred = (z[h_rows].float() * w_LHE[li, :, h_exp].T).sum(-1) + b_LE[li, h_exp]
        sse = (pred - h_y).pow(2).sum()
        r2.append(float(1 - sse / (h_y - h_y.mean()).pow(2).sum().clamp_min(1e-12)))
        mean_u = torch.zeros(E).index_add_(0, t_exp, t_y) / torch.bincount(t_exp, minlength=E).clamp_min(1)
        r2_within.append(float(1 - sse / (h_y - mean_u[h_exp]).pow(2).sum().clamp_min(1e-12)))
        if progress is not None:
            progress(1)
    meta = {
        "model": calib.meta["model"],
        "calibration": calib.meta["calibration"],
        "fit": {"ridge": cfg.ridge, "holdout": cfg.holdout, "fit_on": cfg.fit_on, "seed": seed},
        "r2": r2,
        "r2_within": r2_within,
        "train_pairs_min": pairs_min,
    }
    warnings = fit_warnings(constant, pairs_min, E, H)
    if warnings:
        meta["warnings"] = warnings
        for w in warnings:
            print(f"[base] WARNING predictor fit: {w}", flush=True)
    pred = Predictor(w_LHE, b_LE, meta)
    _check_finite_fit(pred, cfg)
    return pred


def _check_finite_fit(pred: Predictor, cfg: PredictorConfig) -> None:
    """A fit with NaN or infinite weights would rank experts by NaN: refused before it is cached."""
    bad_LE = ~(torch.isfinite(pred.w_LHE).all(1) & torch.isfinite(pred.b_LE))
    if bad_LE.any():
        layer, expert = (int(i) for i in bad_LE.nonzero()[0])
        raise ConfigError(f"the predictor fit gave non-finite weights for {int(bad_LE.sum())} (layer, expert) pairs, "
                          f"first layer {layer} expert {expert} (predictor.ridge={cfg.ridge}): the calibration "
                          f"statistics hold NaN or inf, or the ridge is too small for them; nothing was cached. "
                          f"Raise predictor.ridge (at most {MAX_RIDGE:g}) or recalibrate (stage=calibrate force=true)")


def fit_warnings(constant_L: list[int], pairs_min_L: list[int], E: int, H: int) -> list[str]:
    """What makes a fit less than it looks: experts predicted by a constant (fewer than 2 training
    pairs) and experts with fewer pairs than weights, whose fit the ridge penalty decides."""
    out = []
    if sum(constant_L):
        out.append(f"{sum(constant_L)} of {E * len(constant_L)} (layer, expert) fits had fewer than 2 calibration "
                   f"tokens and predict a constant; raise calibration.num_tokens")
    thin = sum(1 for n in pairs_min_L if n < H)
    if thin:
        out.append(f"in {thin} of {len(pairs_min_L)} layers some expert has fewer training tokens "
                   f"({min(pairs_min_L)} at least) than its {H} weights; its fit rests on predictor.ridge")
    return out
