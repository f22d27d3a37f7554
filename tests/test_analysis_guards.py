"""Issue 43: analysis never mixes what differs. Each test is a defect a reviewer reproduced, on a
small run tree written here: a killed run's partial serve.csv, an experiment of two models, two
prompt pools or two engines, a duplicate dense run, missing sample lines, an unknown experiment,
reports of an older schema, and truncated report.json / samples.jsonl files."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from analysis.load import load

EMPTY_RESULTS = "no-results"  # a folder that does not exist: no committed tables


def _run(d, report: dict, samples: list[dict] | None = None, exp: str | None = None, config: dict | None = None) -> None:
    import yaml

    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"exp_name": exp or d.parent.name, "batch_size": 16, **(config or {})}))
    if samples is not None:
        (d / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (d / "report.json").write_text(json.dumps(report))  # last, as the pipeline does


def _samples(correct: int, n: int = 10) -> list[dict]:
    return [{"task": "t", "doc_id": i, "prompt_hash": f"h{i}", "correct": float(i < correct)} for i in range(n)]


def _evaluate(root, name, model="mini", method="base", budget=4, seed=0, correct=8, pool="mini",
              engine="c3-packed-cpu", exp="two", config=None):
    """One finished evaluate run of `model` in outputs/<exp>/<name>."""
    report = {"stage": "evaluate", "model": model, "method": method, "budget": None if method == "dense" else budget,
              "batch_size": 16, "seed": 0, "device": "cpu", "num_experts": 8,
              "method_config": {"name": method, "reassign": "backfill"},
              "eval": {"batch_seed": seed, "tasks": [pool], "limit": None, "batching": "continuous"},
              "summary": {"accuracy": correct / 10, "kept_mean": 8.0 if method == "dense" else budget - 0.5,
                          "union_mean": 7.0, "weight_retained": 0.9},
              "provenance": {"fingerprint": engine}}
    _run(root / exp / name, report, _samples(correct), exp, config)


def _throughput(root, name, rows, model="mini", exp="two"):
    _run(root / exp / name, {"stage": "throughput", "model": model, "device": "cpu", "routing": "uniform",
                             "throughput": rows}, exp=exp)


def _timing(method, budget, tok_s):
    return {"batch_size": 16, "method": method, "budget": budget, "variant": method, "mode": "eager",
            "tokens_per_s": tok_s}


# ---- 1: a killed rerun's partial serve.csv ------------------------------------------------------
def _stream(variant, repeat, tok_s):
    return {"model": "m", "routing": "uniform", "slots": 4, "variant": variant, "method": variant,
            "budget": None if variant == "dense" else 16, "rate": None, "repeat": repeat, "position": repeat,
            "output_throughput": tok_s, "tpot_ms_p50": 10.0, "goodput": 1.0, "slo_ttft_ms": 500.0,
            "slo_tpot_ms": 25.0}


def _serve_run(d, rows, report=True, device="cuda:0"):
    d.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(d / "serve.csv", index=False)
    if report:
        (d / "report.json").write_text(json.dumps({"stage": "throughput", "model": "m", "device": device}))


def test_a_killed_reruns_partial_serve_csv_is_skipped_and_named(tmp_path, capsys):
    from analysis import serving

    _serve_run(tmp_path / "uniform", [_stream(v, r, tok) for r in (0, 1) for v, tok in (("dense", 100), ("base", 150))])
    _serve_run(tmp_path / ".uniform.partial-99", [_stream(v, r, 999) for r in (0, 1, 2) for v in ("dense", "base")],
               report=False)
    df = serving.load(tmp_path)
    assert len(df) == 4 and (df["output_throughput"] < 999).all()
    t = serving.summary(df).set_index("variant")
    assert t.loc["base", "repeats"] == 2 and t.loc["base", "tok_s"] == 150
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and ".uniform.partial-99" in err and "no report.json" in err


def test_two_runs_serving_one_cell_or_two_engines_are_refused(tmp_path, capsys):
    from analysis import serving

    _serve_run(tmp_path / "twice" / "a", [_stream(v, 0, 100) for v in ("dense", "base")])
    _serve_run(tmp_path / "twice" / "b", [_stream(v, 0, 120) for v in ("dense", "base")])  # a rerun beside it
    with pytest.raises(SystemExit) as e:
        serving.load(tmp_path / "twice")
    assert e.value.code == 2 and "more than one run folder" in capsys.readouterr().err
    _serve_run(tmp_path / "engines" / "gpu", [_stream(v, 0, 100) for v in ("dense", "base")])
    _serve_run(tmp_path / "engines" / "cpu", [_stream(v, 1, 10) for v in ("dense", "base")], device="cpu")
    with pytest.raises(SystemExit) as e:
        serving.load(tmp_path / "engines")
    assert e.value.code == 2 and "2 decode engines" in capsys.readouterr().err


# ---- 2: analysis.compare keys rows by model, tasks and engine -----------------------------------
def test_compare_separates_models_tasks_and_engines(tmp_path):
    from analysis.compare import compare

    for model, correct in (("mini", 8), ("mini_olmoe", 6)):
        _evaluate(tmp_path, f"{model}-base", model=model, correct=correct)
        _evaluate(tmp_path, f"{model}-dense", model=model, method="dense", correct=10)
    _evaluate(tmp_path, "mini-base-other-pool", pool="mini128", correct=5)
    _evaluate(tmp_path, "mini-base-static", engine="s1-engine-cpu", correct=7)
    _throughput(tmp_path, "tp-mini", [_timing("base", 4, 300.0), _timing("dense", None, 200.0)])
    _throughput(tmp_path, "tp-olmoe", [_timing("base", 4, 30.0), _timing("dense", None, 20.0)], model="mini_olmoe")
    t = compare(str(tmp_path / "two"))
    assert {"model", "tasks", "engine"} <= set(t.columns) and len(t) == 6
    base = t[t["variant"] == "base"].set_index(["model", "tasks", "engine"])
    assert base.loc[("mini", "mini", "c3-packed-cpu"), "tokens_per_s"] == 300.0
    assert base.loc[("mini_olmoe", "mini", "c3-packed-cpu"), "tokens_per_s"] == 30.0  # its own model's timing
    assert base.loc[("mini", "mini128", "c3-packed-cpu"), "accuracy"] == 0.5  # another pool: its own row
    assert base.loc[("mini", "mini", "s1-engine-cpu"), "accuracy"] == 0.7  # another engine: its own row


def _cfg(method="base", budget=4, ridge=1.0, max_gen=16, seed=0, **extra):
    """The config.yaml keys a run's setting is read from (load.settings)."""
    return {"method": {"name": method, "renormalize": "model"}, "budget": budget, "predictor": {"ridge": ridge},
            "eval": {"seed": seed, "max_gen_tokens": max_gen}, "throughput": {"batch_sizes": [1, budget]}, **extra}


