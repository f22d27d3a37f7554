"""Progress bars (base/progress.py): one rule (drawn on a terminal, never under CI), and the hot
loops report progress through a callback: the continuous scheduler once per finished request."""
from __future__ import annotations

import io
import sys

import pytest
import torch

from base import progress as P
from base.config import SchedulerConfig
from base.hf.loading import load_model
from base.runtime.continuous import ContinuousEngine
from base.runtime.scheduler import Request, serve
from tests.helpers import ROOT, tiny_model_config, torch_threads


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("ci, tty, drawn", [(None, True, True), ("true", True, False), ("1", True, False),
                                            ("false", True, True), ("0", True, True), (None, False, False)])
def test_bars_are_drawn_on_a_terminal_and_never_under_ci(monkeypatch, ci, tty, drawn):
    err = _Terminal() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    assert P.quiet() is not drawn
    with P.progress(total=3, desc="decode", file=err) as bar:
        bar.update(3)
    assert ("decode" in err.getvalue()) is drawn


def test_the_scheduler_reports_every_finished_request_once():
    with torch_threads(1):
        model = load_model(tiny_model_config("qwen3"), ROOT, seed=0)
    g = torch.Generator().manual_seed(0)
    reqs = [Request(torch.randint(3, 200, (4,), generator=g).tolist(), n) for n in (2, 5, 3, 7, 2, 4, 6)]
    engine = ContinuousEngine(model, 3, 32, pad_id=0, buckets=SchedulerConfig().buckets)
    ended: list[int] = []
    try:
        done, _ = serve(engine, reqs, pad_id=0, stop_at_eos=False, policy=SchedulerConfig(), progress=ended.append)
    finally:
        engine.release()
    assert ended == [1] * len(reqs) and all(len(d.tokens) == r.max_new for d, r in zip(done, reqs))
