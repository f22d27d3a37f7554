"""The run folder's life: where it may go, whose it is, and how a new result replaces the old.

    check_run_folder("hydra.run.dir", folder, outputs_dir, allow_outside, protected)  # before Hydra makes it
    check_target(out_dir, run_key)       # refuse a folder that is not this run's own
    with run_lock(out_dir):              # two runs of one folder take turns
        stage = staging_dir(out_dir)     # .<name>.partial-<pid> beside it; the run writes there
        publish(stage, out_dir)          # swapped in whole (recover() finishes or undoes a killed swap)

A folder's marker (MARKER, written with its results) names the overrides it belongs to: a run
replaces only an empty folder or one of its own. Every sibling name is compared as a plain string,
never as a glob pattern (a run name holds the brackets of list overrides).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from base.checks import ConfigError
from base.files import atomic_write_text
from base.run.outputs import PENDING_REPORT, REPORT, config_hash, is_finished

MARKER = ".base_run.json"  # {"run": the overrides that name the folder, "config_hash": ...}
HYDRA_FILES = (".hydra", "run.log")  # what Hydra wrote into a run folder before the run wrote its own
MAX_RUN_NAME = 120  # file systems allow 255 bytes per name; leave room for the .partial-<pid> suffixes


# a whole boolean value, alone or in a list: `=false`, `[true,`
_BOOL = re.compile(r"(?<=[=\[,])(true|false)(?=[,\]]|$)", re.IGNORECASE)


def canonical(overrides: str) -> str:
    """Overrides with every boolean value written as a sweep writes it (True, False): Hydra names a
    sweep's points by their parsed values and a single run by what was typed, so `diagnose.enabled=false`
    and the same point of a sweep would otherwise be two folders, and the second run would decode again."""
    return _BOOL.sub(lambda m: m.group(1).capitalize(), overrides)


def same_run(held: str | None, run_key: str) -> bool:
    """Does a marker's run key name the run of these overrides (booleans as either writes them)?"""
    return held is not None and canonical(held) == canonical(run_key)


def run_name(overrides: str) -> str:
    """A run folder's name: its sorted overrides (booleans written as a sweep writes them: canonical),
    "default" for none; a long one keeps a readable prefix and a hash of the whole (every override is in
    config.yaml and report.json). A path in an override value (model.path=/data/m) cannot lead the
    folder elsewhere: separators become '_'."""
    if not overrides:
        return "default"
    overrides = canonical(overrides)
    overrides = overrides.replace("/", "_").replace("\\", "_")
    if len(overrides) <= MAX_RUN_NAME:
        return overrides
    digest = hashlib.sha1(overrides.encode()).hexdigest()[:10]
    return f"{overrides[: MAX_RUN_NAME - 12].rstrip(',')}-{digest}"


def check_run_folder(what: str, folder: Path, outputs_dir: Path, allow_outside: bool,
                     protected: dict[str, Path]) -> None:
    """Where a run or sweep folder may go: below outputs_dir (anywhere else only with
    allow_outside_outputs=true), and never a folder that holds one of `protected` (the checkout,
    the working directory, outputs_dir, artifacts_dir: a run replaces its folder when it finishes)."""
    f, outputs = folder.resolve(), outputs_dir.resolve()
    for name, path in protected.items():
        path = path.resolve()
        if f == path or f in path.parents:
            raise ConfigError(f"{what}={folder} would make {f} a run folder, and it holds {name} ({path}); "
                              f"give a folder of its own below outputs_dir")
    if not allow_outside and outputs not in f.parents:
        raise ConfigError(f"{what}={folder} is outside outputs_dir={outputs_dir} ({outputs}): runs go below "
                          f"outputs_dir; set allow_outside_outputs=true to write to {f}")


def write_marker(folder: Path, run_key: str, chash: str) -> None:
    atomic_write_text(folder / MARKER, json.dumps({"run": run_key, "config_hash": chash}))