def test_runs_of_one_key_in_two_configurations_are_two_rows_and_a_rerun_is_one(tmp_path, capsys):
    """A sweep point run again with another predictor.ridge is its own row, named by what differs
    (not the first folder's accuracy shown for both); a default changed in conf/ between two runs
    likewise; a rerun of one configuration, dense at budgets it ignores, and throughput.* (not read
    by an evaluation) are one measurement."""
    from analysis.compare import compare

    _evaluate(tmp_path, "base", config=_cfg(), correct=10)
    _evaluate(tmp_path, "base-rerun", config=_cfg(), correct=10)
    _evaluate(tmp_path, "base-ridge", config=_cfg(ridge=1000), correct=8)
    _evaluate(tmp_path, "base-conf-edit", config=_cfg(max_gen=32), correct=7)
    _evaluate(tmp_path, "base-b8", budget=8, config=_cfg(budget=8), correct=9)
    for b in (4, 8):
        _evaluate(tmp_path, f"dense-b{b}", method="dense", config=_cfg("dense", b))
    t = compare(str(tmp_path / "two"))
    got = {f"{v}@{b}:{s}": a for v, b, s, a in zip(t["variant"], t["budget"], t["setting"], t["accuracy"])}
    assert got == {"dense@<NA>:": 0.8, "base@4:": 1.0, "base@8:": 0.9,
                   "base@4:eval.max_gen_tokens=32": 0.7, "base@4:predictor.ridge=1000": 0.8}
    err = capsys.readouterr().err
    assert "base-rerun is the same measurement as base" in err and "dense-b8 is the same measurement as dense-b4" in err
    assert "base-ridge" not in err and "base-conf-edit" not in err


