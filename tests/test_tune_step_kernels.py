"""tools/tune_step_kernels.py on the CPU (interpreter, eager timing): the harness times every
candidate, picks the fastest per key, and merges its entries into the GPU's config file, where the
kernels' launch lookups then find them."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from kernels import tuned
from kernels.attention import AttentionLaunch, attention_launch
from kernels.select import SelectLaunch, select_launch
from tools import tune_step_kernels as tsk


@pytest.mark.slow
def test_the_tuner_picks_the_fastest_candidate_and_installs_it(tmp_path, monkeypatch):
    dev = torch.device("cpu")
    rows, table = tsk.tune_select(dev, {"H": 16, "E": 16, "K": 2, "budget": 3}, (4,), (1, 2), (4,), reps=1)
    # base's launch (it selects) and dense's (nothing to drop), each timed over every candidate, each its entry
    assert sorted((r["kernel"], r["num_warps"]) for r in rows) == [("route", 1), ("route", 2), ("select", 1),
                                                                   ("select", 2)]
    fastest, fastest_route = (min((r for r in rows if r["kernel"] == k), key=lambda r: r["us"]) for k in ("select", "route"))
    assert table == {f"{k}:E=16,T=4": {"num_warps": r["num_warps"], "TB": 4, "split": False, "us": r["us"]}
                     for k, r in (("select", fastest), ("route", fastest_route))}
    # two tiles of 4 tokens: the split launch is a candidate too; the fastest form is the entry
    split_rows, split_table = tsk.tune_select(dev, {"H": 16, "E": 16, "K": 2, "budget": 3}, (8,), (1,), (4,), reps=1)
    split_rows = [r for r in split_rows if r["kernel"] == "select"]
    assert sorted((r["split"], r["TB"]) for r in split_rows) == [(False, 4), (True, 4)]
    best = min(split_rows, key=lambda r: r["us"])
    assert {k: split_table["select:E=16,T=8"][k] for k in ("split", "TB")} == {"split": best["split"], "TB": best["TB"]}
    att_rows, att_table = tsk.tune_attention(dev, (("m", 2, 1, 16),), (1,), 64, (20, 64), (32, 64), (4,), (2,), reps=1)
    assert len(att_rows) == 4  # 2 filled lengths x 2 block sizes
    assert set(att_table) == {"attention:G=16,D=16", "attention:G=2,D=16,T=1"}  # every batch; this G at 1 row
    entry = att_table["attention:G=16,D=16"]
    assert entry["BLOCK_N"] in (32, 64) and entry["objective"] >= 1.0

    from tools import tune_kernels

    monkeypatch.setattr(tune_kernels, "CONFIG_DIR", tmp_path)
    monkeypatch.setattr(tune_kernels, "device_name", lambda device: "gpu")
    (tmp_path / "gpu.json").write_text(json.dumps({"H=1,I=1,T=1": {"gate_up": {"TB": 16}}}))
    path = tsk.install({**table, **split_table, **att_table}, dev)
    written = json.loads(path.read_text())
    assert written["H=1,I=1,T=1"] == {"gate_up": {"TB": 16}}  # the experts' entries stay
    assert "us" not in written["select:E=16,T=4"]


    monkeypatch.setattr(tuned, "load_configs", lambda name: written)
    assert select_launch(16, 3, dev) == SelectLaunch(num_warps=fastest["num_warps"], tokens_per_tile=4)
    assert select_launch(16, 3, dev, selects=False) == SelectLaunch(num_warps=fastest_route["num_warps"], tokens_per_tile=4)
    assert select_launch(16, 8, dev) == SelectLaunch(num_warps=1, tokens_per_tile=best["TB"], split=best["split"])
    assert attention_launch(2, 16, dev) == AttentionLaunch(block_n=entry["BLOCK_N"], num_warps=4, target_programs=2)
    one = att_table["attention:G=2,D=16,T=1"]
    assert attention_launch(2, 16, dev, B=1).block_n == one["BLOCK_N"]
    assert attention_launch(2, 16, dev, B=64).block_n == one["BLOCK_N"]  # the nearest batch tuned
    assert attention_launch(4, 16, dev, B=1).block_n == entry["BLOCK_N"]  # no entry for G=4: the G block's


@pytest.mark.slow
def test_a_candidate_whose_selection_differs_is_never_installed(monkeypatch):
    """The tuner checks each candidate launch's selection against the built-in launch's on the device
    it tunes on: a candidate that keeps other experts is logged (matches_default False) and not
    chosen, however fast; if none matches, it refuses rather than install one."""
    from kernels.select import route_select

    def broken_for_one_warp(*args, launch, **kw):  # num_warps=1 keeps the wrong expert first
        routing, sel = route_select(*args, launch=launch, **kw)
        if launch.num_warps == 1:
            sel.keep_M.copy_(sel.keep_M.flip(0))
        return routing, sel

    monkeypatch.setattr(tsk, "route_select", broken_for_one_warp)
    monkeypatch.setattr(tsk, "time_graph", lambda fns, reps, dev: (1.0 if fns[0].keywords["launch"].num_warps == 1
                                                                   else 2.0, "stub"))
    rows, table = tsk.tune_select(torch.device("cpu"), {"H": 16, "E": 16, "K": 2, "budget": 3}, (4,), (1, 2), (4,), reps=1)
    assert {(r["num_warps"], r["matches_default"]) for r in rows} == {(1, False), (2, True)}
    assert table["select:E=16,T=4"]["num_warps"] == 2  # the slower candidate that selects as the default
    with pytest.raises(RuntimeError, match="no candidate launch gives the built-in launch's selection"):
        tsk.tune_select(torch.device("cpu"), {"H": 16, "E": 16, "K": 2, "budget": 3}, (4,), (1,), (4,), reps=1)


def test_the_attention_entries_per_batch_pick_each_batchs_best(tmp_path, monkeypatch):
    """From a timing table alone (as `--from-csv` reads it): over all shapes one candidate is best on
    average, but at 1 row another is; each batch's entry takes its own best, the G block's the mean's,
    and the CLI installs them into the named GPU's file."""
    rows = []
    for B, filled, a_us, b_us in ((1, 256, 10.0, 5.0), (1, 640, 10.0, 5.0), (16, 256, 5.0, 20.0), (16, 640, 5.0, 20.0)):
        for bn, us in ((32, a_us), (64, b_us)):
            rows.append({"kernel": "attention", "model": "m", "G": 8, "D": 128, "B": B, "filled": filled,
                         "BLOCK_N": bn, "num_warps": 4, "target_programs": 64, "us": us})
    table = tsk.attention_table(pd.DataFrame(rows))
    assert table["attention:G=8,D=128,T=1"]["BLOCK_N"] == 64 and table["attention:G=8,D=128,T=16"]["BLOCK_N"] == 32
    assert table["attention:G=16,D=128"]["BLOCK_N"] == 32  # mean rel: 32 -> (2 + 1) / 2, 64 -> (1 + 4) / 2
    csv = tmp_path / "tune_step.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    from tools import tune_kernels

    monkeypatch.setattr(tune_kernels, "CONFIG_DIR", tmp_path)
    monkeypatch.setattr("sys.argv", ["tune_step_kernels", "--from-csv", str(csv), "--device-name", "GPU_X"])
    tsk.main()
    written = json.loads((tmp_path / "GPU_X.json").read_text())
    assert written["attention:G=8,D=128,T=16"]["BLOCK_N"] == 32 and "us" not in written["attention:G=8,D=128,T=1"]


