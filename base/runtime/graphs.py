"""CUDA graphs of the continuous-batching engine: one per step shape, captured once, counted.

    graphs = StepGraphs(enabled=True)             # on a GPU; False: every step runs eagerly
    graphs.run(("decode",), step_fn, version)     # captures at first use (the warm-up run is a real step), then replays
    graphs.captures                                # graphs captured so far: a test asserts none after warm-up

A key names a step shape: the decode step, or a packed forward of a given kind and token bucket
(base/runtime/continuous.py). A graph writes into the buffers it was captured with; `version`
(the statistics recorder's, base/method/recorder.py) says when those were reallocated, and the
step is captured again (counted). Each graph keeps its own memory pool: graphs are replayed in
any order, which a shared pool does not allow.

`capture` is what turns a step into a replayable one: `cuda_capture` on a GPU; tests on a CPU
pass `eager_capture` (the step runs once, as the real capture's warm-up does, and "replays" by
running again), so the engine's capture bookkeeping is tested without a GPU.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch

Step = Callable[[], None]


class CaptureError(RuntimeError):
    """A step could not be captured (an op that syncs the host or is not graph-safe)."""


def capture_outputs(step: Callable[[], Any]) -> tuple[Step, Any]:
    """Run `step` once eagerly on a side stream (compiles kernels, fills lazy state; a real step),
    then capture it; returns the graph's replay and what `step` returned during capture (the
    static outputs each replay rewrites)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    return graph.replay, outputs


def cuda_capture(step: Step) -> Step:
    """`capture_outputs` for a step that returns nothing: the graph's replay."""
    return capture_outputs(step)[0]


def eager_capture(step: Step) -> Step:
    """A CPU stand-in with the same contract: the capture call runs the step once, replays run it."""
    step()
    return step


class StepGraphs:
    """Captured steps by key, with counts (see the module doc)."""

    def __init__(self, enabled: bool, capture: Callable[[Step], Step] = cuda_capture) -> None:
        self.enabled, self._capture = enabled, capture
        self.replays_run_on_host = capture is eager_capture  # a replay runs the Python step (tests)
        self._graphs: dict[Hashable, tuple[Step, int]] = {}
        self.captures = 0  # captures, re-captures included
        self.replays = 0
        self.eager = 0  # steps run eagerly: every step when disabled, else the captures' warm-up runs

    def run(self, key: Hashable, step: Step, version: int = 0) -> bool:
        """Run one step of shape `key`: replayed if captured (True), else eagerly (capturing it first
        when enabled)."""
        if not self.enabled:
            step()
            self.eager += 1
            return False
        held = self._graphs.get(key)
        if held is not None and held[1] == version:
            held[0]()
            self.replays += 1
            return True
        try:
            replay = self._capture(step)
        except RuntimeError as err:
            raise CaptureError(f"the {key} step cannot be captured in a CUDA graph ({err})") from err
        self._graphs[key] = (replay, version)
        self.captures += 1
        self.eager += 1
        return False

    def keys(self) -> list[Hashable]:
        return list(self._graphs)

    def clear(self) -> None:
        """Drop every graph (the cache buffers they wrote were released or reclaimed)."""
        self._graphs.clear()
