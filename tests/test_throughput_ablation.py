"""analysis/throughput_ablation.py: an ablation pairs every run without the feature with every run with it."""
from __future__ import annotations

import json

import pandas as pd

from analysis.throughput_ablation import main, ratios, run_rows


def _run(folder, regions, ms, kernels):
    folder.mkdir(parents=True)
    rows = [{"batch_size": 16, "variant": v, "mode": "graph", "regions": regions, "ms_per_step": m,
             "ms_min": m * 0.99, "ms_max": m * 1.01, "repeats": 5} for v, m in ms.items()]
    rows.append({"batch_size": 16, "variant": "dense", "mode": "eager", "regions": regions, "ms_per_step": 99.0,
                 "ms_min": None, "ms_max": None, "repeats": None})
    pd.DataFrame(rows).to_csv(folder / "throughput.csv", index=False)
    profile = [{"variant": v, "class": c, "kernels_per_layer": k} for v in ms for c, k in
               (("expert FFN", 4.0), ("total", kernels))]
    (folder / "report.json").write_text(json.dumps({"profile": profile}))


def test_each_modules_run_pairs_with_each_layer_run(tmp_path):
    _run(tmp_path / "a", "modules", {"dense": 12.0, "base": 6.0}, 17.5)
    _run(tmp_path / "b", "layer", {"dense": 10.0, "base": 5.0}, 15.5)
    _run(tmp_path / "c", "layer", {"dense": 12.0, "base": 4.0}, 15.5)
    df = run_rows(tmp_path)
    assert len(df) == 6 and set(df.setting) == {"modules", "layer"}  # eager rows left out
    assert set(df.kernels_per_layer) == {17.5, 15.5}  # the profile's total, not the sum of classes
    r = ratios(df).set_index("variant")
    assert r.loc["base", "ratio_min"] == 6.0 / 5.0 and r.loc["base", "ratio_max"] == 6.0 / 4.0
    assert r.loc["dense", "ratio_min"] == 1.0 and r.loc["dense", "layer_ms"] == 11.0
    main(str(tmp_path), str(tmp_path / "out" / "summary"))
    assert (tmp_path / "out" / "summary.md").read_text().count("| modules") == 2


def test_the_pdl_ablation_reads_each_rows_flag(tmp_path):
    for name, flag, ms in (("a", False, 6.0), ("b", True, 5.0), ("c", True, 4.0)):
        folder = tmp_path / name
        folder.mkdir()
        pd.DataFrame([{"batch_size": 16, "variant": "base", "mode": "graph", "pdl": flag, "ms_per_step": ms,
                       "ms_min": ms, "ms_max": ms, "repeats": 5}]).to_csv(folder / "throughput.csv", index=False)
        (folder / "report.json").write_text(json.dumps({"profile": []}))
    r = ratios(run_rows(tmp_path, "pdl"), "pdl").iloc[0]
    assert (r["runs"], r["False_ms"], r["True_ms"]) == ("1 + 2", 6.0, 4.5)
    assert (r["ratio_min"], r["ratio_max"]) == (6.0 / 5.0, 6.0 / 4.0)


def test_the_combo_ablation_pairs_layer_with_layer_combo_and_bad_names_are_refused(tmp_path):
    import pytest

    _run(tmp_path / "a", "layer", {"base": 5.0}, 15.5)
    _run(tmp_path / "b", "layer_combo", {"base": 4.0}, 13.5)
    _run(tmp_path / "c", "modules", {"base": 9.0}, 17.5)
    r = ratios(run_rows(tmp_path, "combo"), "combo").iloc[0]
    assert (r["runs"], r["ratio"], r["layer_combo_kernels_per_layer"]) == ("1 + 1", 5.0 / 4.0, 13.5)
    with pytest.raises(SystemExit, match="choose one of: regions, combo, pdl"):
        main(str(tmp_path), str(tmp_path / "out"), "fusion")


