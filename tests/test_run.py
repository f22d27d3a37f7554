"""run.py end to end: in a subprocess as a user runs it (evaluate and resume, exit codes), and in
process as run.py runs a job (the selection features, the fit and throughput stages), where a
test pays no interpreter start. Slow ones (a multirun, the engine against generate, the paper's
stand-in tasks, real shapes on the meta device) run under `make test-all`."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    flags = [a for a in args if a.startswith("-")]  # argparse wants -m before the overrides
    args = tuple(a for a in args if not a.startswith("-"))
    cmd = [sys.executable, str(ROOT / "run.py"), *flags, f"outputs_dir={tmp_path}", f"artifacts_dir={tmp_path}/artifacts",
           "logger=none", *args]
    for key, value in (("model", "tiny_qwen3"), ("task", "smoke")):  # small defaults for speed
        if not any(a.startswith(f"{key}=") for a in args):
            cmd.append(f"{key}={value}")
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def _run_here(compose, tmp_path: Path, *overrides: str) -> tuple[dict, Path]:
    """One run as run.py's job does it, in this process: (report, run folder)."""
    from omegaconf import OmegaConf

    import run
    from base.run.pipeline import run as run_pipeline

    args = [*overrides]
    for key, value in (("model", "tiny_qwen3"), ("task", "smoke")):  # small defaults for speed
        if not any(a.startswith(f"{key}=") for a in args):
            args.append(f"{key}={value}")
    out = tmp_path / "_".join(a.replace("=", "-").replace("/", "") for a in overrides)[:100]
    cfg = compose([*args, "logger=none", f"artifacts_dir={tmp_path}/artifacts"])
    return run_pipeline(run.build_config(cfg, out, ",".join(overrides)), OmegaConf.to_yaml(cfg, resolve=True)), out


def _runs_in(root: Path) -> list[Path]:
    """The run folders under root (beside them while a run holds it: its `.<name>.lock`, base/run/run_folder.py)."""
    return [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]


def _run_dir(root: Path, *parts: str) -> Path:
    """The one run folder whose name (Hydra's sorted overrides) holds every `key=value` part."""
    (found,) = [p for p in _runs_in(root) if set(parts) <= set(p.name.split(","))]
    return found


@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_evaluate_then_resume_skips(tmp_path):
    proc = _run(tmp_path, "method=base", "budget=4", "batch_size=8")
    assert proc.returncode == 0
    assert "Passed an already-initialized model" not in proc.stdout + proc.stderr  # lm-eval's, expected here
    out = tmp_path / "default" / "batch_size=8,budget=4,method=base,model=tiny_qwen3,task=smoke"  # sorted keys
    report = json.loads((out / "report.json").read_text())
    assert report["eval"]["order"] == "mixed"
    assert report["eval"]["decode_steps_by_task"]["smoke_copy"] > 0  # the budget applied to its decode steps
    samples = pd.read_json(out / "samples.jsonl", lines=True)  # one row per request, for paired comparisons
    assert len(samples) == 8 and set(samples["decode_batch"]) == {0} and samples["prompt_hash"].nunique() == 8
    assert set(samples["correct"]) <= {0.0, 1.0}
    assert samples["correct"].mean() == pytest.approx(report["metrics"][0]["value"])
    assert report["metrics"][0]["stderr"] is not None  # standard errors, not "N/A"
    from analysis.paired import load_samples, paired

    # a run against itself: no discordant request; 8 prompts cannot show equivalence within 1 point
    assert paired(load_samples(out), load_samples(out))["call"] == "inconclusive"
    assert report["eval"]["generation"]["do_sample"] is False and report["summary_tasks"][0]["task"] == "smoke_copy"
    assert {r["task"] for r in report["metrics"]} == {"smoke_copy"}
    sel = pd.read_csv(out / "selection.csv")
    assert len(sel) == report["moe_layers"] and (sel["kept_mean"] <= 4).all()
    steps = pd.read_csv(out / "selection_steps.csv")
    assert steps["kept"].max() <= 4 and (steps["union"] >= steps["kept"]).all()
    assert (out / "config.yaml").read_text().count("budget: 4") == 1
    assert Path(report["artifacts"]["predictor"]).exists()

    mtime = (out / "report.json").stat().st_mtime
    again = _run(tmp_path, "method=base", "budget=4", "batch_size=8")
    assert again.returncode == 0 and "skipping" in again.stdout
    assert (out / "report.json").stat().st_mtime == mtime