def test_an_attention_candidate_wrong_at_any_shape_is_in_no_entry():
    """The tuner checks each attention candidate against decode_attention_reference at every shape
    it times: one that is fastest everywhere but wrong at one shape is in no entry; none right: refused."""
    rows = []
    for B, filled in ((1, 256), (16, 640)):
        for bn, us in ((32, 10.0), (64, 5.0)):
            rows.append({"kernel": "attention", "model": "m", "G": 8, "D": 128, "B": B, "filled": filled,
                         "BLOCK_N": bn, "num_warps": 4, "target_programs": 64, "us": us,
                         "matches_reference": not (bn == 64 and B == 16)})
    table = tsk.attention_table(pd.DataFrame(rows))
    assert {e["BLOCK_N"] for e in table.values()} == {32}
    for r in rows:
        r["matches_reference"] = False
    with pytest.raises(RuntimeError, match="no attention candidate matched decode_attention_reference"):
        tsk.attention_table(pd.DataFrame(rows))


def test_from_csv_takes_one_implementations_rows_of_an_ab_search(tmp_path, monkeypatch, capsys):
    """tools/bench_attention.py's search table times two implementations: `--impl` makes the entries
    from the named one's rows alone; without it, or naming one the table lacks, the CLI refuses."""
    rows = []
    for impl, fast in (("current", 32), ("baseline", 64)):
        for B in (1, 16):
            for bn in (32, 64):
                rows.append({"kernel": "attention", "model": "m", "G": 8, "D": 128, "B": B, "filled": 256,
                             "impl": impl, "BLOCK_N": bn, "num_warps": 4, "target_programs": 64,
                             "us": 5.0 if bn == fast else 9.0, "matches_reference": True})
    csv = tmp_path / "bench_attention_search.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    from tools import tune_kernels

    monkeypatch.setattr(tune_kernels, "CONFIG_DIR", tmp_path)
    for extra, error in (([], "name one with --impl"), (["--impl", "other"], "has ['baseline', 'current']")):
        monkeypatch.setattr("sys.argv", ["tune_step_kernels", "--from-csv", str(csv), "--device-name", "GPU_X", *extra])
        with pytest.raises(SystemExit, match=error.replace("[", r"\[").replace("]", r"\]")):
            tsk.main()
    assert not (tmp_path / "GPU_X.json").exists()
    monkeypatch.setattr("sys.argv", ["tune_step_kernels", "--from-csv", str(csv), "--device-name", "GPU_X",
                                     "--impl", "baseline"])
    tsk.main()
    written = json.loads((tmp_path / "GPU_X.json").read_text())
    assert {e["BLOCK_N"] for e in written.values()} == {64}


