"""How far decode attention is from its bytes: the best launch per shape of a tools/bench_attention.py
search, as GB/s and as a share of the GPU's copy bandwidth.

    python -m analysis.attention_roofline results/roofline/grid_2026-12-06d/bench_attention_search.csv \
        --impl baseline --copy-gbps 2985 --out results/roofline/grid_2026-12-06d/attention_roofline

Bytes per launch: the filled part of the cache, K and V, read once (B rows x KV heads x filled slots x
(D + E) x 2 bytes in bf16; E = D for the heads bench_attention times), the queries and outputs left
out (< 1 %). Per (model, rows, filled): the fastest candidate whose output matched the reference, its
µs, GB/s and GB/s over `--copy-gbps` (a device-to-device copy's bandwidth on the same GPU: a
throughput run's report.json `copy_gbps`). Writes <out>.csv and <out>.md.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from analysis.engines import one_engine, with_engine
from analysis.load import fail

KV_HEADS = {"qwen3_30b_a3b": 4, "olmoe": 16}  # the heads tools/bench_attention.py times
BYTES_PER_ELEMENT = 2  # bf16 on a GPU


def best_per_shape(t: pd.DataFrame) -> pd.DataFrame:
    ok = t[t["matches_reference"].astype(bool)] if "matches_reference" in t else t
    idx = ok.groupby(["model", "B", "filled"])["us"].idxmin()
    return ok.loc[idx].reset_index(drop=True)


def roofline(t: pd.DataFrame, copy_gbps: float) -> pd.DataFrame:
    best = best_per_shape(t)
    unknown = sorted(set(best["model"]) - set(KV_HEADS))
    if unknown:
        fail(f"no KV head count for {unknown}; known: {sorted(KV_HEADS)}")
    kv = best["model"].map(KV_HEADS)
    best["MB"] = best["B"] * kv * best["filled"] * 2 * best["D"] * BYTES_PER_ELEMENT / 1e6
    best["GB_s"] = best["MB"] / best["us"] * 1e3
    best["of_copy"] = best["GB_s"] / copy_gbps
    cols = ["model", "B", "filled", "BLOCK_N", "num_warps", "target_programs", "us", "MB", "GB_s", "of_copy"]
    return best[cols]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path, help="a tools/bench_attention.py search table (<stem>_search.csv)")
    ap.add_argument("--impl", default=None, help="the implementation's rows (required when the table has two)")
    ap.add_argument("--copy-gbps", type=float, required=True, help="the GPU's copy bandwidth, GB/s")
    ap.add_argument("--out", type=Path, required=True, help="<out>.csv and <out>.md")
    args = ap.parse_args(argv)
    if not args.csv.is_file():
        fail(f"{args.csv}: no such file")
    if args.copy_gbps <= 0:
        fail(f"--copy-gbps must be > 0, got {args.copy_gbps}")
    t = pd.read_csv(args.csv)
    impls = sorted(set(t["impl"])) if "impl" in t else []
    if args.impl is not None and args.impl not in impls:
        fail(f"--impl {args.impl!r}: {args.csv} has {impls or 'no impl column'}")
    if args.impl is None and len(impls) > 1:
        fail(f"{args.csv} times {impls}: name one with --impl")
    if args.impl is not None:
        t = t[t["impl"] == args.impl]
    engine = one_engine(t, "this attention table") if "engine" in t else "unknown"
    r = roofline(t, args.copy_gbps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with_engine(r, engine).to_csv(args.out.with_suffix(".csv"), index=False)
    lines = [f"Decode attention's best launch per shape ({args.csv}{f', {args.impl}' if args.impl else ''}): the "
             f"cache's K and V read once, over the launch's µs; copy bandwidth {args.copy_gbps:,.0f} GB/s. "
             f"Made by `python -m analysis.attention_roofline` (analysis/attention_roofline.py).", "",
             "| model | rows | filled | launch (BLOCK_N, warps, programs) | µs | MB | GB/s | of copy |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for _, x in r.iterrows():
        lines.append(f"| {x['model']} | {x['B']} | {x['filled']} | {x['BLOCK_N']}, {x['num_warps']}, "
                     f"{x['target_programs']} | {x['us']:.1f} | {x['MB']:.1f} | {x['GB_s']:,.0f} | {x['of_copy']:.2f} |")
    text = "\n".join(lines) + "\n"
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
