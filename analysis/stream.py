"""The request-stream table: one row per (routing, slots, method, budget, admission) from stream runs.

    python -m analysis.stream results/stream/runs results/stream/summary

Reads every stream.csv under the folder (each run folder of `python run.py experiment=stream ...`,
`throughput.mode=stream`) with its report.json (model, routing) and writes <dest>.csv and <dest>.md:
output tokens/s and its ratio to dense at the same slots, time per output token and time to first
token (p50 / p90), mean occupancy, union before selection and kept experts, the median decode step
and the seconds spent in admission prefills (and, for union admission, in predicting experts).
`position` is a row's place in its run's order (1 = first) among the variants of its slot count: the
variants ran one after the other, dense first, and the first paid the most prefill time, so
`speedup_vs_dense` is inflated (analysis/stream_order.py separates the two). The last column,
`engine`, is the decode engine of the runs (analysis/engines.py); runs of two are refused (exit 2).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.engines import engine_of, one_engine
from analysis.load import _config, command_line, fail, finished, read_report

COLUMNS = ["model", "routing", "slots", "position", "variant", "budget", "admission", "tokens_per_s", "speedup_vs_dense",
           "tpot_ms_p50", "tpot_ms_p90", "ttft_ms_p50", "ttft_ms_p90", "occupancy_mean", "union_mean", "kept_mean",
           "step_ms_median", "seconds", "prefill_s", "predict_s", "requests", "rounds", "steps", "output_tokens", "engine"]


def load(root: Path) -> pd.DataFrame:
    frames = []
    for csv in finished(root, "stream.csv"):  # a killed run's partial stream.csv is skipped, named
        rep = read_report(csv.parent / "report.json")
        runs = pd.read_csv(csv)  # rows in run order
        runs["position"] = runs.groupby("slots").cumcount() + 1
        frames.append(runs.assign(model=rep.get("model"), routing=rep.get("routing"),
                                  engine=engine_of(rep, _config(csv.parent))))
    if not frames:
        fail(f"no stream.csv of a finished run under {root}")
    df = pd.concat(frames, ignore_index=True)
    one_engine(df, f"the stream table of {root}")
    return df[[c for c in COLUMNS if c in df.columns]].sort_values(["model", "routing", "admission", "slots"],
                                                                   kind="stable")


def main(src: str, dest: str) -> None:
    table = load(Path(src))
    out = Path(dest)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out.with_suffix(".csv"), index=False)
    text = (f"Request streams through continuous batching, from {src} (`python -m analysis.stream {src} {dest}`; "
            f"decode engine `{table['engine'].iloc[0]}`, analysis/engines.py); "
            "one run per row; `position`: the variant's place in its run order, dense first (the first paid the most "
            "prefill time: `speedup_vs_dense` carries that; analysis/stream_order.py).\n\n" + table.round(3).to_markdown(index=False) + "\n")
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(*command_line(__doc__, 2))