def test_a_tuning_stopped_in_a_later_bucket_keeps_the_buckets_it_finished(tmp_path, monkeypatch):
    """The selection is tuned, written to --csv and installed one token bucket at a time: a run
    interrupted in its second bucket (as `timeout --signal=INT` stops it) has kept the first's
    timings and entries. (The tuning itself is the slow test above; here each bucket's is a stand-in.)"""
    from tools import tune_kernels

    monkeypatch.setattr(tune_kernels, "CONFIG_DIR", tmp_path)
    monkeypatch.setattr(tune_kernels, "device_name", lambda device: "gpu")
    monkeypatch.setattr(tsk.torch.cuda, "is_available", lambda: True)  # a GPU's run: only a GPU's is installed
    asked = []

    def one_bucket(dev, model, ts, *args, **kw):
        asked.append(ts)
        (T,) = ts
        if T == 16:
            raise KeyboardInterrupt
        entry = {"num_warps": 1, "TB": 4, "split": False, "us": 1.0}
        return [{"kernel": k, "E": 16, "T": T, **entry} for k in ("select", "route")], \
            {f"{k}:E=16,T={T}": entry for k in ("select", "route")}

    monkeypatch.setattr(tsk, "tune_select", one_bucket)
    csv = tmp_path / "tune_step.csv"
    monkeypatch.setattr("sys.argv", ["tune_step_kernels", "--kernels", "select", "--select-ts", "1", "16",
                                     "--csv", str(csv)])
    with pytest.raises(KeyboardInterrupt):
        tsk.main()
    assert asked == [(1,), (16,)]
    assert set(pd.read_csv(csv)["T"]) == {1}
    written = json.loads((tmp_path / "gpu.json").read_text())
    assert set(written) == {"select:E=16,T=1", "route:E=16,T=1"} and "us" not in written["select:E=16,T=1"]


