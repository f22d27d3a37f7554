"""analysis/load.py, tables.py, figures.py and report.py on a small outputs/ tree (tests/outputs_fixture.py)
and a small results/ tree: the tidy loader's keys, intervals over seeds, the join to throughput, the
Pareto front, and that missing data gives a figure that says so instead of an error."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import figures as F
from analysis import tables as T
from analysis.load import AXES, load, load_results, model_of
from tests.outputs_fixture import ACC, PROMPTS, SEEDS, make_outputs


@pytest.fixture
def outputs(tmp_path):
    return make_outputs(tmp_path / "outputs")


@pytest.fixture
def no_rendering(monkeypatch):
    """report.write names the files it would render (empty PNG and SVG): the page's content without
    the ~1 s per figure of rendering (test_make_report_all_... renders every figure)."""
    import analysis.report

    def touch(fig, directory, name):
        directory.mkdir(parents=True, exist_ok=True)
        paths = [directory / f"{name}.png", directory / f"{name}.svg"]
        for path in paths:
            path.touch()
        return paths

    monkeypatch.setattr(analysis.report, "save", touch)


def _results(root, exp="ablation_mini", seeds=5):
    """A committed results/ tree: one per-seed aggregate, its paired table, a predictor and routing stats."""
    root.mkdir(parents=True, exist_ok=True)
    rows = [{"method": m, "budget": b, "metric": metric, "mean": v, "low": v - 0.01, "high": v + 0.01, "seeds": seeds}
            for m, b, acc in (("base", 6, 0.94), ("router_sum", 6, 0.87), ("dense", None, 1.0))
            for metric, v in (("accuracy", acc), ("kept_mean", b or 11.5), ("energy_retained", acc), ("kl", 1 - acc))]
    pd.DataFrame(rows).to_csv(root / f"{exp}.csv", index=False)
    pd.DataFrame([{"method": "router_sum", "budget": 6, "metric": "accuracy", "diff": -0.07, "low": -0.1,
                   "high": -0.04, "call": "lower", "unit": "prompts (200)"}]).to_csv(root / f"{exp}_paired.csv",
                                                                                      index=False)
    pd.DataFrame({"layer": [0, 1], "r2": [0.9, 0.85], "r2_within": [0.8, 0.7]}).to_csv(
        root / "quality_mini_olmoe_predictor_r2.csv", index=False)
    (root / "routing").mkdir(exist_ok=True)
    (root / "routing" / "routing_stats.csv").write_text(
        "# python -m experiments.routing_stats ...\nmodel,layer,experts,union_1,union_16\n"
        "mini,0,32,4.0,11.0\nmini,mean,32,4.0,12.0\n")
    return root


# ---- the loader ---------------------------------------------------------------------------------
def test_loader_keys_every_frame_by_the_config_axes(outputs):
    data = load(outputs, None)
    runs = data.outputs.runs
    ev = runs[runs["stage"] == "evaluate"]
    assert len(ev) == len(ACC) * len(SEEDS) + 1 and set(AXES) <= set(runs.columns)
    assert set(ev["variant"]) == {"base", "router_sum", "base+drop", "dense", "base@cov0.9"}
    assert set(ev["exp"]) == {"qs_fixture"} and set(ev["seed"]) == set(SEEDS) and set(ev["hardware"]) == {"cpu"}
    assert ev.loc[ev["variant"] == "dense", "budget"].isna().all()  # no budget stays missing, not 0 or NaN-float
    samples = data.outputs.samples
    assert len(samples) == len(ev) * PROMPTS and set(AXES) <= set(samples.columns)
    one = samples[(samples["variant"] == "router_sum") & (samples["budget"] == 4) & (samples["seed"] == 2)]
    assert one["correct"].sum() == ACC[("router_sum", 4)]  # each record carries its own run's axes
    steps = data.outputs.steps
    assert {"layer", "step", "kept", "variant", "seed"} <= set(steps.columns) and len(steps) == len(ev) * 2 * 5
    tp = data.outputs.throughput
    assert set(tp["hardware"]) == {"Fake GPU"} and set(tp["batch_size"]) == {1, 16} and (tp["model"] == "mini").all()
    assert data.outputs.predictor["r2"].tolist() == [0.9, 0.8]


def test_loader_of_nothing_gives_empty_frames_with_the_axes(tmp_path):
    data = load(tmp_path / "absent", None)
    assert len(data.outputs) == 0 and set(AXES) <= set(data.outputs.runs.columns)
    assert data.outputs.samples.empty and data.outputs.throughput.empty and data.results.points.empty


def test_results_loader_reads_the_committed_tables(tmp_path):
    res = load_results(_results(tmp_path / "results"))
    assert set(res.points["exp"]) == {"ablation_mini"} and set(res.points["model"]) == {"mini"}
    assert set(res.points["batch_size"]) == {16}  # from conf/experiment/ablation_mini.yaml
    assert res.paired["variant"].tolist() == ["router_sum"] and res.paired["call"].tolist() == ["lower"]
    assert set(res.predictor["model"]) == {"mini_olmoe"}
    assert res.routing["union_16"].tolist() == [12.0]  # the per-model mean row, past the comment line
    assert model_of("quality_seeds_mini_olmoe") == "mini_olmoe" and model_of("rules_mini") == "mini"


# ---- the tables ---------------------------------------------------------------------------------
def test_points_are_means_over_seeds_with_their_interval(outputs):
    pts = T.quality_points(load(outputs, None))
    acc = pts[pts["metric"] == "accuracy"].set_index(["variant", "budget"])
    base4 = acc.loc[("base", 4)]
    assert base4["mean"] == pytest.approx(0.8) and base4["n"] == 3
    kl = pts[(pts["metric"] == "kl") & (pts["variant"] == "base") & (pts["budget"] == 4)].iloc[0]
    assert kl["mean"] == pytest.approx(0.06) and kl["low"] < 0.06 < kl["high"]  # kl differs by seed
    cov = acc[acc.index.get_level_values("variant") == "base@cov0.9"].iloc[0]
    assert cov["n"] == 1 and np.isnan(cov["low"])  # one run: no interval


def test_an_experiment_in_both_sources_comes_from_the_fuller_one(tmp_path, outputs):
    res = _results(tmp_path / "results", exp="qs_fixture", seeds=5)
    pts = T.quality_points(load(outputs, res))
    assert set(pts.loc[pts["exp"] == "qs_fixture", "source"]) == {"outputs"}  # 22 runs against 15
    res = _results(tmp_path / "results", exp="qs_fixture", seeds=10)
    pts = T.quality_points(load(outputs, res))
    assert set(pts.loc[pts["exp"] == "qs_fixture", "source"]) == {"results"}  # 30 runs against 22


def test_pareto_front_keeps_points_nothing_beats_on_both_axes():
    x = np.array([1.0, 2.0, 1.5, 2.0, np.nan])
    y = np.array([0.9, 0.8, 0.7, 0.8, 0.95])
    assert T.pareto(x, y).tolist() == [True, True, False, True, False]  # equal points both stay


def test_tradeoff_joins_quality_and_speed_by_model_variant_and_budget(outputs):
    data = load(outputs, None)
    pts = T.quality_points(data)
    tr = T.tradeoff(pts, T.throughput_rows(data), batch_size=16)
    joined = tr[tr["has_quality"] & tr["has_speed"]].set_index(["variant", "budget"])
    assert len(joined) == 5  # base, router_sum at 4 and 6, and dense (no budget on either side)
    assert joined.loc[("router_sum", 4), "speedup"] == 1.9
    assert joined.loc[("router_sum", 4), "accuracy"] == pytest.approx(0.6)
    only_quality = tr[tr["has_quality"] & ~tr["has_speed"]]["variant"]
    assert set(only_quality) == {"base+drop", "base@cov0.9"}  # never timed: quality axis only
    plot = F.tradeoff_figure(tr)
    assert plot.empty is None and "(a) mini: qs_fixture" in plot.caption and "Fake GPU" in plot.caption


def test_tradeoff_figure_is_two_measurements_sharing_the_kept_fraction(outputs):
    data = load(outputs, None)
    tr = T.tradeoff(T.quality_points(data), T.throughput_rows(data), 16, T.pool_sizes(data))
    assert (tr["experts"] == 8).all()  # mini's expert count, from its reports
    base4 = tr[(tr["variant"] == "base") & (tr["budget"] == 4)].iloc[0]
    assert base4["kept_frac"] == pytest.approx(3.8 / 8) and base4["kept_frac_timed"] == pytest.approx(4 / 8)
    plot = F.tradeoff_figure(tr)
    top, bottom = plot.fig.axes[:2]
    assert top.get_shared_x_axes().joined(top, bottom)
    assert bottom.get_xlabel() == "experts kept per layer (fraction of the pool)"
    assert "accuracy" in top.get_ylabel() and "speed-up" in bottom.get_ylabel()
    assert "Two measurements on different models" in plot.caption


def test_a_side_without_data_says_so_in_its_panel(outputs):
    data = load(outputs, None)
    pts = T.quality_points(data)

    def texts(plot):
        return " ".join(t.get_text() for ax in plot.fig.axes for t in ax.texts)

    quality_only = F.tradeoff_figure(T.tradeoff(pts, T.throughput_rows(data).iloc[0:0], experts={"mini": 8}))
    assert quality_only.empty is None and "no throughput results" in texts(quality_only)
    speed_only = F.tradeoff_figure(T.tradeoff(pts.iloc[0:0], T.throughput_rows(data)))
    assert speed_only.empty is None and "no quality results" in texts(speed_only)


def test_paired_accuracy_uses_the_corrected_calls():
    def rows(variant, correct):
        return [{"exp": "e", "variant": variant, "budget": 6, "seed": s, "task": "t", "doc_id": i,
                 "prompt_hash": f"h{i}", "correct": float(c)} for s in (0, 1) for i, c in enumerate(correct)]

    n = 1000
    base = np.r_[np.ones(n - 22), np.zeros(22)]
    drop = base.copy()
    drop[:100] = 0  # 100 prompts worse
    mixed = np.ones(n)
    mixed[:30] = 0  # 30 prompts worse, the 22 base gets wrong right
    samples = pd.DataFrame(rows("base", base) + rows("base+drop", drop) + rows("base+similar", base)
                           + rows("router_sum", mixed))
    out = T.paired_accuracy(samples, ["base+drop", "base+similar", "router_sum"]).set_index("variant")
    assert set(T.PAIRED) <= set(out.columns) | {"variant"}
    assert out.loc["base+drop", "diff"] == pytest.approx(-0.1) and out.loc["base+drop", "call"] == "lower"
    assert out.loc["base+similar", "call"] == "inconclusive"  # no discordant prompt of 1000: no accuracy tie
    assert out.loc["router_sum", "call"] == "inconclusive"  # 30 worse, 22 better: neither a difference nor a tie
    assert (out["p_holm"] >= out["p"]).all() and out.loc["base+drop", "n"] == n


def _grid(calls: dict[str, str], other: dict | None = None, budget=6, exp="g"):
    """Corrected paired rows of one grid: accuracy calls per rule, plus (rule, metric) -> call."""
    rows = [{"exp": exp, "variant": v, "budget": budget, "metric": "accuracy", "diff": d, "call": c, "p": 0.01,
             "p_holm": 0.02, "test": "exact McNemar; Tango score interval"}
            for (v, c), d in zip(calls.items(), np.linspace(0.01, 0.05, len(calls)))]
    rows += [{"exp": exp, "variant": v, "budget": budget, "metric": m, "diff": -0.01, "call": c, "p": 0.01,
              "p_holm": 0.02, "test": "cluster bootstrap over prompts"} for (v, m), c in (other or {}).items()]
    return pd.DataFrame(rows)


def _acc_points(values: dict[str, float], budget=6, exp="g"):
    return pd.DataFrame([{"exp": exp, "model": "mini", "variant": v, "budget": budget, "metric": "accuracy",
                          "mean": a} for v, a in values.items()])


def test_recommendations_pick_the_most_accurate_rule_above_base():
    paired = _grid({"a": "higher", "b": "higher", "c": "tie", "d": "lower", "e": "inconclusive"},
                   {("b", "kl"): "lower", ("b", "out_error"): "higher"})
    rec = T.recommendations(paired, _acc_points({"base": 0.80, "a": 0.85, "b": 0.90, "c": 0.80, "d": 0.7,
                                                 "e": 0.81})).iloc[0]
    assert rec["recommend"] == "b" and rec["accuracy"] == 0.90 and rec["also_higher"] == "a"
    assert rec["lower"] == "d" and rec["inconclusive"] == "e"
    assert rec["also_better_on"] == "b: kl"  # lower KL is better; a higher output error is not
    assert rec["correction"] == "Holm over 7 calls" and "McNemar" in rec["test"] and rec["model"] == "mini"


def test_a_pick_that_fails_the_cross_grid_correction_is_marked_exploratory():
    paired = _grid({"a": "higher", "b": "inconclusive"}).assign(scope=["exploratory", ""])
    rec = T.recommendations(paired, _acc_points({"base": 0.80, "a": 0.85, "b": 0.81})).iloc[0]
    assert rec["recommend"] == "a" and rec["why"] == "higher than base (exploratory)"
    confirmed = T.recommendations(paired.assign(scope=["confirmed", ""]), _acc_points({"base": 0.8, "a": 0.85}))
    assert confirmed["why"].iloc[0] == "higher than base"


def test_recommendations_without_a_better_rule_are_base_and_its_ties_only():
    paired = _grid({"a": "tie", "b": "inconclusive", "c": "lower", "d": "tie"})
    rec = T.recommendations(paired, _acc_points({"base": 0.8})).iloc[0]
    assert rec["recommend"] == "base, a, d" and rec["accuracy"] == 0.8
    assert rec["inconclusive"] == "b" and "b" not in rec["recommend"].split(", ") and rec["lower"] == "c"


def test_old_paired_files_never_make_a_tie_an_equivalence():
    old = pd.DataFrame([{"exp": "g", "variant": v, "budget": 6, "metric": "accuracy", "diff": d, "low": d - 0.02,
                         "high": d + 0.02, "call": c, "unit": "prompts (200)"}
                        for v, d, c in (("a", 0.0, "tie"), ("b", -0.1, "lower"))])
    rec = T.recommendations(old, _acc_points({"base": 0.8})).iloc[0]
    assert rec["recommend"] == "base" and rec["inconclusive"] == "a" and rec["lower"] == "b"
    assert rec["test"] == T.OLD_TEST and rec["correction"].startswith("no correction")


def test_the_three_oea_colours_stand_apart():
    from analysis.style import COLORS

    rgb = {k: np.array([int(v[i:i + 2], 16) for i in (1, 3, 5)]) for k, v in COLORS.items()}
    for k in ("oea(k0=1)", "oea(k0=2)", "oea(k0=3)"):
        assert min(np.linalg.norm(rgb[k] - c) for o, c in rgb.items() if o != k) > 60


def test_union_table_reads_throughput_dense_rows_and_routing_stats(tmp_path, outputs):
    data = load(outputs, _results(tmp_path / "results"))
    u = T.union_by_batch(data, T.throughput_rows(data)).set_index(["model", "routing", "batch_size"])
    assert u.loc[("mini", "uniform", 16), "union"] == 7.0 and u.loc[("mini", "uniform", 16), "pool_share"] == 7 / 8
    assert u.loc[("mini", "trained", 16), "union"] == 12.0


# ---- figures and the report ---------------------------------------------------------------------
def test_every_figure_says_what_it_lacks_instead_of_failing(tmp_path):
    from analysis.report import build, write

    plots = build(load(None, None))
    assert plots and all(p.empty for p, _ in plots)
    path = write(plots, tmp_path / "report", "# Report\n")
    text = path.read_text()
    assert text.count("No figure:") == len(plots) and "no quality or throughput results" in text
    assert not list((tmp_path / "report").glob("*.png"))


def test_figures_with_some_data_missing_still_draw(outputs):
    data = load(outputs, None)
    w = T.wide(T.quality_points(data))
    assert F.rules_figure(w[w["variant"] == "dense"], "x").empty  # no budgeted run
    assert F.reassign_figure(w[w["variant"] != "base+drop"], "x", pd.DataFrame()).empty  # one mode only
    assert F.heatmap_figure(T.adaptive_kept(data).iloc[0:0], "x").empty
    assert F.r2_figure(T.predictor_r2(data)).empty is None
    assert F.kept_figure(w, "qs_fixture").empty is None


@pytest.mark.slow  # every figure from outputs/ and results/ (~10 s); the results-only report below stays fast
def test_make_report_all_writes_figures_and_a_markdown_that_embeds_them(tmp_path, outputs):
    from analysis.report import main

    out = tmp_path / "report"
    results = _results(tmp_path / "results")
    main(["--outputs", str(outputs), "--results", str(results), "--out", str(out), "--all"])
    text = (out / "report.md").read_text()
    committed, yours = text.split("\n# Your runs\n")
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert {"fig1_tradeoff.png", "fig3_union_batch.png", "fig4_rules_ablation_mini.png",
            "fig6a_predictor_r2.png"} <= set(pngs)  # the committed grid's, from results/ alone
    # yours: under their own names, or `_yours` where a committed figure has the name
    assert {"fig1_tradeoff_yours.png", "fig2_accuracy_kept_qs_fixture.png", "fig3_union_batch_yours.png",
            "fig5_reassign_qs_fixture.png", "fig6a_predictor_r2_yours.png", "fig6b_kept_heatmap_qs_fixture.png",
            "fig8_speedup_batch.png"} <= set(pngs)
    for png in pngs:
        assert f"]({png})" in text and (out / png.replace(".png", ".svg")).exists()
        assert (f"]({png})" in yours) == ("qs_fixture" in png or "_yours" in png or png.startswith("fig8"))
    assert "lower" in committed  # the committed paired call of ablation_mini is in its table
    assert "qs_fixture" not in committed and "Fake GPU" not in committed  # nothing of outputs/ up there
    assert "Fake GPU" in yours and "cpu" in yours  # captions name the hardware


@pytest.mark.slow  # the fast tier keeps one representative of this file's slow group
def test_report_recommends_and_shows_old_and_new_paired_files(tmp_path):
    from analysis.report import main

    results = _results(tmp_path / "results")  # ablation_mini: an old-format paired file
    _results(results, exp="rules_mini")
    new = pd.DataFrame([{"method": "router_sum", "budget": 6, "metric": m, "unit": "prompts (200)", "diff": -0.07,
                         "low": -0.1, "high": -0.04, "p": 1e-4, "p_tost": 0.9, "margin": 0.01, "se": 0.01, "n": 200,
                         "test": "exact McNemar; Tango score interval", "a_only": 2, "b_only": 16, "p_holm": 2e-4,
                         "p_tost_holm": 0.9, "call": "lower", "mdd": 0.03} for m in ("accuracy", "kl")])
    new.to_csv(results / "rules_mini_paired.csv", index=False)
    out = tmp_path / "report"
    main(["--results", str(results), "--out", str(out), "--results-only", "--all"])
    text = (out / "report.md").read_text()
    recs = text[text.index("## Recommendations"):text.index("## Figure 1")]
    assert "TOST" in recs and "Holm over 2 calls" in recs and T.OLD_TEST in recs
    assert "(no paired comparisons" not in recs and "router_sum" in recs
    assert "calls as committed (" + T.OLD_TEST in text  # the old file's table says what its calls are
    assert "calls Holm-corrected over the grid's 2 comparisons" in text and "lower, p 0.0002" in text


def test_a_redrawn_figure_is_byte_identical(tmp_path, outputs):
    """A refresh whose data did not change leaves the committed files (and git) unchanged."""
    from analysis.style import save

    data = load(outputs, None)
    for d in ("a", "b"):
        save(F.r2_figure(T.predictor_r2(data)).fig, tmp_path / d, "r2")
    for ext in ("png", "svg"):
        assert (tmp_path / "a" / f"r2.{ext}").read_bytes() == (tmp_path / "b" / f"r2.{ext}").read_bytes()


def test_results_only_report_ignores_outputs(tmp_path, outputs, no_rendering):
    from analysis.report import main

    out = tmp_path / "figs"
    main(["--outputs", str(outputs), "--results", str(_results(tmp_path / "results")), "--out", str(out),
          "--results-only"])
    text = (out / "report.md").read_text()
    assert "qs_fixture" not in text and "ablation_mini" in text and "make report REFRESH=1" in text
    assert "# Your runs" not in text


# ---- the one-page summary, and your runs apart from the committed grids (issue 44) ---------------
def test_make_report_on_the_committed_results_is_one_page(tmp_path, no_rendering):
    """`make report`'s default on the committed results/: at most 8 figures, report.md at most 150
    lines, every figure embedded once with its caption."""
    from analysis.load import ROOT
    from analysis.report import SUMMARY_MAX, main

    out = tmp_path / "summary"
    main(["--results-only", "--results", str(ROOT / "results"), "--out", str(out)])
    text = (out / "report.md").read_text()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert 0 < len(pngs) <= SUMMARY_MAX == 8
    assert len(text.splitlines()) <= 150
    for png in pngs:
        assert text.count(f"]({png})") == 1 and (out / png.replace(".png", ".svg")).exists()
    assert "make report-all" in text and "# Your runs" not in text


@pytest.mark.slow
def test_your_runs_are_shown_only_in_their_own_section(tmp_path, no_rendering):
    """A user's smoke sweep (exp_name `default`) under outputs/ is never listed or drawn among the
    committed grids: it has its own section, figures and calls, and the page stays at 8 figures."""
    from analysis.report import main

    outputs = make_outputs(tmp_path / "outputs", exp="default")
    out = tmp_path / "report"
    main(["--outputs", str(outputs), "--results", str(_results(tmp_path / "results")), "--out", str(out)])
    text = (out / "report.md").read_text()
    committed, yours = text.split("\n# Your runs\n")
    assert "default" not in committed and "Fake GPU" not in committed and "tp_fixture" not in committed
    assert "ablation_mini" in committed and "ablation_mini" not in yours
    assert "| default" in yours and "fig2_accuracy_kept_default.png" in yours  # its grid, figure and calls
    assert "inconclusive" in yours and "Model mini; batch 16; hardware cpu" in yours
    pngs = {p.name for p in out.glob("*.png")}
    assert len(pngs) <= 8
    for png in pngs:  # each figure in one section: yours are drawn from outputs/ alone
        assert (f"]({png})" in yours) != (f"]({png})" in committed)
    assert "](fig1_tradeoff.png)" in committed and "](fig1_tradeoff_yours.png)" in yours


def test_union_legend_fits_and_names_the_control_apart_from_mini(tmp_path):
    """Figure 3: the legend lies inside the figure and over no axes; mini and the top-4 control are
    two labelled series, the control drawn hollow beneath mini; the caption says what the control is."""
    res = tmp_path / "results"
    _results(res)
    (res / "routing" / "olmoe_top4_control").mkdir()
    (res / "routing" / "olmoe_top4_control" / "routing_stats.csv").write_text(
        "model,layer,experts,union_1,union_16\nmini_olmoe_control,mean,32,4.0,12.1\n")
    data = load(None, res)
    plot = F.union_figure(T.union_by_batch(data, T.throughput_rows(data)))
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = plot.fig
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)  # lays the figure out as saving does
    (legend,) = fig.legends
    box, whole = legend.get_window_extent(renderer), fig.bbox
    assert whole.x0 <= box.x0 and box.x1 <= whole.x1 and whole.y0 <= box.y0 and box.y1 <= whole.y1
    assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)
    labels = [t.get_text() for t in legend.get_texts()]
    assert "mini (trained)" in labels and "mini_olmoe_control (trained; a control)" in labels
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    assert lines["mini (trained)"].get_zorder() > lines["mini_olmoe_control (trained; a control)"].get_zorder()
    assert lines["mini_olmoe_control (trained; a control)"].get_markerfacecolor() == "white"
    assert "control model, not shipped" in plot.caption and "top-4" in plot.caption


def test_the_accuracy_kept_caption_names_only_what_is_drawn(outputs):
    """Figure 2: no dense run, no rule without a budget: the caption mentions neither a dense line
    nor squares; with them, it does."""
    w = T.wide(T.quality_points(load(outputs, None)))
    bare = F.kept_figure(w[w["variant"].isin(["base", "router_sum"])], "qs_fixture")
    assert "dense" not in bare.caption.replace("no dense run", "") and "square" not in bare.caption
    assert "no dense run" in bare.caption and "2 selector(s)" in bare.caption
    assert len(bare.fig.axes[0].collections) == 2  # the two bands the caption names (seed ranges)
    full = F.kept_figure(w, "qs_fixture")
    assert "black line: dense" in full.caption and "squares: rules without a budget (base@cov0.9)" in full.caption


# ---- wandb charts of a run ----------------------------------------------------------------------
def test_run_logger_turns_selection_and_throughput_rows_into_charts():
    from base.run.logger import PLOTS

    sel = [{"layer": li, "union_mean": 7.0 + li, "kept_mean": 4.0, "executed_mean": 4.0, "weight_retained": 0.8,
            "energy_retained": None} for li in range(3)]
    charts = PLOTS["selection"](sel)
    assert set(charts) == {"selection/experts", "selection/retained"}
    data = charts["selection/experts"].table.data  # (layer, series, value) rows
    assert len(data) == 9 and [r[2] for r in data if r[1] == "union_mean"] == [7.0, 8.0, 9.0]
    assert {r[1] for r in charts["selection/retained"].table.data} == {"weight_retained"}  # empty series left out

    def row(mode, variant, budget, batch, tps):
        return {"mode": mode, "variant": variant, "budget": budget, "batch_size": batch, "tokens_per_s": tps,
                "speedup_vs_dense": tps / 100}

    rows = [row("graph", "dense", None, 1, 100), row("graph", "base", 8, 1, 120), row("graph", "base", 8, 16, 900),
            row("eager", "dense", None, 1, 5)]
    tps = PLOTS["throughput"](rows)["throughput/tokens_per_s"].table.data
    assert sorted((r[1], r[0], r[2]) for r in tps) == [("base@8", 1, 120), ("base@8", 16, 900), ("dense", 1, 100)]


@pytest.mark.slow
def test_report_logs_its_figures_to_one_wandb_run(tmp_path, outputs, monkeypatch, capsys):
    """`make report LOG=wandb`: the figures and tables go to one run (offline: nothing leaves), and the
    command ends with the folder it wrote and the `wandb sync` line that uploads it."""
    import wandb

    from analysis.report import log_wandb, write

    logged = []
    monkeypatch.setenv("WANDB_MODE", "offline")
    orig_init = wandb.init

    def init(**kw):
        run = orig_init(**kw)
        monkeypatch.setattr(run, "log", lambda d, *a, **k: logged.append(d))
        return run

    monkeypatch.setattr(wandb, "init", init)
    data = load(outputs, None)
    plots = [(F.r2_figure(T.predictor_r2(data)), ""), (F.union_figure(pd.DataFrame()), "")]  # drawn, empty
    write(plots, tmp_path / "r", "# r\n")
    log_wandb(plots, tmp_path / "r", "report-test", wandb_dir=tmp_path / "wandb")
    assert [sorted(d) for d in logged] == [["report/fig6a_predictor_r2", "report/fig6a_predictor_r2_table"]]
    assert isinstance(logged[0]["report/fig6a_predictor_r2"], wandb.Image)
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[wandb]")]
    assert len(line) == 1 and "logged offline" in line[0]
    folder = line[0].split("wandb sync ")[1].rstrip("`")
    assert Path(folder).is_dir() and Path(folder).resolve().is_relative_to((tmp_path / "wandb").resolve())


def test_a_run_logger_logs_the_selection_table_and_its_charts(tmp_path, monkeypatch):
    from base.config import LoggerConfig
    from base.run.logger import Logger, run_identity

    log = Logger(LoggerConfig(name="wandb", mode="disabled", dir=str(tmp_path)), run_identity("e", "m", "base", 2, "evaluate"), {})
    logged = []
    monkeypatch.setattr(log.run, "log", lambda d, *a, **k: logged.append(d))
    log.table("selection", [{"layer": 0, "union_mean": 7.0, "kept_mean": 4.0, "weight_retained": 0.8}])
    log.table("metrics", [{"task": "t", "value": 1.0}])  # a table without charts
    log.finish()
    assert [sorted(d) for d in logged] == [["selection"], ["selection/experts", "selection/retained"], ["metrics"]]


def test_runs_of_different_prompt_pools_are_never_averaged_as_seeds(capsys):
    """The pooling bug: task=mini_smoke and task=mini task.limit=2 in one sweep folder were averaged
    as two seeds of one point; now the figure tables refuse, naming the pools."""
    runs = pd.DataFrame([{"exp": "sweep", "model": "mini", "variant": "base", "budget": 6, "batch_size": 16,
                          "pool": pool, "accuracy": acc} for pool, acc in (("mini_smoke", 1.0), ("mini@2", 0.75))])
    with pytest.raises(SystemExit) as e:
        T.aggregate(runs)
    assert e.value.code == 2 and "sweep: mini@2, mini_smoke" in capsys.readouterr().err
    same = T.aggregate(runs.assign(pool="mini@2")).set_index("metric").loc["accuracy"]
    assert (same["mean"], same["low"], same["high"], same["n"]) == (0.875, 0.75, 1.0, 2)  # range, inside [0, 1]
