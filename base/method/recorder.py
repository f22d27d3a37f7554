"""Selection statistics that live on the device: one row per (MoE layer, forward step), read once.

Recording never syncs the host and allocates nothing per step: rows go into a preallocated
buffer at the index held by a device counter, so a decode step captured in a CUDA graph writes the
row of the step it replays. The first MoE layer's record opens the forward's row (every forward
runs layer 0 first), so whoever drives the forward needs no call of its own. `rows()` reads
everything back once, after decoding. A row's kind is prefill or decode from the forward's
inputs; a continuous-batching engine's mixed step (prompt chunks beside the decoding rows) marks
its row `mixed` after the forward (`mark_mixed`).

Shapes: L MoE layers, S step capacity, F fields (FIELDS).
"""
from __future__ import annotations

import torch
from torch import Tensor

from base.method.routing import StepStats

FIELDS = ("union", "kept", "executed", "weight_kept", "weight_total", "tokens_lost", "tokens", "energy_kept",
          "energy_total", "out_err", "out_dense")
ENERGY_FIELDS = ("energy_kept", "energy_total")
FIDELITY_FIELDS = ("out_err", "out_dense")  # MoE-output error against dense (BudgetOptions.fidelity)


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class StatsRecorder:
    """Per-step statistics of every MoE layer, accumulated in device tensors."""

    def __init__(self, num_layers: int, device: torch.device, energy: bool = False, capacity: int = 64,
                 fidelity: bool = False) -> None:
        self.num_layers, self.device, self.energy, self.fidelity = num_layers, torch.device(device), energy, fidelity
        self.rows_LSF = torch.zeros(num_layers, capacity, len(FIELDS), device=self.device)
        self.decode_S = torch.zeros(capacity, dtype=torch.bool, device=self.device)
        self.mixed_S = torch.zeros(capacity, dtype=torch.bool, device=self.device)
        self.count_D = torch.zeros((), dtype=torch.long, device=self.device)  # steps begun
        self._host_steps = 0  # steps begun as the host saw them (eager calls; not graph replays)
        self.version = 0  # bumped when the buffers are reallocated: a captured graph writes the old ones
        self._flags = {flag: torch.tensor([flag], device=self.device) for flag in (False, True)}

    @property
    def capacity(self) -> int:
        return self.rows_LSF.shape[1]

    def reserve(self, steps: int) -> None:
        """Make room for `steps` more steps. Call before capturing a graph that replays them: a
        replay cannot grow the buffer (rows past the capacity overwrite the last one)."""
        need = self._host_steps + steps
        if need > self.capacity:
            extra = max(need, 2 * self.capacity) - self.capacity
            L, _, F = self.rows_LSF.shape
            self.rows_LSF = torch.cat([self.rows_LSF, self.rows_LSF.new_zeros(L, extra, F)], dim=1)
            self.decode_S = torch.cat([self.decode_S, self.decode_S.new_zeros(extra)])
            self.mixed_S = torch.cat([self.mixed_S, self.mixed_S.new_zeros(extra)])
            self.version += 1

    def _open(self, decode: bool) -> None:
        """Open the row of a new forward step (once per model forward, in or out of a graph)."""
        if not _capturing(self.device):
            self.reserve(1)
            self._host_steps += 1
        self.count_D += 1
        self.decode_S.index_copy_(0, self._row(), self._flags[decode])
        self.mixed_S.index_copy_(0, self._row(), self._flags[False])

    def mark_mixed(self) -> None:
        """The forward that recorded last was a mixed step (no host sync: a graph can hold it)."""
        self.mixed_S.index_copy_(0, self._row(), self._flags[True])

    def advance_host(self, steps: int) -> None:
        """Graph replays ran `steps` steps the host did not see: keep growth bookkeeping right."""
        self._host_steps += steps

    def _row(self) -> Tensor:
        return (self.count_D - 1).clamp(0, self.capacity - 1).reshape(1)

    def record(self, layer: int, stats: StepStats, decode: bool) -> None:
        """Write one layer's statistics into the current forward's row (layer 0 opens it)."""
        if layer == 0:
            self._open(decode)
        zero = stats.union.new_zeros((), dtype=torch.float32)
        values = [getattr(stats, f) if getattr(stats, f) is not None else zero for f in FIELDS]
        row_1F = torch.stack([v.to(torch.float32) for v in values]).reshape(1, -1)
        # .to: a layer on another GPU of a spread model records into this device's buffer
        self.rows_LSF[layer].index_copy_(0, self._row(), row_1F.to(self.device))

    def reset(self) -> None:
        self.rows_LSF.zero_()
        self.decode_S.zero_()
        self.mixed_S.zero_()
        self.count_D.zero_()
        self._host_steps = 0

    def steps(self) -> int:
        """Steps recorded so far (one host sync)."""
        return min(int(self.count_D), self.capacity)

    def rows(self) -> list[dict[str, float]]:
        """One dict per (layer, step) with the fields of StepStats; syncs the device once."""
        n = self.steps()
        if n == 0:
            return []
        fields = [f for f in FIELDS if (self.energy or f not in ENERGY_FIELDS)
                  and (self.fidelity or f not in FIDELITY_FIELDS)]
        cols = [FIELDS.index(f) for f in fields]
        values = self.rows_LSF[:, :n, cols].cpu().tolist()
        decode = self.decode_S[:n].cpu().tolist()
        mixed = self.mixed_S[:n].cpu().tolist()
        kind = ["mixed" if m else "decode" if d else "prefill" for d, m in zip(decode, mixed)]
        return [
            {"layer": li, "step": s + 1, "decode": decode[s], "kind": kind[s], **dict(zip(fields, values[li][s]))}
            for s in range(n) for li in range(self.num_layers)
        ]