def test_adaptive_budget_keeps_a_varying_count_covering_the_cost(compose, tmp_path):
    """method.coverage with no budget: per layer and step, the fewest experts covering 60 % of
    BASE's predicted cost; the count varies and the distribution is in selection.csv."""
    _, out = _run_here(compose, tmp_path, "method=base", "method.coverage=0.6", "budget=null", "batch_size=8")
    steps = pd.read_csv(out / "selection_steps.csv")
    assert (steps["kept"] >= 1).all() and (steps["kept"] <= steps["union"]).all()
    assert (steps["kept"] < steps["union"]).any() and steps["kept"].nunique() > 1
    sel = pd.read_csv(out / "selection.csv")
    assert (sel["kept_min"] <= sel["kept_p50"]).all() and (sel["kept_p90"] <= sel["kept_max"]).all()


@pytest.mark.slow  # the fast tier keeps the torch run above
def test_adaptive_budget_on_the_kernels_keeps_what_the_reference_keeps(compose, tmp_path):
    """method.coverage on method.backend=triton (the selection kernel's COVERAGE rule) is accepted
    and keeps, step by step, the experts the PyTorch reference keeps."""
    runs = [_run_here(compose, tmp_path / b, "method=base", "method.coverage=0.6", "budget=null", "batch_size=8",
                      f"method.backend={b}")[1] for b in ("torch", "triton")]
    torch_steps, triton_steps = (pd.read_csv(out / "selection_steps.csv") for out in runs)
    assert triton_steps["kept"].nunique() > 1
    pd.testing.assert_frame_equal(triton_steps, torch_steps)


@pytest.mark.slow
def test_similar_rerouting_runs_with_calibrated_expert_similarity(compose, tmp_path):
    report, out = _run_here(compose, tmp_path, "method=router_sum", "method.reassign=similar", "budget=2", "batch_size=8")
    assert "output cosine similarity" in report["artifacts"]["similarity"]
    steps = pd.read_csv(out / "selection_steps.csv")
    assert steps["kept"].max() <= 2 and (steps["executed"] <= 2).all()  # substitutes are kept experts


@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_sensitivity_split_keeps_the_mean_budget_with_layers_that_differ(compose, tmp_path):
    report, out = _run_here(compose, tmp_path, "method=base", "method.budget_split=sensitivity", "budget=2",
                            "batch_size=8")
    split = report["artifacts"]["layer_budgets"]["2"]
    assert sum(split.values()) == 2 * len(split)
    sel = pd.read_csv(out / "selection.csv")
    assert all(sel.loc[sel["layer"] == int(layer), "kept_max"].iloc[0] <= m for layer, m in split.items())


@pytest.mark.slow  # a multirun through Hydra's launcher: tests/test_sweep.py has the fast one
def test_multirun_two_points(tmp_path):
    proc = _run(tmp_path, "-m", "method=router_sum", "budget=2,6", "batch_size=8")
    assert proc.returncode == 0
    kept = {}
    for b in (2, 6):
        rep = json.loads((_run_dir(tmp_path / "default", f"budget={b}", "method=router_sum") / "report.json").read_text())
        kept[b] = rep["summary"]["kept_mean"]
        assert rep["summary"]["kept_mean"] <= b
    assert kept[2] < kept[6]


@pytest.mark.slow  # the command line's exit code: tests/test_bad_inputs.py has the fast one
def test_budget_above_experts_fails_at_start(tmp_path):
    proc = _run(tmp_path, "budget=17")
    assert proc.returncode == 2
    assert "budget=17 exceeds the 16 experts of tiny_qwen3" in proc.stderr
    assert not list(tmp_path.rglob("report.json"))


