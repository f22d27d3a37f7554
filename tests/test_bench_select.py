"""tools/bench_select.py's `--forms gemv`: the two implementations it times compute the same step."""
import pytest
import torch

from tools.bench_select import SMOKE, router_cases


@pytest.mark.slow
def test_the_gemm_and_gemv_forms_it_times_route_and_select_alike():
    """Per rule and token count, the model's two launches (`_fused_call`: GEMM, then route_select)
    and route_select_gemv's one give the same routing and the same kept set and reassignment (CPU,
    fp32: the GEMMs agree to rounding, far from any tie on these inputs)."""
    cases = router_cases(torch.device("cpu"), SMOKE, ts=(1, 6), budget=4)
    assert {c[0]["rule"] for c in cases} >= {"base", "fixed", "dense", "oea"} and len(cases) == 12
    for labels, calls in cases:
        batch, decision = calls["gemm"]()
        routing, sel = calls["gemv"]()
        torch.testing.assert_close(routing.probs_TE, batch.probs_TE, rtol=1e-5, atol=1e-7)
        assert torch.equal(routing.topk_idx_TK, batch.topk_idx_TK), labels
        assert torch.equal(sel.keep_E, decision.keep_E), labels
        assert torch.equal(sel.topk_idx_TK, decision.topk_idx_TK), labels
        torch.testing.assert_close(sel.topk_w_TK, decision.topk_w_TK, rtol=1e-5, atol=1e-6)
