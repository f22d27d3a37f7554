"""Progress bars, shown by one rule: on an interactive terminal, never under CI.

    with progress(total=len(requests), desc="decode", unit="request") as bar:
        serve(..., progress=bar.update)        # a callback where the work finishes its items
    for batch in progress(batches, desc="calibrate", unit="batch"): ...

A bar is drawn when stderr is a terminal and the CI variable is unset (or 0/false): a launched
job's log, a CI log, a pipe and run.log stay free of bar redraws. The hot loops take a callback
(`progress=bar.update`), not tqdm itself.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

from tqdm.auto import tqdm


def quiet() -> bool:
    """No bars: under CI, or when stderr is not a terminal."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false") or not sys.stderr.isatty()


def progress(iterable: Iterable | None = None, *, disable: bool = False, **kwargs: Any) -> tqdm:
    """tqdm over `iterable` (or a bar of `total=` items to .update()), drawn only where quiet() allows."""
    return tqdm(iterable, disable=disable or quiet(), dynamic_ncols=True, **kwargs)


def say(text: str) -> None:
    """A line on stdout that a bar being drawn on the terminal does not garble (tqdm.write)."""
    tqdm.write(text, file=sys.stdout)
    sys.stdout.flush()
