"""analysis/load.py reads results/ whatever tables it holds: an empty one (a one-model family's
interaction tests, written with no rows) is skipped, not a traceback of `make report`."""
from __future__ import annotations

import pandas as pd

from analysis.load import load_results


def test_an_empty_table_is_skipped_and_the_others_are_read(tmp_path):
    (tmp_path / "replication_x_interaction.csv").write_text("\n")
    pd.DataFrame({"model": ["mini"], "layer": [0], "r2": [0.9]}).to_csv(tmp_path / "quality_mini_predictor_r2.csv",
                                                                         index=False)
    res = load_results(tmp_path)
    assert res.root == tmp_path
    assert res.predictor["r2"].tolist() == [0.9]  # the other table was read
