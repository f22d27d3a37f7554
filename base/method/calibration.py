"""Calibration statistics: per MoE layer, what the dense model's router and experts did on
calibration text (base/hf/calibrate.py runs the model to collect them). They feed `calib_freq`,
`calib_energy`, the predictor fit, per-layer budgets and expert similarity.

Shapes: N calibration tokens, H hidden, E experts, K top-k, L MoE layers.
Per layer: z_NH (the MoE-layer input, fp16 to halve the footprint), idx_NK, w_NK,
norms_NK = ||E_u(z_t)|| for the routed pairs, and optionally norms_NE for every expert.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor

from base.files import atomic_save_tensors, atomic_write_text


@dataclass
class LayerCalib:
    z_NH: Tensor
    idx_NK: Tensor
    w_NK: Tensor
    norms_NK: Tensor
    norms_NE: Tensor | None = None


@dataclass
class Calibration:
    layers: list[LayerCalib]
    meta: dict  # model identity and calibration settings

    @property
    def freq_LE(self) -> Tensor:
        """Fraction of calibration tokens whose top-k holds each expert."""
        E = self.meta["num_experts"]
        rows = [torch.bincount(lc.idx_NK.reshape(-1), minlength=E).float() / lc.idx_NK.shape[0] for lc in self.layers]
        return torch.stack(rows)

    @property
    def energy_LE(self) -> Tensor:
        """Mean ||E_u(z)||^2 over calibration tokens routed to u; unseen experts get the layer mean."""
        E = self.meta["num_experts"]
        rows = []
        for lc in self.layers:
            sq = lc.norms_NK.reshape(-1).double() ** 2
            idx = lc.idx_NK.reshape(-1)
            total = torch.zeros(E, dtype=torch.float64).index_add_(0, idx, sq)
            count = torch.bincount(idx, minlength=E).double()
            mean = torch.where(count > 0, total / count.clamp_min(1), sq.mean())
            rows.append(mean.float())
        return torch.stack(rows)

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for i, lc in enumerate(self.layers):
            for key, value in vars(lc).items():
                if value is not None:
                    tensors[f"layer{i}.{key}"] = value.contiguous()
        atomic_save_tensors(tensors, directory / "calib.safetensors")
        atomic_write_text(directory / "calib.json", json.dumps(self.meta, indent=2))  # last: marks it complete

    @classmethod
    def load(cls, directory: Path) -> Calibration:
        meta = json.loads((directory / "calib.json").read_text())
        tensors = load_file(str(directory / "calib.safetensors"))
        layers = []
        for i in range(meta["num_layers"]):
            get = lambda k, i=i: tensors.get(f"layer{i}.{k}")
            layers.append(LayerCalib(get("z_NH"), get("idx_NK"), get("w_NK"), get("norms_NK"), get("norms_NE")))
        return cls(layers, meta)

    def check_content(self, identity: dict) -> None:
        """What a cached file holds agrees with the model it is used for: its metadata names that
        model, and every layer has tensors of the shapes that metadata gives (ValueError otherwise)."""
        meta = self.meta
        if json.loads(json.dumps(meta.get("model"), default=str)) != json.loads(json.dumps(identity, default=str)):
            raise ValueError("its metadata names another model")
        L, E, H = (meta.get(k) for k in ("num_layers", "num_experts", "hidden"))
        if (L, E, H) != (identity["num_layers"], identity["num_experts"], identity["hidden"]):
            raise ValueError(f"its metadata gives {L} layers, {E} experts, hidden {H}")
        for i, lc in enumerate(self.layers):
            if lc.z_NH is None or lc.idx_NK is None or lc.w_NK is None or lc.norms_NK is None:
                raise ValueError(f"layer {i} lacks tensors")
            N, K = lc.idx_NK.shape
            if lc.z_NH.shape != (N, H) or lc.w_NK.shape != (N, K) or lc.norms_NK.shape != (N, K) or \
                    (N and not 0 <= int(lc.idx_NK.min()) <= int(lc.idx_NK.max()) < E):
                raise ValueError(f"layer {i}'s tensors do not match {E} experts, hidden {H}")
