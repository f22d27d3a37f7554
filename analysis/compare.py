"""Print one comparison table for an experiment folder: accuracy, union, kept experts, tokens/s.

    python -m analysis.compare outputs/demo

One row per evaluate run, keyed by model, tasks (the prompt pool), engine, variant, budget, batch
size and batching seed (and admission where the runs differ in it, and `setting`, what else the
runs were given that differs between them, e.g. predictor.ridge=1000), so runs of two models, two
pools, two engines or two settings are separate rows; a run repeating another's key is shown once,
with a warning. tokens/s is the throughput runs' timing of the same model, routing, variant, budget and
batch size (CUDA-graph rows where a configuration was also timed eagerly): a static batch at the
throughput run's lengths, on its engine and device (`timed_engine`, `timed_on`), not the
evaluation's own speed; a CPU's tokens/s is a smoke test.
"""
from __future__ import annotations

import sys

import pandas as pd

from analysis.load import fail, once_per_measurement, runs_frame, throughput_frame

KEY = ["model", "tasks", "engine", "variant", "budget", "batch_size", "batch_seed"]
SHOWN = ["accuracy", "union_mean", "kept_mean", "weight_retained"]
TIMED = ["model", "routing", "variant", "budget", "batch_size"]  # what joins a timing to a run


def _timings(root: str) -> pd.DataFrame:
    """tokens/s per TIMED key; two timings of one key (two throughput runs) are refused."""
    tp = throughput_frame(root)
    if tp.empty:
        return pd.DataFrame(columns=[*TIMED, "tokens_per_s", "timed_engine", "timed_on"])
    tp = tp.assign(budget=tp["budget"].astype("Int64"), variant=tp.get("variant", tp["method"]).fillna(tp["method"]))
    if "mode" in tp:  # a configuration timed both ways: the CUDA-graph timing is the one served
        graphed = tp.groupby(TIMED, dropna=False)["mode"].transform(lambda m: (m == "graph").any())
        tp = tp[(tp["mode"] == "graph") | ~graphed.astype(bool)]
    twice = tp[tp.duplicated(TIMED, keep=False)]
    if len(twice):
        r = twice.iloc[0]
        fail(f"{root}: {len(twice)} throughput rows time the same configuration (e.g. {r['model']} {r['variant']} "
             f"budget {r['budget']} batch {r['batch_size']} in {', '.join(sorted(twice['run'].unique()))}); "
             "compare one throughput run per configuration")
    return tp.reindex(columns=[*TIMED, "tokens_per_s", "timed_engine", "timed_on"])


def compare(root: str) -> pd.DataFrame:
    ev = runs_frame(root)
    if ev.empty:
        timed = len(throughput_frame(root))
        fail(f"no finished evaluate runs under {root}" + (f" (its throughput runs: python -m analysis.throughput {root} "
                                                          f"<out folder>)" if timed else ""))
    key = KEY + (["admission"] if ev["admission"].nunique(dropna=False) > 1 else [])
    key += ["setting"] if (ev["setting"] != "").any() else []
    ev = ev.assign(budget=ev["budget"].astype("Int64"))
    ev = once_per_measurement(ev, key, lambda r: ("", f"the same {', '.join(key)}", "shown once"))
    table = ev.reindex(columns=[*key, "routing", *SHOWN]).merge(_timings(root), on=TIMED, how="left")
    if table["tokens_per_s"].isna().all():  # nothing timed: no columns saying where timings came from
        table = table.drop(columns=["timed_engine", "timed_on"])
    return table.drop(columns="routing").sort_values(key, na_position="first").reset_index(drop=True)


def main(argv: list[str]) -> None:
    root = argv[0] if argv else "outputs/demo"
    with pd.option_context("display.width", 160, "display.max_columns", None):
        print(compare(root).round(3).to_string(index=False))


if __name__ == "__main__":
    main(sys.argv[1:])
