"""Launch helpers shared by the kernels: one kernel source, compiled on CUDA, interpreted on CPU.

`dual_jit` keeps two handles on each kernel: `triton.jit` for CUDA tensors and Triton's numpy
interpreter for CPU tensors. CPU callers (tests, CPU-only runs of a budgeted model) therefore work
whatever TRITON_INTERPRET was when this module was imported, and CUDA callers are never
interpreted by accident because some test set that variable. A kernel may call a plain
@triton.jit helper (kernels/experts.py's `_gate_up_tile`): compiled, it is inlined; interpreted, the
call goes to an interpreted copy, as triton.language's own helpers do (`_interpreting`).
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import triton
from triton.runtime.errors import OutOfResources
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

_INTERPRETED: dict[Callable, InterpretedFunction] = {}


@contextmanager
def _interpreting() -> Iterator[None]:
    """Run triton.language's own @jit helpers (tl.zeros, tl.sort, ...) through the interpreter.

    Without TRITON_INTERPRET=1 at import they are compiled-mode JITFunctions, which refuse to be
    called from Python; while a CPU launch runs, calls to them are sent to interpreted copies.
    """
    original = JITFunction.__call__

    def call(self, *args, **kwargs):
        fn = _INTERPRETED.setdefault(self.fn, InterpretedFunction(self.fn))
        return fn(*args, **kwargs)

    JITFunction.__call__ = call
    try:
        yield
    finally:
        JITFunction.__call__ = original


class _CpuLauncher:
    def __init__(self, fn: InterpretedFunction) -> None:
        self.fn = fn

    def __getitem__(self, grid: Any) -> Callable:
        def launch(*args, **kwargs):
            with _interpreting():
                return self.fn[grid](*args, **kwargs)

        return launch


class _OnDevice:
    """Launches on a given GPU. Triton launches on the current CUDA device, and a model spread
    over GPUs (model.device_map=auto) runs layer 30's kernels with GPU 0 current: accelerate moves
    the tensors, not the current device."""

    def __init__(self, fn: Any, device: torch.device) -> None:
        self.fn, self.device = fn, device

    def __getitem__(self, grid: Any) -> Callable:
        kernel = self.fn[grid]

        def launch(*args, **kwargs):
            with torch.cuda.device(self.device):
                return kernel(*args, **kwargs)

        return launch


class DualKernel:
    """A @triton.jit kernel with a compiled (CUDA) and an interpreted (CPU) launcher."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.gpu = triton.jit(fn)
        self.cpu = _CpuLauncher(InterpretedFunction(fn))
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__

    def on(self, device: torch.device) -> Any:
        if device.type == "cpu":
            return self.cpu
        if device.index is None or device.index == torch.cuda.current_device():
            return self.gpu  # the one-GPU case: no device switch per launch
        return _OnDevice(self.gpu, device)


def dual_jit(fn: Callable) -> DualKernel:
    return DualKernel(fn)


def next_pow2(n: int, floor: int = 1) -> int:
    return max(floor, triton.next_power_of_2(max(int(n), 1)))


# Tests set POISON: every buffer a wrapper allocates starts as NaN (floats) or -7777 (ints), so
# an element a kernel forgot to write, or a stale row it read, shows up in the result.
POISON = False


def empty(*shape: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    out = torch.empty(*shape, dtype=dtype, device=device)
    if POISON:
        out.fill_(float("nan") if dtype.is_floating_point else (True if dtype == torch.bool else -7777))
    return out


_COUNTERS: dict[tuple[str, torch.device], list[torch.Tensor]] = {}  # per (kernel, device): every buffer made


def arrival_counters(n: int, device: torch.device, owner: str) -> torch.Tensor:
    """n int32 counters at 0 for `owner`'s launches, which take turns on one stream: a launch's
    programs count their arrivals there and the last one resets its counter, so the buffer is at 0
    between launches and a captured launch replays. Kept for the process's life, never
    reallocated under a captured graph: a launch that needs more makes a larger buffer (the graphs
    captured with the old one keep it alive in the list)."""
    held = _COUNTERS.setdefault((owner, torch.device(device)), [])
    if not held or held[-1].numel() < n:
        held.append(torch.zeros(max(n, 2 * held[-1].numel() if held else 1024), dtype=torch.int32, device=device))
    return held[-1]


def counter_buffers(owner: str) -> list[torch.Tensor]:
    """Every counter buffer `owner`'s launches were given, on every device, oldest first per device."""
    return [buf for (name, _), held in _COUNTERS.items() if name == owner for buf in held]


def fit_shared_memory(run: Callable[[Any], Any], launch: Any, shrink: Callable[[Any], Any | None],
                      fitted: dict, key: Hashable, fit: bool = True) -> Any:
    """run(launch) with a launch the device can hold. Triton refuses a compiled program that needs
    more shared memory than the device has (OutOfResources, raised on the host before anything is
    enqueued, so retrying is safe, also before a graph capture); then `shrink(launch)` gives the
    next smaller launch (None: nothing smaller) and the one that ran is remembered under `key` in
    `fitted`, so later launches go straight to it. `fit` False: run(launch) exactly as named, or
    OutOfResources (a benchmark or tuner times the launch it names, never a shrunk one).

    Why: a tuned table entry is timed in the model's dtype; the same tile in float32 needs twice
    the shared memory (decode attention's BLOCK_N=128 entry of the H200 table: 278 KB in float32
    against the H200's 227 KB), and a table must never select a launch the device cannot hold."""
    if not fit:
        return run(launch)
    launch = fitted.get(key, launch)
    while True:
        try:
            out = run(launch)
        except OutOfResources as err:
            if err.name != "shared memory":
                raise
            smaller = shrink(launch)
            if smaller is None:
                raise
            launch = smaller
            continue
        fitted[key] = launch
        return out