@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_fit_and_throughput_stages(compose, tmp_path):
    _, fit = _run_here(compose, tmp_path, "stage=fit")
    r2 = pd.read_csv(fit / "predictor.csv")
    assert len(r2) == 2 and r2["r2"].notna().all()
    report, tp = _run_here(compose, tmp_path, "stage=throughput", "method=count", "budget=3", "throughput.batch_sizes=[4]",
                      "throughput.prompt_len=6", "throughput.gen_tokens=4", "throughput.stats_steps=3",
                      "throughput.methods=[dense,count,oea:1]", "throughput.budgets=[2,3]",
                      "throughput.profile_batch=4", "throughput.repeats=2")
    rows = pd.read_csv(tp / "throughput.csv")
    # two interleaved timed passes per configuration; ms_per_step is their median
    assert (rows["repeats"] == 2).all()
    for _, r in rows.iterrows():
        runs = [float(x) for x in r["ms_runs"].split(";")]
        assert len(runs) == 2 and r["ms_per_step"] == pytest.approx(sum(runs) / 2, rel=1e-4)
    # dense first, count at each budget, oea once (it ignores the budget); CPU: eager engine
    assert rows["variant"].tolist() == ["dense", "count", "count", "oea(k0=1)"]
    assert (rows["tokens_per_s"] > 0).all() and (rows["mode"] == "eager").all()
    for budget in (2, 3):
        assert 0 < rows.loc[rows["budget"] == budget, "kept_mean"].iloc[0] <= budget
    dense = rows.iloc[0]
    assert dense["kept_mean"] == dense["union_mean"] > 3 and dense["speedup_vs_dense"] == 1.0
    prof = pd.read_csv(tp / "profile.csv")
    assert set(prof["variant"]) == {"dense", "count", "oea(k0=1)"}  # the first budget only
    assert {"attention", "expert FFN", "router/selection", "LM head"} <= set(prof["class"])
    for _, one in prof.groupby("variant"):  # every kernel (CPU: operator) in exactly one class
        parts = one.loc[one["class"] != "total", "ms_per_step"].sum()
        assert parts == pytest.approx(one.loc[one["class"] == "total", "ms_per_step"].iloc[0], rel=1e-6)
        n = one.loc[one["class"] != "total", "kernels_per_step"].sum()
        assert n == pytest.approx(one.loc[one["class"] == "total", "kernels_per_step"].iloc[0]) and n > 0
    # tiny_qwen3's expert: gate, up and down, 64 x 32 each, float32; no copy bandwidth on a CPU
    assert report["expert_bytes"] == 3 * 64 * 32 * 4 and "copy_gbps" not in report
    assert report["timing_note"].startswith("on a CPU the times are a smoke test") and "interpreter" not in report["timing_note"]
    from analysis.throughput import profile_rows

    ffn = profile_rows(tmp_path).query("`class` == 'expert FFN'").set_index("variant")
    kept = rows[rows["budget"].isin([2]) | rows["budget"].isna()].set_index("variant")["kept_mean"]
    for variant in ("dense", "count"):  # MoE layers x experts kept x bytes, read once a step
        gb = 2 * kept[variant] * report["expert_bytes"] / 1e9
        assert ffn.loc[variant, "expert_gb_per_step"] == pytest.approx(gb)
        assert ffn.loc[variant, "expert_tb_per_s"] == pytest.approx(gb / ffn.loc[variant, "ms_per_step"])