@pytest.mark.parametrize("argv,cuda", [(["--kernels", "select"], False), (["--smoke"], True), (["--smoke"], False)])
def test_a_cpus_timings_install_nothing_and_are_refused_before_any_timing(tmp_path, monkeypatch, capsys, argv, cuda):
    """Without a CUDA device (or with --smoke, which runs on the CPU) the timings are the
    interpreter's: installing them would write kernels/configs/cpu.json, which every CPU run's
    launches would then read. Refused at start unless --no-install; with it the harness runs."""
    from tools import tune_kernels

    monkeypatch.setattr(tune_kernels, "CONFIG_DIR", tmp_path)
    monkeypatch.setattr(tsk.torch.cuda, "is_available", lambda: cuda)
    asked = []

    def one_bucket(dev, model, ts, *args, **kw):
        asked.append(dev.type)
        return [], {}

    monkeypatch.setattr(tsk, "tune_select", one_bucket)
    monkeypatch.setattr(tsk, "tune_attention", lambda dev, *a, **kw: ([], {}))
    monkeypatch.setattr("sys.argv", ["tune_step_kernels", *argv])
    with pytest.raises(SystemExit, match="pass --no-install"):
        tsk.main()
    assert asked == [] and list(tmp_path.iterdir()) == []
    monkeypatch.setattr("sys.argv", ["tune_step_kernels", *argv, "--no-install"])
    tsk.main()
    assert asked and set(asked) == {"cpu"} and list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="GPUs' tables"):  # the writer itself refuses a CPU's table
        tune_kernels.install_named({"select:E=16,T=1": {"num_warps": 1}}, "cpu")
    assert list(tmp_path.iterdir()) == []


def test_candidates_compile_side_by_side_each_once_with_their_failures_reported_in_order():
    """tools/timing.compile_side_by_side calls every candidate exactly once, `workers` at a time in
    threads (a barrier that only as many threads as workers can pass together proves they overlap),
    and returns each call's exception in the candidates' order (None where it returned), so a
    candidate that cannot compile stops nothing; with one worker it runs them in turn, no thread."""
    import threading

    from tools.timing import compile_side_by_side

    calls, together = [], threading.Barrier(4, timeout=10)

    def candidate(i: int):
        def call():
            calls.append((i, threading.get_ident()))
            together.wait()  # only returns once 4 calls run at the same time
            if i % 3 == 0:
                raise ValueError(f"candidate {i}")
        return call

    errors = compile_side_by_side([candidate(i) for i in range(8)], workers=4)
    assert sorted(i for i, _ in calls) == list(range(8))
    assert [str(e) if e else None for e in errors] == ["candidate 0", None, None, "candidate 3", None, None,
                                                       "candidate 6", None]
    assert len({t for _, t in calls}) == 4 and threading.get_ident() not in {t for _, t in calls}
    calls.clear()
    order = compile_side_by_side([lambda i=i: calls.append((i, threading.get_ident())) for i in range(3)], workers=1)
    assert order == [None, None, None] and [i for i, _ in calls] == [0, 1, 2]
    assert {t for _, t in calls} == {threading.get_ident()}


def test_an_attention_candidate_the_device_cannot_hold_is_left_out_not_timed_halved(monkeypatch):
    """A candidate over the device's shared memory (Triton's OutOfResources) fails as named in the
    tuner (fit=False): it is logged and left out of every row and entry, where the kernel's own
    fitting would have timed a halved launch under the candidate's name."""
    from triton.runtime.errors import OutOfResources

    real = tsk.decode_attention
    asked = []

    def limited(*args, launch=None, fit=True, **kwargs):
        asked.append(fit)
        if launch.block_n > 32:
            raise OutOfResources(launch.block_n * 4096, 196608, "shared memory")
        return real(*args, launch=launch, fit=fit, **kwargs)

    monkeypatch.setattr(tsk, "decode_attention", limited)
    rows, table = tsk.tune_attention(torch.device("cpu"), (("m", 2, 1, 16),), (1,), 64, (20,), (32, 64), (4,), (2,),
                                     reps=1)
    assert not any(asked)  # every call of the tuner names its launch exactly
    assert [r["BLOCK_N"] for r in rows] == [32]
    assert {e["BLOCK_N"] for e in table.values()} == {32}
