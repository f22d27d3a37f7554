"""Where a serving run's packed prefill time goes by forward and by padded token, and what other
token buckets would pad: a reading from committed runs, for choosing `scheduler.buckets`.

    python -m analysis.prefill_buckets results/serve/grid_2026-12-04/runs results/serve/grid_2026-12-04b/runs \\
        --buckets 64,96,128,192,256,384,512,768,1024,1536,2048 --out results/serve/prefill_buckets

Per run folder (serve.csv, requests.jsonl.gz and config.yaml of a burst with packed prefill and no
chunking) and per (variant, repeat): the packed forwards its admission rounds took, rebuilt as the
scheduler packs them (each round's prompt tokens in forwards of at most the largest bucket, each
padded to the smallest bucket that holds it: base/runtime/scheduler.py, base/runtime/packing.py),
checked against the run's own count (`prefills`; a stream where they differ is left out), their
padded tokens, and the run's measured `prefill_s`. Over every stream kept, a least-squares fit
prefill_s = a * forwards + b * padded tokens (ms per forward, µs per padded token), and for each
stream the padded tokens and the fitted prefill under `--buckets`. A fit of a few runs of one
machine is a reading, not a measurement: what it predicts is for a run to confirm. The fit pools
runs of one decode engine only (analysis/engines.py; two are refused, exit 2): the table's last
column, `engine`.
"""
from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from analysis.engines import one_engine, run_engine, with_engine


def forwards(round_tokens: list[int], buckets: list[int]) -> list[int]:
    """The bucket of each packed forward of these rounds: each round in forwards of at most the
    largest bucket, each padded to the smallest bucket that holds it."""
    out = []
    for n in round_tokens:
        while n > 0:
            take = min(n, buckets[-1])
            out.append(next(b for b in buckets if b >= take))
            n -= take
    return out


def streams(run: Path) -> pd.DataFrame:
    """One row per (variant, repeat) of a run: rounds' tokens, forwards rebuilt and recorded, padded
    tokens, measured prefill s; empty for a run that is not a packed, unchunked stream."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    sched = cfg.get("scheduler") or {}
    if sched.get("packing") != "packed" or sched.get("chunked"):
        return pd.DataFrame()
    buckets = sorted(sched["buckets"])
    serve = pd.read_csv(run / "serve.csv")
    with gzip.open(run / "requests.jsonl.gz", "rt") as f:
        reqs = pd.DataFrame([json.loads(line) for line in f])
    rows = []
    for (variant, repeat), g in reqs.groupby(["variant", "repeat"]):
        rec = serve[(serve["variant"] == variant) & (serve["repeat"] == repeat)]
        if len(rec) != 1:
            continue
        rounds = g.groupby("round")["prompt_tokens"].sum().tolist()
        fw = forwards(rounds, buckets)
        rows.append({"run": str(run), "variant": variant, "repeat": repeat, "buckets": ",".join(map(str, buckets)),
                     "rounds": len(rounds), "prompt_tokens": int(sum(rounds)), "forwards": len(fw),
                     "forwards_recorded": int(rec["prefills"].iloc[0]), "padded_tokens": int(sum(fw)),
                     "prefill_s": float(rec["prefill_s"].iloc[0]), "round_tokens": rounds,
                     "engine": run_engine(run)})
    return pd.DataFrame(rows)


def fit(df: pd.DataFrame) -> tuple[float, float]:
    """(s per forward, s per padded token) by least squares over the streams."""
    A = df[["forwards", "padded_tokens"]].to_numpy(dtype=float)
    (a, b), *_ = np.linalg.lstsq(A, df["prefill_s"].to_numpy(dtype=float), rcond=None)
    return float(a), float(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="folders holding run folders (or run folders)")
    ap.add_argument("--buckets", required=True, help="another bucket set, comma-separated, e.g. 64,128,...,2048")
    ap.add_argument("--out", type=Path, default=None, help="also write <out>.csv and <out>.md")
    args = ap.parse_args()
    try:
        other = sorted({int(b) for b in args.buckets.split(",")})
    except ValueError:
        raise SystemExit(f"error: --buckets {args.buckets!r}: give token counts separated by commas") from None
    if not other or other[0] < 1:
        raise SystemExit(f"error: --buckets {args.buckets!r}: token counts must be >= 1")
    folders = [r for root in args.runs for r in ([root] if (root / "serve.csv").exists() else sorted(root.iterdir()))
               if (r / "serve.csv").exists() and (r / "requests.jsonl.gz").exists()]
    df = pd.concat([streams(r) for r in folders] or [pd.DataFrame()], ignore_index=True)
    if df.empty:
        raise SystemExit(f"error: no packed, unchunked serving runs with requests.jsonl.gz under {', '.join(map(str, args.runs))}")
    engine = one_engine(df, "the prefill fit")
    matched = df["forwards"] == df["forwards_recorded"]
    kept = df[matched].copy()
    if kept["padded_tokens"].nunique() < 2:
        raise SystemExit("error: the fit needs streams of at least two different padded totals")
    a, b = fit(kept)
    kept["fitted_s"] = a * kept["forwards"] + b * kept["padded_tokens"]
    kept["padding"] = 1 - kept["prompt_tokens"] / kept["padded_tokens"]
    alt = [forwards(r, other) for r in kept["round_tokens"]]
    kept["other_forwards"] = [len(f) for f in alt]
    kept["other_padded_tokens"] = [sum(f) for f in alt]
    kept["other_padding"] = 1 - kept["prompt_tokens"] / kept["other_padded_tokens"]
    kept["other_fitted_s"] = a * kept["other_forwards"] + b * kept["other_padded_tokens"]
    table = with_engine(kept.drop(columns=["round_tokens"]), engine)
    head = (f"prefill_s = {1e3 * a:.2f} ms per packed forward + {1e6 * b:.2f} µs per padded token "
            f"(least squares over {len(kept)} streams; {int((~matched).sum())} left out: their rebuilt forwards "
            f"differ from the recorded count; decode engine `{engine}`)\n")
    foot = (f"\n\nother = buckets {','.join(map(str, other))}: the same rounds rebuilt and the fit applied "
            f"(a prediction, not a measurement)\n")
    text = [head, table.drop(columns=["run", "engine"]).round(4).to_markdown(index=False), foot]
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out.with_suffix(".csv"), index=False)
        args.out.with_suffix(".md").write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()