def test_a_form_inside_one_run_pairs_with_its_plain_variant_round_by_round(tmp_path):
    """analysis/throughput_forms.py: `base+fused` against `base` of the same run, pass by pass (the
    labels of the H100 A/B's run, whose forms were deleted after it: the analysis reads recorded runs)."""
    import pytest

    from analysis.throughput_forms import compare

    rows = [{"batch_size": 16, "variant": v, "budget": b, "mode": "graph", "ms_runs": runs}
            for v, b, runs in (("dense", None, "10;11;12"), ("dense+fused", None, "9;10;13"),
                               ("base", 16, "5;5;5"), ("base+fused", 16, "4;4.5;5.5"), ("oea(k0=1)", None, "6;6;6"))]
    rows.append({"batch_size": 16, "variant": "dense", "budget": None, "mode": "eager", "ms_runs": "99"})
    pd.DataFrame(rows).to_csv(tmp_path / "throughput.csv", index=False)
    profile = [{"variant": v, "class": "total", "kernels_per_layer": k} for v, k in (("base", 14.5), ("base+fused", 12.5))]
    (tmp_path / "report.json").write_text(json.dumps({"profile": profile}))
    med, ratio = compare(tmp_path / "throughput.csv")
    r = ratio.set_index("variant")
    assert r.loc["dense", "over_plain"] == pytest.approx(10 / 11)  # rounds: 0.9, 10/11, 13/12
    assert (r.loc["dense", "over_plain_min"], r.loc["dense", "over_plain_max"]) == pytest.approx((0.9, 13 / 12))
    assert r.loc["base", "over_plain"] == pytest.approx(0.9)
    assert "oea(k0=1)" not in set(med["variant"])  # no form beside it
    m = med.set_index(["variant", "impl"])
    assert m.loc[("base", "fused"), "kernels_per_layer"] == 12.5 and m.loc[("base", "plain"), "ms"] == 5


def test_forms_analysis_refuses_a_run_without_forms(tmp_path):
    import pytest

    from analysis.throughput_forms import compare

    pd.DataFrame([{"batch_size": 16, "variant": "dense", "budget": None, "mode": "graph", "ms_runs": "1;2"}]).to_csv(
        tmp_path / "throughput.csv", index=False)
    with pytest.raises(SystemExit, match="no variant with a form beside its plain variant"):
        compare(tmp_path / "throughput.csv")


def test_the_step_budget_adds_each_removed_kernel_and_its_gap(tmp_path):
    """analysis/step_budget.py on a made-up profile: the gap per kernel is (graph - kernel time) /
    kernels; the cuts count each kernel they remove once with its gap; a kernel no cut names (the
    final norm) is not a cut."""
    import pytest

    from analysis.step_budget import budget

    key = {"model": "m", "routing": "uniform", "batch_size": 16, "variant": "base"}
    pd.DataFrame([{**key, "class": "total", "ms_per_step": 9.0, "kernels_per_step": 1000.0,
                   "graph_ms_per_step": 10.0}]).to_csv(tmp_path / "summary_profile.csv", index=False)
    kernels = [("expert FFN", "_reduce_kernel", 0.2, 48), ("expert FFN", "_gate_up_kernel", 2.0, 48),
               ("expert FFN", "_down_kernel", 1.0, 48), ("router/selection", "_route_select_kernel", 0.7, 48),
               ("norms", "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", 0.5, 1)]
    pd.DataFrame([{**key, "class": c, "kernel": n, "ms_per_step": ms, "kernels_per_step": n_k}
                  for c, n, ms, n_k in kernels]).to_csv(tmp_path / "summary_kernels.csv", index=False)
    rows = dict(budget(tmp_path, "base", 16, tbps=1.0, layers=1, experts=1, H=1000, I=1000, target_ms=0.2))
    assert rows["between kernels, per kernel"] == pytest.approx(1e-3)
    assert rows["the cuts' kernels"] == pytest.approx(0.2)
    assert rows["the cuts, with their gaps"] == pytest.approx(0.2 + 48e-3)
    floor = 3 * 1000 * 1000 * 2 / 1e12 * 1e3
    assert rows["their floor at 1.0 TB/s"] == pytest.approx(floor)
    assert rows["the step with all three"] == pytest.approx(10.0 - 0.248 - (3.0 - floor) - (0.7 - 0.2))


def test_a_run_without_the_ablations_column_is_refused_not_taken_for_one_side(tmp_path, capsys):
    """A run made after throughput.regions was deleted records no `regions`: it ran layer_combo,
    and must not be read as the `layer` side (what a missing column once meant)."""
    import pytest

    _run(tmp_path / "a", "modules", {"base": 6.0}, 17.5)
    (tmp_path / "b").mkdir()
    pd.DataFrame([{"batch_size": 16, "variant": "base", "mode": "graph", "compiled": True, "ms_per_step": 5.0,
                   "ms_min": 4.9, "ms_max": 5.1, "repeats": 5}]).to_csv(tmp_path / "b" / "throughput.csv", index=False)
    (tmp_path / "b" / "report.json").write_text(json.dumps({"profile": []}))
    with pytest.raises(SystemExit, match="records no throughput.regions"):
        run_rows(tmp_path, "regions")