def test_another_configuration_of_a_point_is_an_experiment_of_its_own_and_the_quality_table_refuses_it(
        tmp_path, capsys):
    """The sweep's own configuration keeps the experiment (dense and every other point with it); the
    points run again with predictor.ridge=1000 are `<exp>[predictor.ridge=1000]`, pooled over
    their seeds; an option on every budgeted run and not on dense splits nothing."""
    from analysis import tables as T
    from analysis.quality import quality_table

    for seed in (0, 1):
        _evaluate(tmp_path, f"base-{seed}", seed=seed, config=_cfg(seed=seed))
        _evaluate(tmp_path, f"base-ridge-{seed}", seed=seed, correct=6, config=_cfg(ridge=1000, seed=seed))
        _evaluate(tmp_path, f"base-b8-{seed}", budget=8, seed=seed, correct=9, config=_cfg(budget=8, seed=seed))
        _evaluate(tmp_path, f"dense-{seed}", method="dense", seed=seed, correct=10, config=_cfg("dense", seed=seed))
    pts = T.quality_points(load(tmp_path, None))
    acc = pts[pts["metric"] == "accuracy"].set_index(["exp", "variant", "budget"])
    assert acc.loc[("two", "base", 4), "n"] == 2 and acc.loc[("two", "base", 4), "mean"] == 0.8
    assert acc.loc[("two", "dense", pd.NA), "mean"] == 1.0 and acc.loc[("two", "base", 8), "mean"] == 0.9
    assert acc.loc[("two[predictor.ridge=1000]", "base", 4), "n"] == 2
    assert acc.loc[("two[predictor.ridge=1000]", "base", 4), "mean"] == 0.6
    assert set(T.sweep_of(pts["exp"])) == {"two"}
    with pytest.raises(SystemExit) as e:
        quality_table(str(tmp_path / "two"))
    assert e.value.code == 2 and "2 configurations of one point" in capsys.readouterr().err

    other = tmp_path / "other"  # ridge on every budgeted run, dense run without it: one configuration each
    for name, method, b in (("base-4", "base", 4), ("base-8", "base", 8), ("dense", "dense", 4)):
        _evaluate(other, name, method=method, budget=b, config=_cfg(method, b, ridge=1000 if method == "base" else 1.0))
    assert set(T.quality_points(load(other, None))["exp"]) == {"two"}


def test_the_quality_table_refuses_a_folder_of_two_models(tmp_path, capsys):
    from analysis.quality import quality_table

    _evaluate(tmp_path, "mini-base")
    _evaluate(tmp_path, "olmoe-base", model="mini_olmoe")
    with pytest.raises(SystemExit) as e:
        quality_table(str(tmp_path / "two"))
    assert e.value.code == 2 and "2 models (mini, mini_olmoe)" in capsys.readouterr().err


