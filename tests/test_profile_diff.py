"""analysis/profile_diff.py on synthetic per-kernel tables: each kernel's change in ms a step, a
launch one side lacks, the class and step totals, the .md's rows, and the inputs it refuses."""
from __future__ import annotations

import pandas as pd
import pytest

from analysis import profile_diff


def table(path, kernels, batch=16, variant="base", model="qwen3_30b", engine="t1-cuda", more_cells=()):
    """kernels: (class, name, launches a step, µs a launch); 48 layers. more_cells: (batch, variant) or
    (batch, variant, routing, budget), uniform routing and budget 16 where not named."""
    cells = [(batch, variant, "uniform", 16), *((*c, "uniform", 16)[:4] for c in more_cells)]
    rows = [{"model": model, "routing": r, "batch_size": b, "variant": v, "budget": m, "class": c,
             "kernel": k, "ms_per_step": n * us / 1000, "kernels_per_step": n, "kernels_per_layer": n / 48,
             "us_per_launch": us, "engine": engine}
            for b, v, r, m in cells for c, k, n, us in kernels]
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_each_kernels_change_a_removed_and_an_added_launch_and_the_totals(tmp_path, capsys):
    a = table(tmp_path / "a.csv", [("attention", "attend", 48, 11.0), ("attention", "v_write", 48, 1.5),
                                   ("experts", "gate_up", 48, 37.0)])
    b = table(tmp_path / "b.csv", [("attention", "attend", 48, 14.0), ("attention", "rotary_new", 48, 3.5),
                                   ("experts", "gate_up", 48, 37.0)])
    profile_diff.main([str(a), str(b), "--out", str(tmp_path / "d"), "--rows", "2"])
    t = pd.read_csv(tmp_path / "d.csv")
    kernels = t[~t["kernel"].str.startswith("(")]
    assert list(kernels["kernel"]) == ["rotary_new", "attend", "v_write", "gate_up"]  # by |b - a|: 0.168, 0.144, 0.072, 0
    row = kernels.set_index("kernel")
    assert row.loc["attend", "b_minus_a_ms"] == pytest.approx(48 * 3.0 / 1000)
    assert row.loc["attend", "b_us_per_launch"] == pytest.approx(14.0)
    assert pd.isna(row.loc["v_write", "b_ms_per_step"]) and row.loc["v_write", "b_minus_a_ms"] == pytest.approx(-0.072)
    step = t[t["kernel"] == "(every kernel)"].iloc[0]
    assert step["a_kernels_per_layer"] == 3 and step["b_kernels_per_layer"] == 3
    assert step["b_minus_a_ms"] == pytest.approx(48 * (3.0 + 3.5 - 1.5) / 1000)
    attention = t[(t["class"] == "attention") & (t["kernel"] == "(class total)")].iloc[0]
    assert attention["b_minus_a_ms"] == pytest.approx(step["b_minus_a_ms"])
    assert (t["engine"] == "t1-cuda").all()
    md = (tmp_path / "d.md").read_text()
    assert "| attention | rotary_new | - | 1.00 |" in md and "v_write" not in md  # 2 rows shown, 2 in the .csv
    assert "2 more in the .csv" in md and "(every kernel)" in md


def test_bad_inputs_are_refused_naming_the_choices(tmp_path, capsys):
    k = [("attention", "attend", 48, 11.0)]
    two = table(tmp_path / "two.csv", k, more_cells=((16, "dense"),))
    one = table(tmp_path / "one.csv", k)
    for argv, message in (
            ([two, one], ("several cells match; it holds --model qwen3_30b --routing uniform --batch 16 --variant base "
                          "--budget 16, --model qwen3_30b --routing uniform --batch 16 --variant dense --budget 16")),
            ([one, one, "--batch", "64"], "no cells match"),
            ([one, table(tmp_path / "m.csv", k, model="olmoe")], "different models"),
            ([one, table(tmp_path / "e.csv", k, engine="t1-cpu")], "mix rows of 2 decode engines"),
            ([one, tmp_path / "missing.csv"], "no such per-kernel table"),
            ([one, one, "--rows", "0"], "--rows must be at least 1")):
        with pytest.raises(SystemExit) as e:
            profile_diff.main([str(x) for x in argv] + ["--out", str(tmp_path / "x")])
        assert e.value.code == 2 and message in capsys.readouterr().err, message
    assert not (tmp_path / "x.csv").exists()
    profile_diff.main([str(two), str(one), "--variant", "base", "--out", str(tmp_path / "ok")])  # named: fine


def test_two_routings_or_two_budgets_of_a_cell_are_never_summed(tmp_path, capsys):
    """A grid's table holds uniform and skewed runs (and several budgets) at the same batch and
    variant: each is its own cell, named with --routing and --budget, never added together."""
    k = [("attention", "attend", 48, 11.0)]
    mixed = table(tmp_path / "mixed.csv", k, more_cells=((16, "base", "skewed", 16), (16, "base", "uniform", 8)))
    one = table(tmp_path / "one.csv", [("attention", "attend", 48, 12.0)])
    with pytest.raises(SystemExit) as e:
        profile_diff.main([str(mixed), str(one), "--batch", "16", "--variant", "base", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--routing skewed" in err and "--budget 8" in err
    profile_diff.main([str(mixed), str(one), "--routing", "uniform", "--budget", "16", "--out", str(tmp_path / "d")])
    step = pd.read_csv(tmp_path / "d.csv").set_index("kernel").loc["(every kernel)"]
    assert step["a_kernels_per_layer"] == 1 and step["a_ms_per_step"] == pytest.approx(48 * 11.0 / 1000)
    assert "uniform routing, batch 16, base M=16" in (tmp_path / "d.md").read_text()
    with pytest.raises(SystemExit) as e:  # a cell one side lacks
        profile_diff.main([str(mixed), str(one), "--routing", "skewed", "--out", str(tmp_path / "y")])
    assert e.value.code == 2 and "no cells match" in capsys.readouterr().err


def test_a_shapes_table_of_several_models_gives_the_one_named(tmp_path, capsys):
    """A grid's shapes table holds several models at one (batch, variant): refused unless --model
    names one, then only its rows are compared."""
    shapes = tmp_path / "shapes.csv"
    pd.concat([pd.read_csv(table(tmp_path / f"{m}.csv", [("experts", "gate_up", 48, us)], model=m))
               for m, us in (("olmoe", 10.0), ("deepseek_v2_lite", 30.0))]).to_csv(shapes, index=False)
    other = table(tmp_path / "o2.csv", [("experts", "gate_up", 48, 12.0)], model="olmoe")
    with pytest.raises(SystemExit) as e:
        profile_diff.main([str(shapes), str(other), "--out", str(tmp_path / "x")])
    assert e.value.code == 2 and "--model deepseek_v2_lite" in capsys.readouterr().err
    profile_diff.main([str(shapes), str(other), "--model", "olmoe", "--out", str(tmp_path / "d")])
    step = pd.read_csv(tmp_path / "d.csv").set_index("kernel").loc["(every kernel)"]
    assert step["b_minus_a_ms"] == pytest.approx(48 * 2.0 / 1000)
    assert (tmp_path / "d.md").read_text().startswith("olmoe, uniform routing, batch 16, base M=16")
