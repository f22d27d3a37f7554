"""What the committed request streams measure once the order of their variants is accounted for.

    python -m analysis.stream_order results/stream/runs results/stream/order

The stream grid (base/runtime/stream.py, `throughput.mode=stream`) ran its variants one after the
other in a fixed order inside one process, dense first in every (routing, slots, admission) group.
Every variant prefills the same prompts dense, yet the first one paid the most prefill time in
every group (first-seen prompt shapes: the warm-up covers one round of them). Each row of
stream.csv is written in run order, so `position` (1 = first) is its rank in its group. Columns:

  prefill_share              admission-prefill seconds over the stream's seconds
  speedup_vs_dense           tokens/s over dense's, as measured (the order artefact included)
  speedup_prefill_adjusted   the same with dense's prefill seconds set to the mean of the other
                             variants' (dense's decode seconds kept): what is left of the gain once
                             dense stops paying for being first
  speedup_decode_only        output tokens over the seconds outside admission prefills, over dense's
  stream_ms_per_step         the stream's seconds over its decode steps (what a request sees per token)
  decode_ms_per_step         the same without the prefill seconds
  tpot_over_step             TPOT p50 over the median replayed decode step: TPOT is a request's time
                             between its first and last token over its tokens after the first, so
                             every admission prefill that ran meanwhile (no slot decodes during one)
                             and every re-captured step is inside it; the median step leaves both out

Writes <dest>.csv and <dest>.md, each row with the decode engine of its run (`engine`, the last
column: analysis/stream.py's load refuses runs of two). Reads results/ (or outputs/) only.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.load import command_line
from analysis.stream import load

GROUP = ["model", "routing", "slots", "admission"]
COLUMNS = GROUP + ["position", "variant", "budget", "prefill_s", "seconds", "prefill_share", "tokens_per_s",
                   "speedup_vs_dense", "speedup_prefill_adjusted", "speedup_decode_only", "tpot_ms_p50",
                   "step_ms_median", "stream_ms_per_step", "decode_ms_per_step", "tpot_over_step", "engine"]


def order_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per stream row of `runs` (analysis.stream.load), with the columns of the module doc."""
    out = []
    for _, g in runs.groupby(GROUP, sort=False, dropna=False):
        dense = g[g["variant"] == "dense"]
        if len(dense) != 1:
            raise SystemExit(f"error: {dict(zip(GROUP, g.iloc[0][GROUP]))}: {len(dense)} dense rows, need exactly one")
        d = dense.iloc[0]
        others = g[g["variant"] != "dense"]
        adjusted_s = d["seconds"] - d["prefill_s"] + others["prefill_s"].mean()
        dense_adjusted = d["output_tokens"] / adjusted_s
        dense_decode = d["output_tokens"] / (d["seconds"] - d["prefill_s"])
        decode_s = g["seconds"] - g["prefill_s"]
        out.append(g.assign(
            prefill_share=g["prefill_s"] / g["seconds"],
            speedup_prefill_adjusted=(g["tokens_per_s"] / dense_adjusted).where(g["variant"] != "dense", 1.0),
            speedup_decode_only=g["output_tokens"] / decode_s / dense_decode,
            stream_ms_per_step=1e3 * g["seconds"] / g["steps"],
            decode_ms_per_step=1e3 * decode_s / g["steps"],
            tpot_over_step=g["tpot_ms_p50"] / g["step_ms_median"]))
    return pd.concat(out, ignore_index=True)[COLUMNS]


def markdown(t: pd.DataFrame, src: str, dest: str) -> str:
    first = t[t["position"] == 1]
    worst = t.loc[t.groupby(GROUP, sort=False, dropna=False)["prefill_s"].idxmax()]
    same = len(worst) == len(first) and (worst["variant"].to_numpy() == first["variant"].to_numpy()).all()
    note = (f"In {'every' if same else 'not every'} one of the {len(first)} groups the variant run first "
            f"({', '.join(sorted(set(first['variant'])))}) paid the most prefill time. ")
    engine = f" Decode engine: `{t['engine'].iloc[0]}` (analysis/engines.py)." if "engine" in t and len(t) else ""
    return (f"Made by `python -m analysis.stream_order {src} {dest}` (module doc: the columns).{engine}\n\n"
            "Each (model, routing, slots, admission) group's variants ran in `position` order in one process, "
            "one run each; every variant prefills the same prompts dense. " + note +
            "`speedup_prefill_adjusted` sets dense's prefill seconds to the mean of the other variants'; "
            "`speedup_decode_only` leaves every prefill out; `tpot_over_step` is TPOT p50 over the median "
            "replayed decode step.\n\n" + t.to_markdown(index=False, floatfmt=".3f") + "\n")


def main(src: str, dest: str) -> None:
    table = order_table(load(Path(src)))
    out = Path(dest)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out.with_suffix(".csv"), index=False)
    text = markdown(table, src, dest)
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(*command_line(__doc__, 2))