def test_a_cpu_throughput_run_says_its_times_are_a_smoke_test_and_when_triton_is_interpreted(compose, tmp_path):
    """experiment=throughput on a CPU runs the Triton kernels in Triton's interpreter (hundreds of
    times slower than PyTorch): the run says so at start and in report.json, and analysis.throughput
    above its tables."""
    import types

    import torch

    import run
    from base.run.pipeline import cpu_timing_note

    model = torch.nn.Linear(2, 2)
    model.config = types.SimpleNamespace(_experts_implementation="base_triton")
    triton_cfg = run.build_config(compose(["experiment=throughput", "model=tiny_qwen3"]), tmp_path / "a")
    assert "Triton's interpreter" in cpu_timing_note(triton_cfg, model)
    model.config = types.SimpleNamespace(_experts_implementation="eager")
    torch_cfg = run.build_config(compose(["stage=throughput", "model=tiny_qwen3"]), tmp_path / "b")
    note = cpu_timing_note(torch_cfg, model)
    assert note.startswith("on a CPU the times are a smoke test") and "interpreter" not in note


@pytest.mark.slow
def test_many_overrides_fit_in_a_folder_name(tmp_path):
    """Hydra names a run folder by its overrides; past a file-name limit the name gets a hash."""
    long = [f"throughput.batch_sizes=[{','.join(str(m) for m in range(1, 61))}]", "stage=describe", "model.device=meta",
            "model=qwen3_30b", "model.init=random"]
    proc = _run(tmp_path, *long)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (folder,) = _runs_in(tmp_path / "default")
    assert len(folder.name) <= 120
    assert "throughput.batch_sizes=[1,2,3" in json.loads((folder / "report.json").read_text())["overrides"]


@pytest.mark.slow  # tests/test_placement.py describes a model in process
def test_describe_real_shape_on_meta(tmp_path):
    proc = _run(tmp_path, "model=qwen3_30b", "model.init=random", "model.device=meta", "stage=describe")
    assert proc.returncode == 0
    rep = json.loads(next(tmp_path.rglob("report.json")).read_text())["describe"]
    assert (rep["num_experts"], rep["moe_layers"], rep["top_k"], rep["hidden_size"]) == (128, 48, 8, 2048)
    assert 30.0e9 < rep["params_total"] < 31.0e9
    assert 3.0e9 < rep["params_active_per_token"] < 3.5e9


@pytest.mark.slow  # tests/test_engine.py compares the two decodings in process
def test_evaluate_through_the_engine_equals_generate(tmp_path):
    """eval.engine=on (what a GPU uses by default) gives generate's answers and statistics."""
    common = ("model=mini", "task=mini_smoke", "method=base", "budget=6", "batch_size=8", "eval.batching=static")
    runs = {}
    for engine in ("off", "on"):
        assert _run(tmp_path, *common, f"eval.engine={engine}", f"exp_name={engine}").returncode == 0
        (out,) = _runs_in(tmp_path / engine)
        runs[engine] = (json.loads((out / "report.json").read_text()), pd.read_csv(out / "selection_steps.csv"))
    (off, off_steps), (on, on_steps) = runs["off"], runs["on"]
    assert (off["eval"]["engine"], on["eval"]["engine"]) == (False, True)
    assert on["eval"]["decode_steps"] == off["eval"]["decode_steps"] > 0
    assert on["metrics"] == off["metrics"]
    pd.testing.assert_frame_equal(on_steps, off_steps)


@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_a_changed_config_in_the_same_folder_reruns(compose, tmp_path, capsys):
    """A folder is named by command-line overrides only, so a value changed another way (an
    experiment file, a default) lands in the same folder: the config hash tells it apart."""
    from omegaconf import OmegaConf

    import run
    from base.run.pipeline import run as run_pipeline

    out = tmp_path / "same"
    reports = []
    for batch_size in (8, 8, 4):
        cfg = compose(["model=tiny_qwen3", "task=smoke", "logger=none", "method=router_sum", "budget=3",
                       f"batch_size={batch_size}", f"artifacts_dir={tmp_path}/a", "diagnose.enabled=false"])
        reports.append(run_pipeline(run.build_config(cfg, out), OmegaConf.to_yaml(cfg, resolve=True)))
    assert reports[1] is None and "same config); skipping" in capsys.readouterr().out  # unchanged: skipped
    assert reports[2]["batch_size"] == 4 and reports[2]["config_hash"] != reports[0]["config_hash"]
    assert json.loads((out / "report.json").read_text())["batch_size"] == 4


