"""experiments/run_points.py: the points of a sweep are the product of its experiment's
hydra.sweeper.params, extra sweeps replace the grid's keys, and bad input fails with the choices."""
from __future__ import annotations

import pytest

from experiments import run_points as rp


def test_points_are_the_grid_product_then_each_extra_sweep():
    pts = rp.points("quality_seeds_mini", ["method=dense budget=null", "method=oea method.k0=1,2 budget=null"])
    grid = [p for p in pts if not any(x.startswith("method=dense") or x.startswith("method=oea") for x in p)]
    assert len(grid) == 8 * 4  # conf/experiment/quality_seeds_mini.yaml: 8 selectors x 4 budgets, one seed
    assert ["method=base", "budget=8", "eval.seed=0"] in grid
    # the extra sweeps keep the grid's other keys (eval.seed), as the Makefile's dense and oea lines do
    assert ["method=dense", "budget=null", "eval.seed=0"] in pts
    assert {tuple(p) for p in pts if "method=oea" in p} == {
        ("method=oea", "budget=null", "eval.seed=0", "method.k0=1"), ("method=oea", "budget=null", "eval.seed=0", "method.k0=2")}
    assert len({tuple(sorted(p)) for p in pts}) == len(pts)  # no point twice


def test_a_derived_experiment_sweeps_its_own_budgets():
    budgets = {x for p in rp.points("quality_seeds_mini_olmoe", []) for x in p if x.startswith("budget=")}
    assert budgets == {"budget=6", "budget=9", "budget=12"}


def test_expand_is_the_cartesian_product():
    assert rp.expand({"a": "1,2", "b": "x"}) == [["a=1", "b=x"], ["a=2", "b=x"]]


@pytest.mark.parametrize("argv, message", [
    (["no_such_experiment", "--dry-run"], "unknown experiment(s) ['no_such_experiment']; valid:"),
    (["quality_seeds_mini", "--jobs", "0", "--dry-run"], "--jobs=0: must be >= 1"),
    (["quality_seeds_mini", "--extra", "method", "--dry-run"], "each item must be key=value"),
])
def test_bad_input_fails_naming_the_choices(argv, message):
    with pytest.raises(SystemExit) as e:
        rp.main(argv)
    assert message in str(e.value)


def test_dry_run_prints_one_multirun_per_point(capsys):
    assert rp.main(["quality_seeds_mini_olmoe_continuous", "--set", "task.limit=2", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 8 * 3
    assert all(ln.startswith("python run.py -m experiment=quality_seeds_mini_olmoe_continuous ")
               and ln.endswith(" task.limit=2") for ln in lines)
