"""tools/tune_kernels.py's search on the CPU (interpreter, eager timing, tiny shapes): each candidate
is checked against experts_reference on the device before it is timed, so a config whose output is
wrong is never chosen, however fast, and a shape where none is right is refused."""
from __future__ import annotations

import pytest
import torch

from tools import tune_kernels as tk
from tools.timing import make_weight_sets

SMOKE = {"H": 40, "I": 24, "E": 8, "K": 2, "norm": True}


def _small_search(monkeypatch, broken_bi: int | None):
    """Two gate_up and two down candidates; the gate_up one with BI == broken_bi computes the wrong
    thing (its output doubled) and is timed as the fastest."""
    monkeypatch.setattr(tk, "GATE_UP", [(16, 16, 16, 4, 1, 1), (16, 8, 16, 4, 1, 1)])
    monkeypatch.setattr(tk, "DOWN", [(16, 16, 16, 4, 1, 1), (16, 8, 16, 4, 1, 1)])
    real = tk.fused_experts

    def fused(*args, config, **kw):
        seen["BI"] = config.gate_up["BI"]
        fits.append(kw["fit"])
        out = real(*args, config=config, **kw)
        return out * 2 if config.gate_up["BI"] == broken_bi else out

    monkeypatch.setattr(tk, "fused_experts", fused)

    def timed(calls, reps, dev):  # the broken candidate's calls time fastest
        seen.clear()
        calls[0]()
        return (1.0 if seen["BI"] == broken_bi else 2.0), "stub"

    seen: dict = {}
    fits: list = []  # each call's `fit`: a candidate is timed as named, never shrunk to fit the device
    monkeypatch.setattr(tk, "time_graph", timed)
    return fits


@pytest.mark.slow
def test_a_wrong_candidate_is_logged_and_never_chosen(monkeypatch):
    fits = _small_search(monkeypatch, broken_bi=8)
    sets = make_weight_sets(SMOKE["E"], SMOKE["H"], SMOKE["I"], 1, "cpu", dtype=torch.float32)
    logs = []
    entry = tk.tune_shape(SMOKE, 4, sets, copy_gbps=1.0, reps=1, log=logs.append)
    assert entry["gate_up"]["BI"] == 16  # the slower candidate whose output is right
    assert any("gate_up (16, 8" in line and "differs from experts_reference" in line for line in logs)
    assert fits and not any(fits)


@pytest.mark.slow
def test_a_shape_where_no_candidate_is_right_is_refused(monkeypatch):
    _small_search(monkeypatch, broken_bi=None)
    monkeypatch.setattr(tk, "matches_reference", lambda out, ref: False)
    sets = make_weight_sets(SMOKE["E"], SMOKE["H"], SMOKE["I"], 1, "cpu", dtype=torch.float32)
    with pytest.raises(RuntimeError, match="no four-launch candidate launched and matched experts_reference"):
        tk.tune_shape(SMOKE, 4, sets, copy_gbps=1.0, reps=1, log=lambda msg: None)


@pytest.mark.slow
def test_the_kept_path_search_times_each_candidate_as_named(monkeypatch):
    """tune_kept_shape checks and times every candidate with fit=False: one the device cannot hold
    fails and is left out instead of being timed as a smaller launch under its own name."""
    monkeypatch.setattr(tk, "GATE_UP_KEPT", [(16, 16, 4, 1, 1), (8, 16, 4, 1, 1)])
    monkeypatch.setattr(tk, "DOWN_KEPT", [(16, 16, 4, 1), (8, 16, 4, 1)])
    real, fits = tk.fused_experts, []

    def fused(*args, **kw):
        fits.append(kw["fit"])
        return real(*args, **kw)

    def timed(calls, reps, dev):  # each candidate's timed call made once, its time a stub
        calls[0]()
        return 1.0, "stub"

    monkeypatch.setattr(tk, "fused_experts", fused)
    monkeypatch.setattr(tk, "time_graph", timed)
    sets = make_weight_sets(SMOKE["E"], SMOKE["H"], SMOKE["I"], 1, "cpu", dtype=torch.float32)
    entry = tk.tune_kept_shape(SMOKE, 4, sets, copy_gbps=1.0, reps=1, log=lambda msg: None)
    assert set(entry) == {"gate_up_kept", "down_kept", "objective_kept"}
    assert fits and not any(fits)


def test_the_check_tells_a_right_output_from_a_wrong_one():
    ref = torch.randn(4, 8, dtype=torch.float64)
    assert tk.matches_reference(ref.bfloat16(), ref)  # bf16 rounding passes
    assert not tk.matches_reference((ref * 1.1).bfloat16(), ref)
    with pytest.raises(tk.WrongOutput, match="differs from experts_reference"):
        tk.check_output(lambda: ref * 2, ref, "x")


@pytest.mark.slow
@pytest.mark.parametrize("v3_wins_at,expected", [((16, 32), 32), ((16, 32, 64), 64), ((), 0), ((32,), 0)])
def test_the_kept_bound_is_where_v3_won_every_alternation_at_every_smaller_bound(monkeypatch, v3_wins_at, expected):
    """kept_max: budgets 16 and 32, then dense (a kept list E = 64 long), in order; the first bound
    where v3 does not win all three alternations ends it (a win above a loss does not count)."""
    model = {"H": 16, "I": 8, "E": 64, "K": 4, "norm": True}

    def timed(calls, reps, dev):
        seen.clear()
        calls[0]()
        assert seen["fit"] is False  # each side timed as its entry names it, never shrunk
        v3 = seen["cfg"].use_kept
        return (1.0 if (v3 and seen["bound"] in v3_wins_at) or (not v3 and seen["bound"] not in v3_wins_at)
                else 2.0), "stub"

    seen: dict = {}
    monkeypatch.setattr(tk, "fused_experts", lambda *a, config, keep_M, fit: seen.update(cfg=config, fit=fit,
                                                                                         bound=keep_M.shape[0]))
    monkeypatch.setattr(tk, "time_graph", timed)
    sets = make_weight_sets(model["E"], model["H"], model["I"], 1, "cpu", dtype=torch.float32)
    cfg = {"gate_up": {}, "down": {}, "gate_up_kept": {}, "down_kept": {}}
    assert tk.kept_bound(model, 32, sets, cfg, reps=1, log=lambda msg: None) == {"kept_max": expected}


