"""The metrics of one served stream, with `vllm bench serve`'s definitions.

    row = request_metrics(arrival_s=0.2, token_s=[0.5, 0.52, 0.55], prompt_tokens=300)
    summary = stream_metrics([row, ...], duration_s=12.0, slo=Slo(ttft_ms=500, tpot_ms=25))

Per request (times in seconds after the stream's start; `token_s[i]` is when its i-th new token
was on the host):
  TTFT   first token - arrival (queueing for a slot and the prefill included)
  E2EL   last token - arrival (end-to-end latency)
  TPOT   (E2EL - TTFT) / (output tokens - 1): time per output token after the first; undefined for
         a one-token request (left out of TPOT's statistics, counted as 0 against the SLO, as vLLM does)
  ITL    the gaps between consecutive tokens; the stream's ITL statistics pool every gap of every
         request (a request's TPOT is the mean of its own ITLs)
Per stream: mean, p50 and p99 of each over requests (numpy's linear-interpolation percentile, as
vLLM); output tokens/s and requests/s achieved over `duration_s` (the start of the schedule to the
last token); goodput: requests meeting every SLO (TTFT <= slo.ttft_ms and TPOT <= slo.tpot_ms) per
second of the same duration.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

METRICS = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "p50", "p99")


@dataclass(frozen=True)
class Slo:
    ttft_ms: float
    tpot_ms: float


def request_metrics(arrival_s: float, token_s: list[float], prompt_tokens: int) -> dict:
    """One request's record: its tokens, TTFT, TPOT (None for one token), E2EL and ITLs, in ms."""
    if not token_s:
        raise ValueError("a served request has at least one new token")
    ttft, e2el = token_s[0] - arrival_s, token_s[-1] - arrival_s
    n = len(token_s)
    return {"prompt_tokens": prompt_tokens, "output_tokens": n, "ttft_ms": 1e3 * ttft,
            "tpot_ms": 1e3 * (e2el - ttft) / (n - 1) if n > 1 else None, "e2el_ms": 1e3 * e2el,
            "itl_ms": [1e3 * (b - a) for a, b in itertools.pairwise(token_s)]}


def _stats(values: list[float], name: str) -> dict[str, float | None]:
    if not values:
        return {f"{name}_ms_{s}": None for s in STATS}
    v = np.asarray(values, dtype=float)
    return {f"{name}_ms_mean": float(v.mean()), f"{name}_ms_p50": float(np.percentile(v, 50)),
            f"{name}_ms_p99": float(np.percentile(v, 99))}


def good(row: dict, slo: Slo) -> bool:
    """Meets every SLO (a one-token request's TPOT counts as 0)."""
    return row["ttft_ms"] <= slo.ttft_ms and (row["tpot_ms"] or 0.0) <= slo.tpot_ms


def stream_metrics(rows: list[dict], duration_s: float, slo: Slo) -> dict[str, float | int | None]:
    """The stream's summary from its request_metrics rows (see the module doc)."""
    if not rows or not duration_s > 0:
        raise ValueError(f"a stream summary needs requests and a positive duration (got {len(rows)}, {duration_s})")
    out_tokens = sum(r["output_tokens"] for r in rows)
    in_tokens = sum(r["prompt_tokens"] for r in rows)
    n_good = sum(good(r, slo) for r in rows)
    summary: dict[str, float | int | None] = {
        "completed": len(rows), "duration_s": duration_s, "input_tokens": in_tokens, "output_tokens": out_tokens,
        "request_throughput": len(rows) / duration_s, "output_throughput": out_tokens / duration_s,
        "total_token_throughput": (in_tokens + out_tokens) / duration_s,
        "goodput": n_good / duration_s, "good_fraction": n_good / len(rows),
        "slo_ttft_ms": slo.ttft_ms, "slo_tpot_ms": slo.tpot_ms,
    }
    summary |= _stats([r["ttft_ms"] for r in rows], "ttft")
    summary |= _stats([r["tpot_ms"] for r in rows if r["tpot_ms"] is not None], "tpot")
    summary |= _stats([g for r in rows for g in r["itl_ms"]], "itl")
    summary |= _stats([r["e2el_ms"] for r in rows], "e2el")
    return summary
