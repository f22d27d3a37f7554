"""experiments/heldout/budgets.py: the pre-registered budgets from a dense run's union."""
from __future__ import annotations

import json

import pytest

from experiments.heldout.budgets import budgets, main


@pytest.mark.parametrize("union,expected", [(46.5, [12, 17, 23]), (8.0, [2, 3, 4]), (4.0, [2, 3, 4]),
                                            (12.0, [3, 4, 6])])
def test_budgets_are_the_shares_of_the_union_at_least_two_and_increasing(union, expected):
    assert budgets(union) == expected


def test_budgets_are_read_from_the_dense_run_only(tmp_path, capsys):
    (tmp_path / "report.json").write_text(json.dumps({"method": "dense", "summary": {"union_mean": 46.5}}))
    main(str(tmp_path))
    assert capsys.readouterr().out.strip() == "12,17,23"
    (tmp_path / "report.json").write_text(json.dumps({"method": "base", "summary": {"union_mean": 46.5}}))
    with pytest.raises(SystemExit, match="budgets come from the dense run"):
        main(str(tmp_path))
    with pytest.raises(SystemExit, match="does not exist"):
        main(str(tmp_path / "nope"))