# ---- 3: make report on a two-model experiment with a duplicate dense run ------------------------
def test_report_handles_each_model_of_an_experiment_and_counts_a_duplicate_once(tmp_path, capsys):
    from analysis import tables as T
    from analysis.report import main

    outputs = tmp_path / "outputs"
    for model, correct in (("mini", 8), ("mini_olmoe", 6)):
        for seed in (0, 1):
            _evaluate(outputs, f"{model}-base-{seed}", model=model, seed=seed, correct=correct)
        _evaluate(outputs, f"{model}-dense-b4", model=model, method="dense", correct=10)
    _evaluate(outputs, "mini-dense-b6", method="dense", correct=9)  # dense swept over a budget it ignores
    pts = T.quality_points(load(outputs, None))
    acc = pts[pts["metric"] == "accuracy"].set_index(["exp", "variant"])
    assert set(acc.index.get_level_values("exp")) == {"two[mini]", "two[mini_olmoe]"}
    assert acc.loc[("two[mini]", "dense"), "n"] == 1 and acc.loc[("two[mini]", "dense"), "mean"] == 1.0
    assert acc.loc[("two[mini_olmoe]", "base"), "n"] == 2 and acc.loc[("two[mini_olmoe]", "base"), "mean"] == 0.6
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and "mini-dense-b6 is the same measurement as two/mini-dense-b4" in err

    out = tmp_path / "report"
    main(["--outputs", str(outputs), "--results", str(tmp_path / EMPTY_RESULTS), "--out", str(out), "--exp", "two"])
    text = (out / "report.md").read_text()
    assert "Model mini;" in text and "Model mini_olmoe;" in text
    assert (out / "fig2_accuracy_kept_two[mini].png").exists() and (out / "fig2_accuracy_kept_two[mini_olmoe].png").exists()


def test_an_experiment_of_two_engines_is_refused(tmp_path, capsys):
    from analysis import tables as T

    _evaluate(tmp_path, "base-0")
    _evaluate(tmp_path, "base-1", seed=1, engine="c2-packed-cpu")
    with pytest.raises(SystemExit) as e:
        T.quality_points(load(tmp_path, None))
    assert e.value.code == 2 and capsys.readouterr().err.startswith("error: experiment two would mix")


def test_an_experiment_of_both_batchings_is_two_experiments(tmp_path):
    from analysis import tables as T

    _evaluate(tmp_path, "base-0")
    _evaluate(tmp_path, "base-1", seed=1, engine="s1-generate-cpu")  # eval.batching=static beside continuous
    pts = T.quality_points(load(tmp_path, None))
    assert set(pts["exp"]) == {"two[c3-packed-cpu]", "two[s1-generate-cpu]"}


# ---- 4: analysis.paired says what it could not pair ---------------------------------------------
def test_paired_warns_with_the_counts_it_could_not_pair(capsys):
    from analysis.paired import paired

    a, b = pd.DataFrame(_samples(12, n=16)), pd.DataFrame(_samples(8, n=10))
    res = paired(a, b)
    assert res["n"] == 10 and (res["unpaired_a"], res["unpaired_b"]) == (6, 0)
    err = capsys.readouterr().err
    assert err.startswith("warning: paired n=10: 6 of A's 16 requests and 0 of B's 10")
    paired(a, a)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("case, message", [
    ("two models", "evaluates mini and"),
    ("two engines", "decoded through engine c3-packed-cpu and"),
    ("unfinished", "is not a finished run (no report.json"),
    ("missing", "no such run folder"),
    ("throughput", "is a stage=throughput run"),
])
def test_paired_refuses_two_runs_that_differ_in_more_than_the_rule(tmp_path, case, message, capsys):
    from analysis.paired import check_pair

    out = tmp_path / "outputs"
    _evaluate(out, "a")
    b = out / "two" / "b"
    if case == "two models":
        _evaluate(out, "b", model="mini128", method="dense")
    elif case == "two engines":
        _evaluate(out, "b", engine="s1-generate-cpu", method="dense")
    elif case == "unfinished":
        _evaluate(out, "b", method="dense")
        (b / "report.json").unlink()
    elif case == "throughput":
        _throughput(out, "b", [])
    with pytest.raises(SystemExit) as e:
        check_pair(out / "two" / "a", b)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_paired_takes_two_finished_runs_of_one_model_and_engine(tmp_path):
    from analysis.paired import check_pair

    _evaluate(tmp_path, "a")
    _evaluate(tmp_path, "b", method="dense")
    check_pair(tmp_path / "two" / "a", tmp_path / "two" / "b")  # no exit


