"""analysis/records.py: a grid's per-prompt records file, written from a synthetic outputs/ folder,
re-derives the calls of the grid's committed paired table (issue 27), by the analysis's own path
and by hand from the file's columns."""
from __future__ import annotations

import numpy as np
import pandas as pd
from pathlib import Path

import pytest

from analysis import records as R
from analysis import stats as S
from analysis.ablation import main as ablation_main
from tests.outputs_fixture import fidelity_run


def _grid(root, n: int = 240, seed: int = 0):
    """base, router_sum (loses prompts, higher KL, less energy), oracle (gains a few) at M=6, and dense."""
    rng = np.random.default_rng(seed)
    base = (rng.random(n) < 0.85).astype(int)
    worse, better = base.copy(), base.copy()
    worse[np.flatnonzero(base)[:30]] = 0
    better[np.flatnonzero(base == 0)[:3]] = 1
    kl = rng.gamma(2.0, 0.05, n)
    batches = n // 4
    fidelity_run(root, "base", 6, 0, base, kl, 0.95 + rng.normal(0, 0.005, batches), [0.05] * batches)
    fidelity_run(root, "router_sum", 6, 0, worse, kl + 0.2, 0.80 + rng.normal(0, 0.005, batches),
                 0.09 + rng.normal(0, 0.002, batches))
    fidelity_run(root, "oracle", 6, 0, better, kl * 0.9, 0.96 + rng.normal(0, 0.005, batches),
                 0.04 + rng.normal(0, 0.002, batches))
    fidelity_run(root, "dense", None, 0, base, [0.0] * n, [1.0] * batches, [0.0] * batches)
    return root


@pytest.fixture(scope="module")
def committed_grid(tmp_path_factory):
    """A grid's outputs/ folder, the tables `python -m analysis.ablation` commits, and its records."""
    tmp = tmp_path_factory.mktemp("records")
    outputs, results = _grid(tmp / "outputs" / "grid"), tmp / "results"
    ablation_main(str(outputs), str(results / "grid"))
    R.write(outputs, results / "records" / "grid")
    return results


def test_records_re_derive_the_committed_calls(committed_grid):
    results = committed_grid
    committed = pd.read_csv(results / "grid_paired.csv")
    dest = results / "records" / "grid"
    assert R.check(dest, results / "grid_paired.csv") == []

    # a sample of the calls again, by hand from the file's columns (no analysis code path)
    prompts, _ = R.read(dest)
    wide = prompts.pivot_table(index=["task", "doc_id"], columns="method", values="correct")
    acc = committed[committed["metric"] == "accuracy"].set_index("method")
    for rule in ("router_sum", "oracle"):
        a_only = int(((wide[rule] == 1) & (wide["base"] == 0)).sum())
        b_only = int(((wide[rule] == 0) & (wide["base"] == 1)).sum())
        assert (acc.loc[rule, "a_only"], acc.loc[rule, "b_only"]) == (a_only, b_only)
        assert acc.loc[rule, "p"] == pytest.approx(S.mcnemar_exact(a_only, b_only), rel=1e-12)
    assert acc.loc["router_sum", "call"] == "lower"
    sums = prompts.groupby("method")[["kl_sum", "fidelity_tokens"]].sum()
    kl = committed[committed["metric"] == "kl"].set_index("method")
    ratio = sums["kl_sum"] / sums["fidelity_tokens"]
    assert kl.loc["router_sum", "diff"] == pytest.approx(ratio["router_sum"] - ratio["base"], rel=1e-12)
    assert kl.loc["router_sum", "call"] == "higher"


@pytest.mark.slow
def test_a_call_the_records_do_not_give_is_reported(committed_grid):
    results = committed_grid
    committed = pd.read_csv(results / "grid_paired.csv")
    row = committed.index[(committed["method"] == "router_sum") & (committed["metric"] == "accuracy")][0]
    committed.loc[row, "call"] = "higher"
    committed.loc[row, "p"] = 0.5
    committed.to_csv(results / "tampered.csv", index=False)
    failures = R.check(results / "records" / "grid", results / "tampered.csv")
    assert len(failures) == 2 and all("router_sum" in f for f in failures)
    assert R.main(["check", str(results / "records" / "grid"), str(results / "tampered.csv")]) == 1


def test_records_files_are_byte_reproducible_and_hold_the_format(tmp_path):
    outputs = _grid(tmp_path / "grid", n=40)
    a, b = R.write(outputs, tmp_path / "a" / "grid"), R.write(outputs, tmp_path / "b" / "grid.csv.gz")
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    prompts, batches = R.read(tmp_path / "a" / "grid")
    assert list(prompts.columns) == [*R.POOL, *R.RUN, *R.PROMPT, *R.PROMPT_FIELDS]
    assert list(batches.columns) == [*R.RUN, "decode_batch", "layer", *R.BATCH_FIELDS]
    assert len(prompts) == 4 * 40 and prompts["budget"].isna().sum() == 40  # dense: no budget
    assert len(batches) == 4 * 10 * 2  # 4 runs x 10 decode batches x 2 layers
    first = prompts.iloc[:4]  # sorted by prompt, then run: one prompt's four runs first
    assert first["doc_id"].nunique() == 1 and first["method"].nunique() == 4