def test_a_second_model_of_the_same_expert_shape_is_skipped_with_a_line_saying_whose_entries_stay():
    """The table is keyed by (H, I, T): tuning two models of one shape would silently keep the last."""
    models = {"a": dict(SMOKE), "b": {**SMOKE, "E": 16, "K": 4}, "c": {**SMOKE, "I": 48}}
    lines: list[str] = []
    kept = tk.one_model_per_key(models, log=lines.append)
    assert list(kept) == ["a", "c"]
    assert len(lines) == 1 and "b skipped" in lines[0] and "replace a's" in lines[0]
    assert list(tk.one_model_per_key({"b": models["b"], "a": models["a"]}, log=lines.append)) == ["b"]


@pytest.mark.parametrize("module", ["tools.tune_kernels", "tools.bench_kernels"])
def test_an_unknown_model_is_refused_at_start_with_the_valid_names(module, monkeypatch, capsys):
    """--models takes tools/timing.py's shapes; another name was a KeyError (tune) or silently
    benchmarked nothing (bench)."""
    import importlib

    from tools.timing import MODELS

    monkeypatch.setattr("sys.argv", [module, "--models", "qwen3_30b_a3b", "no_such_model"])
    with pytest.raises(SystemExit) as e:
        importlib.import_module(module).main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and "no_such_model" in err and all(name in err for name in MODELS)


def test_tuning_the_experts_without_a_cuda_device_is_refused_at_start(monkeypatch, tmp_path):
    """tools.tune_kernels times a GPU's launches: on a machine without one it says so (it was a
    traceback from the copy-bandwidth timing), and writes no table."""
    import tools.tune_kernels as tk

    monkeypatch.setattr(tk, "CONFIG_DIR", tmp_path)
    monkeypatch.setattr(tk.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("sys.argv", ["tune_kernels", "--models", "qwen3_30b_a3b"])
    with pytest.raises(SystemExit, match="no CUDA device here"):
        tk.main()
    assert list(tmp_path.iterdir()) == []


def test_the_kernel_benchmark_without_a_cuda_device_is_refused_before_its_folder_is_made(monkeypatch, tmp_path, capsys):
    """Without --smoke, every section of tools.bench_kernels needs a GPU: on a CPU each failed in
    turn and left a folder of failures; now it stops at start with what to run instead."""
    import tools.bench_kernels as bk

    monkeypatch.setattr(bk.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("sys.argv", ["bench_kernels", "--out", str(tmp_path / "bench")])
    with pytest.raises(SystemExit) as e:
        bk.main()
    assert e.value.code == 2 and "--smoke" in capsys.readouterr().err
    assert not (tmp_path / "bench").exists()


def test_the_search_starts_from_the_installed_pair_and_keeps_it_unless_a_candidate_beats_it():
    """The coordinate descent times the installed (gate_up, down) first and the gate_ups with its
    down: where a search from the first down would end at a pair slower than the installed one
    (the 16-token re-tune on an H100 did, results/roofline/tables_2026-12-07), the installed pair
    stays; where a candidate beats it, the candidate is taken; no pair is timed twice."""
    cost = {("g0", "d0"): 5.0, ("g1", "d0"): 4.0, ("g2", "d0"): 6.0,  # from d0: g1, then its best down
            ("g1", "d1"): 3.5, ("g1", "d2"): 4.5,
            ("g2", "d2"): 1.0,  # the installed pair
            ("g0", "d2"): 3.0, ("g1", "d2x"): 9.0}
    timed = []

    def objective(pair):
        timed.append(pair)
        return cost.get(pair, 8.0)

    args = (objective, lambda g, d: (g, d), ["g0", "g1", "g2"], ["d0", "d1", "d2"], ("gate_up", "down"), lambda m: None)
    assert tk._search_pair(*args) == ("g1", "d1", 3.5)  # without a start: worse than the installed pair
    timed.clear()
    assert tk._search_pair(*args, start=("g2", "d2")) == ("g2", "d2", 1.0)
    assert timed[0] == ("g2", "d2") and len(timed) == len(set(timed))
    cost[("g0", "d2")] = 0.5  # a gate_up that beats it with the installed down
    assert tk._search_pair(*args, start=("g2", "d2"))[:2] == ("g0", "d2")


def test_an_installed_launch_becomes_a_candidate_only_with_every_field():
    assert tk.as_candidate(tk.gate_up_cfg((16, 64, 128, 4, 3, 2)), tk.gate_up_cfg) == (16, 64, 128, 4, 3, 2)
    assert tk.as_candidate({"TB": 16, "BI": 64, "BH": 128, "num_warps": 4, "num_stages": 3}, tk.gate_up_cfg) is None
    assert tk.as_candidate(tk.down_kept_cfg((16, 512, 4, 3)), tk.down_kept_cfg) == (16, 512, 4, 3)