@pytest.mark.slow  # tests/test_artifact_sharing.py has the fast one
def test_two_processes_computing_one_artifact(tmp_path):
    """Both calibrate the same model into one artifacts folder at once: the lock serialises them
    and the files stay whole (atomic per-process temporary names)."""
    import subprocess
    import sys

    from base.method.calibration import Calibration

    cmd = [sys.executable, str(ROOT / "run.py"), f"outputs_dir={tmp_path}", f"artifacts_dir={tmp_path}/art",
           "logger=none", "model=tiny_qwen3", "task=smoke", "stage=calibrate"]
    procs = [subprocess.Popen([*cmd, f"exp_name=p{i}"], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
    (calib_dir,) = {p.parent for p in (tmp_path / "art").rglob("calib.json")}
    assert Calibration.load(calib_dir).meta["num_layers"] == 2
    assert not [p for p in calib_dir.iterdir() if ".tmp" in p.name]


@pytest.mark.slow
def test_run_log_ends_with_the_results_the_run_prints(compose, tmp_path, capsys):
    """run.log holds lm-eval's and transformers' log records, and then the table run.py prints at
    the end (base/run/report.py): a run folder alone says how the run ended."""
    from base.run.report import print_report

    report, out = _run_here(compose, tmp_path, "method=router_sum", "budget=2", "task.limit=3")
    capsys.readouterr()
    print_report(report, out)
    printed = capsys.readouterr().out.lstrip("\n")
    log = (out / "run.log").read_text()
    assert log.endswith(printed) and len(log) > len(printed)
    assert f"-> {out}" in printed and "smoke_copy" in printed and "  summary: accuracy=" in printed


@pytest.mark.slow
def test_a_budgeted_run_whose_task_never_decodes_fails_loudly(compose, tmp_path):
    """eval.gen_tokens=1: the prefill makes the only token, so no decode step ever sees the budget."""
    from base.checks import ConfigError

    with pytest.raises(ConfigError, match="smoke_copy ran no decode step: method=router_sum changes decode steps only"):
        _run_here(compose, tmp_path, "method=router_sum", "budget=3", "eval.gen_tokens=1")
    assert not list(tmp_path.rglob("report.json"))


@pytest.mark.slow
def test_paper_standin_runs_end_to_end_and_every_task_decodes(tmp_path):
    """task=paper's shapes offline: sampling as the paper does, 384 tokens set, the code task only
    with the unsafe-code opt-in; the report shows every task's decode steps and what was averaged."""
    refused = _run(tmp_path, "task=paper_standin", "method=router_sum", "budget=3")
    assert refused.returncode == 2 and "set eval.confirm_unsafe_code=true" in refused.stderr
    proc = _run(tmp_path, "task=paper_standin", "method=router_sum", "budget=3", "eval.confirm_unsafe_code=true")
    assert proc.returncode == 0
    report = json.loads(next(tmp_path.rglob("report.json")).read_text())
    tasks = ["standin_math", "standin_yesno", "standin_choice", "standin_code"]
    assert all(report["eval"]["decode_steps_by_task"][t] > 0 for t in tasks)
    assert [r["task"] for r in report["summary_tasks"]] == tasks
    gen = report["eval"]["generation"]
    assert (gen["do_sample"], gen["temperature"], gen["top_p"], gen["top_k"], gen["gen_tokens"]) == (True, 0.7, 0.8, 20, 384)


def test_a_failing_run_finishes_its_logger_as_failed(compose, tmp_path, monkeypatch):
    """The model fails to load after the logger opened: the logger is still finished, with failure."""
    from omegaconf import OmegaConf

    import run
    from base.run import pipeline

    calls = []

    class FakeLogger:
        def __init__(self, *args, **kwargs) -> None:
            calls.append("open")

        def finish(self, ok: bool = True) -> None:
            calls.append(("finish", ok))

    def broken_load(*args, **kwargs):
        raise OSError("disk gone")

    monkeypatch.setattr(pipeline, "Logger", FakeLogger)
    monkeypatch.setattr(pipeline, "load_model", broken_load)
    cfg = compose(["model=tiny_qwen3", "task=smoke", "method=dense", "budget=null"])
    with pytest.raises(OSError, match="disk gone"):
        pipeline.run(run.build_config(cfg, tmp_path / "out"), OmegaConf.to_yaml(cfg, resolve=True))
    assert calls == ["open", ("finish", False)]
    assert not (tmp_path / "out" / "report.json").exists()


@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_request_stream_mode_reports_latency_and_occupancy(compose, tmp_path):
    """throughput.mode=stream on the CPU (eager): every variant serves the same stream; the table
    has tokens/s, TPOT and TTFT percentiles, occupancy, union and kept experts."""
    _, out = _run_here(compose, tmp_path, "stage=throughput", "throughput.mode=stream", "throughput.batch_sizes=[3]",
                       "throughput.methods=[dense,router_sum]", "throughput.budgets=[2]", "stream.prompt_len=[3,9]",
                       "stream.output_len=[3,7]", "stream.requests_per_slot=3", "scheduler.admission=union")
    rows = pd.read_csv(out / "stream.csv")
    assert rows["variant"].tolist() == ["dense", "router_sum"] and (rows["requests"] == 9).all()
    assert (rows["tokens_per_s"] > 0).all() and (rows["tpot_ms_p50"] <= rows["tpot_ms_p90"]).all()
    assert (rows["ttft_ms_p50"] <= rows["ttft_ms_p90"]).all() and (rows["occupancy_mean"] <= 3).all()
    dense, sel = rows.iloc[0], rows.iloc[1]
    assert dense["kept_mean"] == dense["union_mean"] and sel["kept_mean"] <= 2 < sel["union_mean"]
    assert dense["output_tokens"] == sel["output_tokens"]  # the same stream, EOS ignored


@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_a_stream_replays_a_tasks_own_lengths(compose, tmp_path):
    """An evaluate run records every request's prompt and new tokens; stream.lengths_from replays them."""
    _, ev = _run_here(compose, tmp_path, "method=dense", "batch_size=4")
    samples = pd.read_json(ev / "samples.jsonl", lines=True)
    assert (samples["prompt_tokens"] > 0).all() and (samples["new_tokens"] >= 1).all()
    _, out = _run_here(compose, tmp_path, "stage=throughput", "throughput.mode=stream", "throughput.batch_sizes=[2]",
                       "throughput.methods=[dense]", "stream.requests_per_slot=3",
                       f"stream.lengths_from={ev / 'samples.jsonl'}")
    row = pd.read_csv(out / "stream.csv").iloc[0]
    pairs = samples[samples["new_tokens"] >= 2]
    assert row["requests"] == 6 and row["output_tokens"] <= 6 * pairs["new_tokens"].max()


def test_a_run_whose_expert_ffn_wait_gave_up_fails_without_a_report(compose, tmp_path, monkeypatch):
    """A wait of the one-launch expert FFN that gave up (kernels/experts.py: its down items then read
    activations not yet written) fails the run at its end, naming the cause, and no report.json is
    written; a run during which none gave up finishes as usual."""
    import base.run.pipeline as pipeline

    counts = iter([5, 7])  # at the run's start, then at its end: two waits gave up during it
    monkeypatch.setattr(pipeline, "ffn_waits_given_up", lambda: next(counts))
    with pytest.raises(RuntimeError, match=r"2 wait\(s\) of the one-launch expert FFN .* no report was written"):
        _run_here(compose, tmp_path, "stage=describe")
    assert not list(tmp_path.rglob("report.json"))
    monkeypatch.setattr(pipeline, "ffn_waits_given_up", lambda: 7)  # none during the run
    report, _ = _run_here(compose, tmp_path, "stage=describe")
    assert report["stage"] == "describe"
