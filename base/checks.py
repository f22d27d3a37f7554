"""ConfigError and the checks every typed config uses: each names the valid choices or range."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the valid choices or range."""


def check_choice(what: str, value: Any, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(f"{what}={value!r} is not valid; choose one of: {', '.join(valid)}")


def check_int(what: str, value: Any, low: int, high: int | None = None, allow_none: bool = False,
              high_is: str = "") -> int | None:
    """An int in [low, high] (or None with allow_none); the message names the range, and where the
    bound comes from another key, `high_is` names it (e.g. "throughput.gen_tokens - 1")."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value))
        except ValueError:
            rng = f"an integer in [{low}, {high}]" if high is not None else f"an integer >= {low}"
            raise ConfigError(f"{what}={value!r} must be {rng}{' or null' if allow_none else ''}") from None
    if value < low or (high is not None and value > high):
        rng = f"[{low}, {high}]" if high is not None else f">= {low}"
        rng += f" ({high_is} = {high})" if high_is and high is not None else ""
        raise ConfigError(f"{what}={value} is out of range: must be {rng}{' or null' if allow_none else ''}")
    return value


def check_float(what: str, value: Any, low: float | None = None, high: float | None = None,
           low_open: bool = False) -> float:
    """A float in [low, high] ((low, high] when low_open); the message names the range."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    lo_ok = low is None or (v > low if low_open else v >= low)
    hi_ok = high is None or v <= high
    if math.isnan(v) or not (lo_ok and hi_ok):
        lo = "" if low is None else (f"> {low}" if low_open else f">= {low}")
        hi = "" if high is None else f"<= {high}"
        raise ConfigError(f"{what}={value!r} is out of range: must be a number {' and '.join(x for x in (lo, hi) if x)}")
    return v


def check_folder(what: str, path: Path) -> None:
    """A folder the run will create or write into: whatever of the path exists already is a folder
    (a file in the way would fail the first write, after the run started)."""
    p = Path(path)
    for part in (p, *p.parents):
        try:
            exists = part.exists()
        except OSError:  # a name too long for the file system: looked at when making it, below
            exists = False
        if exists:
            if not part.is_dir():
                raise ConfigError(f"{what}={path}: {part} is a file, not a folder; give a folder path")
            _check_creatable(what, path, part, p.relative_to(part).parts)
            return


def _check_creatable(what: str, path: Path, existing: Path, missing: tuple[str, ...]) -> None:
    """The folders still missing below `existing` can be made there: names the file system takes,
    and a folder it lets this process write into (permissions, a read-only mount, /proc). Probed with
    a temporary folder that is removed at once, so nothing stays behind."""
    import errno
    import os
    import tempfile

    limit = os.pathconf(existing, "PC_NAME_MAX") if hasattr(os, "pathconf") else 255
    for name in missing:
        if len(os.fsencode(name)) > limit:
            raise ConfigError(f"{what}={path}: the folder name {name[:40]}... is {len(os.fsencode(name))} bytes; "
                              f"this file system allows {limit}")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".base-probe-", dir=existing))
    except OSError as err:
        why = "read-only file system" if err.errno == errno.EROFS else (err.strerror or type(err).__name__)
        raise ConfigError(f"{what}={path}: cannot create folders in {existing} ({why}); give a folder this user can "
                          f"write") from None


def check_file(what: str, path: Path, shown: str) -> None:
    """An input file: present and a file (not a folder)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{what}={shown} is a folder (looked for {p}); give a file")


def check_unique(what: str, values: list) -> None:
    """A list whose entries name measurements: each once (a repeated task counted twice in the
    summary accuracy; a repeated batch size was measured twice)."""
    seen, repeated = set(), []
    for v in values:
        key = repr(v)
        if key in seen and v not in repeated:
            repeated.append(v)
        seen.add(key)
    if repeated:
        raise ConfigError(f"{what}={list(values)} names {', '.join(map(str, repeated))} more than once: give each once")