def marker_run(folder: Path) -> str | None:
    """The overrides (run key) a run folder's marker names; None without a readable marker."""
    try:
        return str(json.loads((folder / MARKER).read_text())["run"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_target(out_dir: Path, run_key: str) -> None:
    """Refuse a run folder that holds anything but a run of these overrides (run_key): a run never
    replaces what it did not make. Allowed: no folder, an empty one, one whose marker names this
    run, one holding only Hydra's files of a start that failed, and a finished run from before
    markers existed in the folder these overrides name."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ConfigError(f"run folder {out_dir} is a file; give a folder that is new, empty or a run of the same "
                          f"overrides")
    entries = sorted(p.name for p in out_dir.iterdir())
    if not entries or set(entries) <= set(HYDRA_FILES):
        return
    held = marker_run(out_dir)
    if same_run(held, run_key):
        return
    if held is None and is_finished(out_dir) and out_dir.name == run_name(run_key):
        return  # a finished run of these overrides, made before run folders had a marker
    what = (f"the run of other overrides ({held or 'none'})" if held is not None else
            f"files that are not a run of these overrides ({', '.join(entries[:5])}{', ...' if len(entries) > 5 else ''})")
    raise ConfigError(f"run folder {out_dir} holds {what}; a run replaces only its own folder: give a new or empty "
                      f"folder (hydra.run.dir=..., or drop it for outputs_dir/exp_name/<overrides>)")


def _siblings(out_dir: Path, kind: str) -> list[Path]:
    """out_dir's own .<name>.<kind>-<pid> folders (kind: partial or old), by exact name."""
    prefix = f".{out_dir.name}.{kind}-"
    if not out_dir.parent.is_dir():
        return []
    return sorted(p for p in out_dir.parent.iterdir() if p.name.startswith(prefix) and p.name[len(prefix):].isdigit())


@contextmanager
def run_lock(out_dir: Path) -> Iterator[None]:
    """Hold the lock of one run folder (`.<name>.lock` beside it) for the with-block: two runs of
    one folder never stage or publish at once; the second waits, and says so. The holder removes
    the file when it is done, so a finished run leaves none behind: a run that waited on the removed
    file finds, once it has the lock, that the path no longer names that file, and locks the one
    there now (or a new one) instead (flock(2): the kernel drops the lock of a killed holder)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    path = out_dir.parent / f".{out_dir.name}.lock"
    fd = _lock(path, f"[base] another run of {out_dir} is in progress (lock {path}); waiting for it")
    try:
        yield
    finally:
        try:
            if os.path.samestat(os.fstat(fd), path.stat()):  # ours (nobody removes a file they do not hold)
                path.unlink()
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)


def _lock(path: Path, waiting: str) -> int:
    """A descriptor holding the exclusive flock of the file at `path` (created if missing, 0666 less
    the umask), once the file it locked is still the one the path names."""
    told = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not told:
                    print(waiting, flush=True)
                    told = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if os.path.samestat(os.fstat(fd), path.stat()):
                    return fd
            except FileNotFoundError:
                pass  # removed by the run that held it: lock the path anew
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def staging_dir(out_dir: Path, carry: tuple[str, ...] = (), config: str | None = None) -> Path:
    """A fresh folder for the run's results, beside out_dir; leftovers of killed reruns go. Call it
    holding run_lock(out_dir): no other run of the folder is live then. `carry`: files a stopped
    attempt of the same run wrote as it went (a serve run's finished streams), copied from the
    newest leftover whose config.yaml is `config` (every key, renamed ones as outputs.as_recorded
    reads them) into the new folder, where the run resumes from them instead of serving them again."""
    recover(out_dir)
    stale = _siblings(out_dir, "partial")
    carried: dict[str, bytes] = {}
    if carry and config is not None:
        for old in sorted(stale, key=lambda p: p.stat().st_mtime, reverse=True):
            if (old / "config.yaml").is_file() and config_hash((old / "config.yaml").read_text(), ()) == \
                    config_hash(config, ()):
                carried = {name: (old / name).read_bytes() for name in carry if (old / name).is_file()}
                break
    for old in stale:
        shutil.rmtree(old, ignore_errors=True)
    stage = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    stage.mkdir(parents=True)
    for name, data in carried.items():
        (stage / name).write_bytes(data)
    return stage


def recover(out_dir: Path) -> None:
    """Finish or undo a publish that was killed (call it holding run_lock(out_dir)). Killed after
    its second rename, out_dir holds the whole new result with the report still pending: the report
    is put in place. Killed after its first rename, the previous result is .<name>.old-<pid>: it is
    put back; or, when the previous result was kept as another measurement (publish's `keep`) and
    out_dir is gone, the complete new result (its staging folder holds the pending report) is put in
    place. Old folders of finished swaps go."""
    if (out_dir / PENDING_REPORT).exists() and not is_finished(out_dir):
        (out_dir / PENDING_REPORT).rename(out_dir / REPORT)
    if not out_dir.exists():
        complete = [s for s in _siblings(out_dir, "partial") if (s / PENDING_REPORT).exists()]
        if complete:
            complete[-1].rename(out_dir)
            (out_dir / PENDING_REPORT).rename(out_dir / REPORT)
    for old in _siblings(out_dir, "old"):
        if not is_finished(out_dir) and is_finished(old):
            if out_dir.is_dir() and not any(out_dir.iterdir()):
                out_dir.rmdir()  # made empty by Hydra for the recovering run
            if not out_dir.exists():
                old.rename(out_dir)
                continue
        shutil.rmtree(old, ignore_errors=True)


def publish(stage: Path, out_dir: Path, keep: Path | None = None) -> None:
    """The complete new result replaces out_dir's (checked by check_target to be this run's own):
    two renames swap the folders, and the pending report becomes report.json last (until then no
    reader sees a report.json beside half a run; recover() finishes or undoes a killed swap).
    `keep`: where the earlier run goes instead of being deleted (another measurement)."""
    old = keep if keep is not None else out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
    try:
        out_dir.rename(old)
    except FileNotFoundError:
        old = None
    stage.rename(out_dir)
    (out_dir / PENDING_REPORT).rename(out_dir / REPORT)
    if old is not None and keep is None:
        shutil.rmtree(old, ignore_errors=True)


def remove_if_made(out_dir: Path, new_folders: list[Path], started: float) -> None:
    """After a failed start: the run folder, if empty and made by this command (below a folder that
    was missing when it started, or, for a sweep's point, created since), and the folders above it
    that were missing, if empty. Nothing that existed before the command is removed."""
    made = [p for p in new_folders if out_dir == p or p in out_dir.parents]
    try:
        if not any(out_dir.iterdir()) and (made or out_dir.stat().st_ctime >= started):
            out_dir.rmdir()
    except OSError:
        return
    for folder in sorted((p for p in made if p != out_dir), key=lambda p: len(p.parts), reverse=True):
        try:
            folder.rmdir()  # only an empty one
        except OSError:
            return
