"""The method's choices and the predictor's settings, apart from the code that uses them: plain
Python, so importing the run config (base/config.py, run.py) loads no torch, and a command line
Hydra cannot compose is refused in a fraction of a second."""
from __future__ import annotations

from dataclasses import dataclass

from base.checks import ConfigError, check_choice, check_float

# How tokens that lost an expert are served, and when kept weights are renormalised (method.reassign,
# method.renormalize; base/method/routing.py implements them, kernels/select.py mirrors the first).
REASSIGN_MODES = ("backfill", "drop", "similar")
RENORMALIZE_MODES = ("model", "always", "never")

# Ridge strength is relative to the mean diagonal of z^T z: far above the number of calibration pairs
# it shrinks every weight to zero (a constant per expert, calib_energy's ranking by another name), and
# beyond a float's range it turns the solve into NaN.
MAX_RIDGE = 1e6


@dataclass
class PredictorConfig:
    ridge: float = 1e-2  # ridge strength, relative to the mean diagonal of z^T z
    holdout: float = 0.2  # fraction of calibration tokens held out for R^2
    fit_on: str = "routed"  # routed pairs only, or all experts (needs calibration.all_experts)
    path: str | None = None  # an explicit predictor file; default: the cached one for this model

    def __post_init__(self) -> None:
        check_choice("predictor.fit_on", self.fit_on, ("routed", "all"))
        self.ridge = check_float("predictor.ridge", self.ridge, low=0.0, high=MAX_RIDGE)
        if not 0.0 < self.holdout < 1.0:
            raise ConfigError(f"predictor.holdout={self.holdout} must be in (0, 1)")
