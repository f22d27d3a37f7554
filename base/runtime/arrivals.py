"""When the requests of a serving benchmark arrive: a seeded Poisson schedule, or all at once.

    arrival_times(64, rate=4.0, seed=0)   # 64 times in seconds after the start, the last at 64 / 4 = 16 s
    arrival_times(64, rate=None, seed=0)  # the closed burst: 64 zeros

As `vllm bench serve` (burstiness 1) draws them: exponential gaps of mean 1 / rate, summed, then
scaled so that the n-th arrival falls at n / rate, which makes the offered rate exactly `rate`
whatever the draw. The gaps come from numpy's generator seeded by `seed` alone, so the schedules of
one seed at two rates are the same draw, scaled (common random numbers across rates), and every
variant and repeat that uses the seed sees the same arrivals.
"""
from __future__ import annotations

import numpy as np


def arrival_times(n: int, rate: float | None, seed: int) -> list[float]:
    """n arrival times (s after the start, non-decreasing): Poisson at `rate` requests/s, or 0 for
    every request when rate is None (the closed burst)."""
    if n < 1:
        raise ValueError(f"arrival_times needs at least one request, got n={n}")
    if rate is None:
        return [0.0] * n
    if not rate > 0:
        raise ValueError(f"rate must be > 0 requests/s or None (all at once), got {rate}")
    gaps = np.random.default_rng(seed).exponential(1.0, n)
    times = np.cumsum(gaps)
    return (times * (n / rate) / times[-1]).tolist()