def _refused(capsys, call, message: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        call()
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_a_folder_of_two_prompt_pools_or_engines_is_refused(tmp_path, capsys):
    fidelity_run(tmp_path / "a", "base", 6, 0, [1, 1], [0.1, 0.1], [0.9], [0.1], limit=2)
    fidelity_run(tmp_path / "a", "router_sum", 6, 0, [1, 1], [0.1, 0.1], [0.9], [0.1], limit=5)
    _refused(capsys, lambda: R.write(tmp_path / "a", tmp_path / "records" / "x"), "2 prompt pools, models or engines")
    fidelity_run(tmp_path / "b", "base", 6, 0, [1, 1], [0.1, 0.1], [0.9], [0.1], engine="c3-packed-cpu")
    fidelity_run(tmp_path / "b", "router_sum", 6, 0, [1, 1], [0.1, 0.1], [0.9], [0.1], engine="c1-padded-cpu")
    _refused(capsys, lambda: R.write(tmp_path / "b", tmp_path / "records" / "x"), "c3-packed-cpu; mini mini 25 c1-padded-cpu")
    with pytest.raises(SystemExit, match="is missing"):
        R.read(tmp_path / "records" / "none")


def test_records_of_another_grid_prompt_pool_or_engine_are_not_overwritten_without_force(tmp_path, capsys):
    """The issue's reproduction: `write <grid folder> results/records/<another grid>` replaced that
    grid's records. Now: refused (exit 2, nothing written) for another grid name, prompt pool or
    engine; --force replaces; the same grid again is written."""
    grid = tmp_path / "outputs" / "g1"
    fidelity_run(grid, "base", 6, 0, [1, 0, 1, 1], [0.1] * 4, [0.9], [0.1])
    dest = tmp_path / "records" / "g1"
    R.write(grid, dest)
    before = R.paths(dest)[0].read_bytes()
    other = tmp_path / "outputs" / "g2"
    fidelity_run(other, "base", 6, 0, [1, 1, 1, 1], [0.1] * 4, [0.9], [0.1])
    _refused(capsys, lambda: R.write(other, dest), "is grid 'g1'")
    repool = tmp_path / "elsewhere" / "g1"
    fidelity_run(repool, "base", 6, 0, [1, 1, 1, 1], [0.1] * 4, [0.9], [0.1], limit=9)
    _refused(capsys, lambda: R.write(repool, dest), "limit 25")
    reengine = tmp_path / "again" / "g1"
    fidelity_run(reengine, "base", 6, 0, [1, 0, 1, 1], [0.1] * 4, [0.9], [0.1], engine="c3-packed-cpu")
    _refused(capsys, lambda: R.write(reengine, dest), "engine s1-generate-cpu")
    assert R.paths(dest)[0].read_bytes() == before
    R.write(grid, dest)  # the same grid again
    R.write(reengine, dest, force=True)
    assert R.read(dest)[0]["engine"].unique().tolist() == ["c3-packed-cpu"]


def test_records_written_before_engines_take_their_grids_engine():
    prompts, _ = R.read(Path(__file__).parents[1] / "results" / "records" / "ablation_mini")
    assert prompts["engine"].unique().tolist() == ["s1-generate-cpu"]


def test_same_says_whether_a_folders_runs_give_the_records_outputs(tmp_path, capsys):
    """A re-run on another engine is shown identical prompt by prompt, or its differences named."""
    grid = tmp_path / "old" / "g"
    fidelity_run(grid, "base", 6, 0, [1, 0, 1, 1], [0.1] * 4, [0.9], [0.1])
    R.write(grid, tmp_path / "records" / "g")
    again = tmp_path / "new" / "g"
    fidelity_run(again, "base", 6, 0, [1, 0, 1, 1], [0.1] * 4, [0.9], [0.1], engine="s1-generate-cpu")
    assert R.same(again, tmp_path / "records" / "g") == []
    assert "identical on all 4 prompts" in capsys.readouterr().out
    moved = tmp_path / "moved" / "g"
    fidelity_run(moved, "base", 6, 0, [1, 1, 1, 1], [0.1] * 4, [0.9], [0.1])
    assert R.same(moved, tmp_path / "records" / "g") == ["method=base, budget=6, seed=0, batching=static, "
                                                          "admission=fifo: correct differs on 1 of 4 prompts"]
    other = tmp_path / "other" / "g"
    fidelity_run(other, "router_sum", 6, 0, [1, 1, 1, 1], [0.1] * 4, [0.9], [0.1])
    assert R.same(other, tmp_path / "records" / "g")[0].endswith("not in " + str(tmp_path / "records" / "g"))
