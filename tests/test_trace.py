"""Issue 41: the online selection replayed offline (base/method/trace.py). On a tiny model served
by the continuous engine, every traced layer's kept set is what the reference selects on the
same routed batch, for the torch and the Triton backend; a replay under another rule disagrees
(the check can fail)."""
from __future__ import annotations

import pytest
import torch

from base.config import SchedulerConfig
from base.hf.budget import BudgetOptions
from base.method.policy import Policy
from base.method.selectors import build_selector
from base.method.trace import Trace, replay
from base.runtime.continuous import ContinuousEngine
from base.runtime.scheduler import Request, serve
from tests.helpers import budgeted, loaded_tiny_qwen3, model_artifacts, torch_threads


model = pytest.fixture(scope="module")(loaded_tiny_qwen3)


def _requests(n: int, seed: int) -> list[Request]:
    g = torch.Generator().manual_seed(seed)
    return [Request(torch.randint(3, 200, (int(torch.randint(2, 10, (1,), generator=g)),), generator=g).tolist(),
                    int(torch.randint(2, 9, (1,), generator=g))) for _ in range(n)]


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.slow)])
def test_the_online_selection_is_the_offline_one_on_the_states_it_met(model, backend):
    arts = model_artifacts(model)
    selector = build_selector("base", arts)
    with torch_threads(1), budgeted(model, "qwen3_moe", selector, BudgetOptions(budget=3, backend=backend)) as budget:
        engine = ContinuousEngine(model, 4, 32, budget=budget, pad_id=0, buckets=[8, 16])
        trace = Trace()
        try:
            with trace.on(budget):
                serve(engine, _requests(9, seed=2), pad_id=0, stop_at_eos=False, policy=SchedulerConfig(buckets=[8, 16]))
        finally:
            engine.release()
    assert len(trace.records) > 20 and len({r.forward for r in trace.records}) > 5
    assert any(r.active_T.sum() > 1 and r.keep_E.sum() == 3 for r in trace.records)  # the budget bound
    assert replay(trace, Policy(selector, 3)) == []
    other = replay(trace, Policy(build_selector("router_sum", arts), 3))
    assert other and "online kept" in other[0]