# ---- 5: make report EXP=<nonexistent> -----------------------------------------------------------
def test_report_of_an_unknown_experiment_is_an_error(tmp_path, capsys):
    from analysis.report import main

    _evaluate(tmp_path / "outputs", "base-0")
    with pytest.raises(SystemExit) as e:
        main(["--outputs", str(tmp_path / "outputs"), "--results", str(tmp_path / EMPTY_RESULTS),
              "--out", str(tmp_path / "report"), "--exp", "nosuch"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: no experiment nosuch") and "known: two" in err
    assert not (tmp_path / "report").exists()


def test_a_report_of_named_sweeps_reads_only_their_runs(tmp_path, capsys):
    """--exp good: another experiment of three engines (which the report refuses as a whole) neither
    stops it nor joins it; asked for itself, it is refused."""
    from analysis.report import main

    out = tmp_path / "outputs"
    _evaluate(out, "a", exp="good")
    _evaluate(out, "b", exp="good", method="dense")
    for name, engine, method in [("x", "s1-generate-cpu", "base"), ("y", "c3-packed-cpu", "dense"),
                                 ("z", "c2-packed-cpu", "router_sq")]:
        _evaluate(out, name, exp="bad", engine=engine, method=method)
    common = ["--outputs", str(out), "--results", str(tmp_path / EMPTY_RESULTS)]
    main([*common, "--out", str(tmp_path / "good"), "--exp", "good"])
    text = (tmp_path / "good" / "report.md").read_text()
    assert "good" in text and "bad" not in text
    with pytest.raises(SystemExit) as e:
        main([*common, "--out", str(tmp_path / "bad"), "--exp", "bad"])
    assert e.value.code == 2 and "experiment bad would mix rows of 3 decode engines" in capsys.readouterr().err


# ---- 6: reports of an older schema --------------------------------------------------------------
def _old_tree(root):
    """Runs recorded before method_config, eval, batch_size, fidelity metrics, prompt hashes and
    throughput modes; one without a summary."""
    for method, budget in (("base", 4), ("router_sum", 4), ("dense", None)):
        _run(root / "old" / f"method={method}", {"stage": "evaluate", "model": "mini", "method": method,
                                                 "budget": budget, "summary": {"accuracy": 0.7, "kept_mean": 4.0}},
             [{"task": "t", "doc_id": i, "correct": 1.0} for i in range(4)])
    _run(root / "old" / "no-summary", {"stage": "evaluate", "model": "mini", "method": "base", "budget": 6})
    _run(root / "old" / "tp", {"stage": "throughput", "model": "mini",
                               "throughput": [{"method": "base", "budget": 4, "batch_size": 16, "tokens_per_s": 9.0}]})
    return root


def test_older_reports_never_raise_and_a_skipped_figure_says_why(tmp_path, capsys):
    from analysis.compare import compare
    from analysis.report import main

    outputs = _old_tree(tmp_path / "outputs")
    t = compare(str(outputs / "old"))
    assert len(t) == 4 and t.loc[(t["variant"] == "base") & (t["budget"] == 4), "tokens_per_s"].item() == 9.0
    assert (t["batch_size"] == 16).all()  # an older report's batch size from its config.yaml
    out = tmp_path / "report"
    main(["--outputs", str(outputs), "--results", str(tmp_path / EMPTY_RESULTS), "--out", str(out)])
    text = (out / "report.md").read_text()
    fig4 = text[text.index("## Figure 4: Selection rules at equal budget: old"):]
    assert fig4.split("\n## ")[0].count("No figure: old has no budgeted runs with fidelity metrics") == 1
    captured = capsys.readouterr()
    assert "fig4_rules_old: no data (old has no budgeted runs with fidelity metrics" in captured.out
    assert "warning: no paired calls for old" in captured.err and "lack prompt_hash" in captured.err
    assert "warning: figures 1 and 3 leave out the throughput rows of old/tp" in captured.err


# ---- 7: truncated report.json and samples.jsonl -------------------------------------------------
def test_a_truncated_report_is_an_error_naming_it(tmp_path, capsys):
    from analysis.compare import compare
    from analysis.report import main as report_main

    _evaluate(tmp_path / "outputs", "base-0")
    _evaluate(tmp_path / "outputs", "base-1", seed=1)
    bad = tmp_path / "outputs" / "two" / "base-1" / "report.json"
    bad.write_text(bad.read_text()[:40])
    for run in (lambda: compare(str(tmp_path / "outputs" / "two")),
                lambda: report_main(["--outputs", str(tmp_path / "outputs"), "--results", str(tmp_path / EMPTY_RESULTS),
                                     "--out", str(tmp_path / "report")])):
        with pytest.raises(SystemExit) as e:
            run()
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith(f"error: {bad} is not valid JSON") and err.count("\n") == 1


def test_a_truncated_samples_file_is_an_error_naming_it(tmp_path, capsys):
    from analysis.paired import load_samples

    _evaluate(tmp_path, "base-0")
    path = tmp_path / "two" / "base-0" / "samples.jsonl"
    path.write_text(path.read_text()[:-30])
    with pytest.raises(SystemExit) as e:
        load_samples(path.parent)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: {path} line 10 is not valid JSON") and err.count("\n") == 1
    with pytest.raises(SystemExit):  # every reader of samples goes through the same check
        _ = load(tmp_path, None).outputs.samples


# ---- an analysis command line without its arguments -----------------------------------------------
@pytest.mark.parametrize("module, argv, message", [
    ("analysis.serving", [], "expected 2 arguments, got 0; usage: python -m analysis.serving "),
    ("analysis.stream", ["only-one"], "expected 2 arguments, got 1; usage: python -m analysis.stream "),
    ("analysis.stream_order", [], "usage: python -m analysis.stream_order "),
    ("analysis.throughput_ablation", ["a"], "expected 2 to 3 arguments, got 1"),
    ("analysis.compare_runs", ["a", "b"], "expected 3 arguments, got 2"),
    ("analysis.quality_diff", [], "expected 2 to 3 arguments, got 0"),
    ("analysis.quality_diff", ["RESULTS_DIR", "dest"], "not a file; the source is a quality table (.csv)"),
])
def test_an_analysis_command_line_without_its_arguments_names_its_usage(tmp_path, monkeypatch, capsys, module, argv,
                                                                        message):
    import runpy
    import sys

    argv = [str(tmp_path) if a == "RESULTS_DIR" else a for a in argv]
    monkeypatch.setattr(sys, "argv", [module, *argv])
    with pytest.raises(SystemExit) as e:
        runpy.run_module(module, run_name="__main__")
    assert e.value.code == 2 and message in capsys.readouterr().err


# ---- records: one run per cell ------------------------------------------------------------------
def test_records_keep_one_decode_once_and_refuse_two_measurements_of_a_cell(tmp_path, capsys):
    """A dense sweep point copied from another (reused_from) is one decode: its rows once. A rerun's
    kept-aside `~<hash>` folder (another config) beside the run is a second measurement of the
    cell: refused, naming both, nothing written."""
    from analysis.records import read, write

    grid = tmp_path / "g"
    _evaluate(tmp_path, "budget=2,method=base", exp="g", budget=2)
    _evaluate(tmp_path, "budget=2,method=dense", exp="g", method="dense")
    _evaluate(tmp_path, "budget=4,method=dense", exp="g", method="dense")
    copy = json.loads((grid / "budget=4,method=dense" / "report.json").read_text())
    (grid / "budget=4,method=dense" / "report.json").write_text(json.dumps({**copy, "reused_from": "budget=2,method=dense"}))
    write(grid, tmp_path / "rec" / "g")
    prompts, _ = read(tmp_path / "rec" / "g")
    assert len(prompts) == 2 * 10 and sorted(prompts["method"].unique()) == ["base", "dense"]
    _evaluate(tmp_path, "budget=2,method=base~3f2a", exp="g", budget=2)
    with pytest.raises(SystemExit) as e:
        write(grid, tmp_path / "rec2" / "g")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "budget=2,method=base, budget=2,method=base~3f2a" in err
    assert not (tmp_path / "rec2").exists()
