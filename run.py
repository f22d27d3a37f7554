"""The one entry point. Hydra is read here only: it builds a typed RunConfig and hands it down.

    python run.py model=qwen3_30b method=base budget=16
    python run.py -m method=dense,router_sum,count,base budget=4,8,16
    python run.py model=qwen3_30b model.init=random model.device=meta stage=describe logger=none

Each run writes outputs/<exp_name>/<run name from overrides>/ (config.yaml, report.json, CSVs);
a sweep also keeps outputs/<exp_name>/sweep_summary.csv (base/run/sweep.py). Launchers
(docs/cluster.md): hydra/launcher=local_gpus | joblib | submitit_local | slurm | ray.

Offline by itself: when none of HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, TRANSFORMERS_OFFLINE is set
and no network is configured, run.py sets all three to 1 (one warning line), so models, tokenizers
and datasets come from local files and the cache at once instead of after the Hub's retries. "No
network configured": neither HF_ENDPOINT (a mirror) nor an HTTPS or ALL proxy variable is set, and
a TCP connection to huggingface.co:443 does not open within 1.5 s (the name lookup included). Set
any of the three yourself (HF_HUB_OFFLINE=0: try the Hub) and run.py leaves them alone.
"""
from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import field
from datetime import datetime
from pathlib import Path

try:
    import hydra
except ModuleNotFoundError as missing:  # `python3 run.py` outside the project's environment
    sys.exit(f"error: {missing.name} is not installed for {sys.executable}: run `make install`, then "
             f"`.venv/bin/python run.py ...` (or `source .venv/bin/activate`)")
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from base.checks import check_folder
from base.config import DELETED_KEYS, RENAMED_KEYS, ConfigError, RunConfig, config_fields
from base.run.gpu_pool import job_gpu, launcher_jobs, lock_dir, visible_gpus
from base.run.outputs import config_hash, read_report
from base.run.report import headline
from base.run.run_folder import check_run_folder, check_target, remove_if_made, run_name
from base.run.sweep import error_line, read_summary, record_job

ROOT = Path(__file__).resolve().parent

# Set when the command starts and inherited by every job a launcher starts (worker processes,
# SLURM tasks): force=true recomputes a shared artifact once per sweep (base/run/artifacts.py).
STARTED_ENV = "BASE_SWEEP_STARTED"

# run.py's own keys, where runs go (not part of a run: RunConfig has none), after exp_name
FOLDER_KEYS = [("outputs_dir", str, "outputs"),
               ("allow_outside_outputs", bool, False)]  # hydra.run.dir / hydra.sweep.dir may name a folder outside outputs_dir


def run_schema() -> type:
    """conf/config.yaml's shape, made from RunConfig's fields (base/config.py config_fields) and
    FOLDER_KEYS, registered with Hydra's ConfigStore (conf/config.yaml's defaults list starts with
    it): every key has a type, so a value of the wrong type (`force=maybe`, `budget=abc`) or an
    unknown key fails when Hydra composes the configuration, naming the key, and on/off switches
    are booleans (`no` is false). A conf/ group (model, method, task, logger) and a group that needs
    a value (calibration.files) are ??? until conf/config.yaml fills them; a key without a default
    likewise. Ranges and cross-field rules are checked after composition, in the dataclasses'
    __post_init__ (base/config.py)."""
    specs = []
    for f, key, kind in config_fields():
        if dataclasses.is_dataclass(kind):
            needs = any(g.default is dataclasses.MISSING and g.default_factory is dataclasses.MISSING
                        for g in dataclasses.fields(kind))
            spec = field(default=MISSING) if needs or (ROOT / "conf" / key).is_dir() else field(default_factory=kind)
        else:
            spec = field(default=MISSING if f.default is dataclasses.MISSING else f.default)
        specs.append((key, kind, spec))
        if key == "exp_name":
            specs += [(k, t, field(default=d)) for k, t, d in FOLDER_KEYS]
    schema = dataclasses.make_dataclass("RunSchema", specs, namespace={"__module__": __name__})
    schema.__doc__ = run_schema.__doc__
    return schema


RunSchema = run_schema()
ConfigStore.instance().store(name="run_schema", node=RunSchema)


NAME_MAX = 255  # bytes of one folder name on the usual filesystems (ext4, xfs, APFS)


def folder_name(name: str) -> str:
    """exp_name as the folder it names under outputs_dir: a plain name, nothing that leaves it."""
    name = str(name)
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise ConfigError(f"exp_name={name!r} must be a plain folder name (no '/', '\\', '..'): runs go to "
                          f"<outputs_dir>/<exp_name>/")
    if len(name.encode()) > NAME_MAX:
        raise ConfigError(f"exp_name is {len(name.encode())} bytes long: a folder name holds at most {NAME_MAX}")
    return name


OmegaConf.register_new_resolver("run_name", run_name, replace=True)
OmegaConf.register_new_resolver("folder", folder_name, replace=True)
# hydra/launcher=local_gpus: one joblib worker per GPU (resolved in the launching process)
OmegaConf.register_new_resolver("gpu_count", launcher_jobs, replace=True)
# hydra/launcher=ray_jobs: a GPU per task where there are GPUs (num_gpus=1 on a CPU host never schedules)
OmegaConf.register_new_resolver("one_gpu_if_any", lambda: min(1, len(visible_gpus())), replace=True)


def calibration(c: dict, overrides: str) -> dict:
    """The calibration settings: a model's own files replace the default calibration.files, and a
    calibration.files given on the command line replaces both."""
    calib = dict(c["calibration"])
    if c["model"].get("calib_files") and "calibration.files=" not in overrides:
        calib["files"] = list(c["model"]["calib_files"])
    return calib


def repo_path(path: str) -> Path:
    """A path from the config: relative ones (outputs_dir, artifacts_dir, files) are relative to the
    checkout, wherever run.py is started (so `make report` finds the runs and models resolve)."""
    return Path(path) if Path(path).is_absolute() else ROOT / path


OmegaConf.register_new_resolver("repo", lambda path: str(repo_path(str(path))), replace=True)


def build_config(cfg: DictConfig, out_dir: Path, overrides: str = "", run_key: str | None = None) -> RunConfig:
    """DictConfig -> validated RunConfig. Raises ValueError with the valid choices or range. run_key:
    the overrides that name the run folder (Hydra's override_dirname; default: overrides)."""
    check_complete(cfg)
    c = OmegaConf.to_container(cfg, resolve=True)
    c["calibration"] = calibration(c, overrides)
    c["artifacts_dir"] = repo_path(c["artifacts_dir"])
    c["logger"]["dir"] = str(repo_path(c["logger"]["dir"]))  # relative to the checkout, as outputs_dir
    values = {f.name: kind(**c[key]) if dataclasses.is_dataclass(kind) else c[key] for f, key, kind in config_fields()}
    return RunConfig(**values, out_dir=out_dir, root=ROOT, overrides=overrides,
                     run_key=overrides if run_key is None else run_key,
                     started=float(os.environ.get(STARTED_ENV, time.time())))


# The launcher settings conf/hydra/launcher/*.yaml read from the environment, with their minimum:
# checked before Hydra resolves them (its message for a bad one is a traceback).
LAUNCHER_ENV = {"BASE_SLURM_GPUS": 0, "BASE_SLURM_TIME_MIN": 1, "BASE_SLURM_MEM_GB": 1, "BASE_SLURM_CPUS": 1,
                "BASE_SLURM_REQUEUE": 0,
                "BASE_RAY_GPUS": 0, "BASE_RAY_CPUS": 0}


def check_launcher_env() -> None:
    started = os.environ.get(STARTED_ENV)
    if started is not None:
        try:
            ok = math.isfinite(float(started))
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(f"{STARTED_ENV}={started!r} must be a time in seconds since the epoch (run.py sets it for "
                              f"the jobs it launches); unset it")
    for key, low in LAUNCHER_ENV.items():
        value = os.environ.get(key)
        if value is None:
            continue
        whole = key.startswith("BASE_SLURM")  # Ray takes fractions of a GPU or CPU
        try:
            number = int(value) if whole else float(value)
        except ValueError:
            number = None
        if number is None or not math.isfinite(number) or number < low:
            kind = "a whole number" if whole else "a number"
            raise ConfigError(f"{key}={value!r} must be {kind} >= {low} (read by hydra/launcher="
                              f"{'slurm' if whole else 'ray_jobs'})")


def sweep_note(cfg: DictConfig, gpu: str | None) -> Callable[..., None]:
    """note(status=..., error=..., report=...) writes this job's row of the sweep summary
    (base/run/sweep.py), with the headline numbers of a finished run's report."""
    hc = HydraConfig.get()
    sweep_dir, run = Path(hc.sweep.dir), str(hc.sweep.subdir)
    fixed = {"job": hc.job.num, "overrides": ",".join(hc.overrides.task), "host": socket.gethostname(),
             "config_hash": config_hash(OmegaConf.to_yaml(cfg, resolve=True)), "pid": os.getpid(), "gpu": gpu,
             "launcher": str(hc.launcher.get("_target_", "")).rsplit(".", 1)[-1]}
    t0 = time.time()

    def note(status: str, error: str | None = None, report: dict | None = None) -> None:
        now = datetime.now().isoformat(timespec="seconds")
        if status == "started":
            record_job(sweep_dir, run, status=status, started=now, **fixed)
        else:
            record_job(sweep_dir, run, status=status, error=error, ended=now, wall_s=f"{time.time() - t0:.1f}",
                       **(headline(report) if report else {}))

    return note


def run_job(cfg: DictConfig, out_dir: Path, overrides: str, run_key: str) -> dict | None:
    """One run; raises ConfigError for a bad input (before the run writes anything)."""
    try:
        run_cfg = build_config(cfg, out_dir, overrides, run_key)
    except TypeError as err:  # an unknown key reaching a config dataclass
        raise ConfigError(str(err)) from None
    from base.run.pipeline import run

    # Hydra's own record of the run (it no longer writes into the run folder: conf/config.yaml)
    hydra_files = {".hydra/config.yaml": OmegaConf.to_yaml(cfg), ".hydra/hydra.yaml": OmegaConf.to_yaml(HydraConfig.instance().cfg),
                   ".hydra/overrides.yaml": OmegaConf.to_yaml(list(HydraConfig.get().overrides.task))}
    return run(run_cfg, OmegaConf.to_yaml(cfg, resolve=True), hydra_files)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> dict | None:
    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    sweep = hc.mode == RunMode.MULTIRUN
    # joblib workers share this host's GPUs: each job holds one (base/run/gpu_pool.py)
    local_parallel = sweep and "joblib" in str(hc.launcher.get("_target_", ""))
    with job_gpu(visible_gpus(), lock_dir()) if local_parallel else nullcontext() as gpu:
        note = sweep_note(cfg, gpu) if sweep else lambda status, error=None, report=None: None
        note("started")
        try:
            report = run_job(cfg, out_dir, ",".join(hc.overrides.task), hc.job.override_dirname)
        except ConfigError as err:  # e.g. budget above the model's expert count
            note("failed", error_line(err))
            remove_if_made(out_dir, [Path(p) for p in json.loads(os.environ.get(NEW_FOLDERS_ENV, "[]"))],
                           float(os.environ.get(STARTED_ENV, time.time())))
            print(f"error: {err}", file=sys.stderr)
            if sweep:
                return None  # recorded; the sweep goes on and ends with exit 2 (RunFolders)
            sys.exit(2)
        except KeyboardInterrupt:
            note("interrupted", "KeyboardInterrupt")
            print(f"interrupted: {out_dir} keeps no partial result (a rerun starts it again)", file=sys.stderr)
            sys.exit(130)
        except OSError as err:
            if err.errno not in DISK_ERRORS:
                note("failed", error_line(err))
                raise
            note("failed", error_line(err))
            print(f"error: {disk_message(err)}", file=sys.stderr)
            sys.exit(2)
        except Exception as err:
            note("failed", error_line(err))
            raise
        note("skipped" if report is None else "finished", report=report or read_report(out_dir))
    if report is not None:
        from base.run.report import print_report

        print_report(report, out_dir)
    return report


DISK_ERRORS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}  # a full disk, `ulimit -f`, a quota


def disk_message(err: OSError, path: Path | None = None) -> str:
    where = f" {err.filename or path}" if (err.filename or path) else ""
    return f"could not write{where}: {err.strerror or err} (free some space, or raise the file size limit), then rerun"


# The folders a command's start found missing (JSON list), for main to remove again, if still empty,
# when the run fails at start: a failed start leaves nothing behind.
NEW_FOLDERS_ENV = "BASE_NEW_FOLDERS"


class RunFolders(Callback):
    """Hydra calls this before it makes any folder (conf/config.yaml: hydra.callbacks). It refuses,
    with exit 2, a run or sweep folder outside outputs_dir (unless allow_outside_outputs=true) or one
    that holds the checkout, the working directory, outputs_dir or artifacts_dir; an existing folder
    that is not a run of the same overrides; and sweep points whose folders collide. After a sweep,
    it ends the command with exit 2 if a point failed at start (each is in sweep_summary.csv)."""

    def __init__(self) -> None:
        self.points: list[tuple[Path, str]] = []  # (sweep folder, run folder name) of each point

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        _refuse_or_go(lambda: self._check_run(config))

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        _refuse_or_go(lambda: self._check_sweep(config))
        sweep_dir = Path(str(config.hydra.sweep.dir))
        _keep_earlier_sweep_record(sweep_dir)
        try:  # Hydra's own write of it next would end in its traceback on a full disk
            sweep_dir.mkdir(parents=True, exist_ok=True)
            OmegaConf.save(config, sweep_dir / "multirun.yaml")
        except OSError as err:
            if err.errno not in DISK_ERRORS:
                raise
            (sweep_dir / "multirun.yaml").unlink(missing_ok=True)  # nothing half-written stays
            remove_if_made(sweep_dir, [Path(p) for p in json.loads(os.environ.get(NEW_FOLDERS_ENV, "[]"))],
                           float(os.environ.get(STARTED_ENV, time.time())))
            print(f"error: {disk_message(err, sweep_dir / 'multirun.yaml')}", file=sys.stderr)
            sys.exit(2)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        rows = [r for sweep_dir in {d for d, _ in self.points} for r in read_summary(sweep_dir)
                if (sweep_dir, r["run"]) in self.points]
        failed = [f"{r['run']}: {r['error']}" for r in rows if r["status"] == "failed"]
        if failed:
            print(f"error: {len(failed)} of {len(self.points)} sweep points failed, each with its error in "
                  f"sweep_summary.csv ({', '.join(sorted({str(d) for d, _ in self.points}))}): " + "; ".join(failed[:3]),
                  file=sys.stderr)
            sys.exit(2)

    def _check_run(self, config: DictConfig) -> None:
        with _hydra_config(config):  # ${hydra:job.override_dirname} resolves from it
            folder = Path(str(config.hydra.run.dir))
        _check_folder("hydra.run.dir", folder, config)
        check_target(folder, str(config.hydra.job.override_dirname))
        _note_new_folders([folder])

    def _check_sweep(self, config: DictConfig) -> None:
        _check_folder("hydra.sweep.dir", Path(str(config.hydra.sweep.dir)), config)
        seen: dict[Path, str] = {}
        for point, sweep_dir, subdir in _sweep_points(config):
            folder, what = sweep_dir / subdir, str(point.hydra.job.override_dirname)
            _check_folder("hydra.sweep.dir", sweep_dir, point)
            if sweep_dir.resolve() not in folder.resolve().parents:
                raise ConfigError(f"hydra.sweep.subdir={subdir} puts the run of `{what}` at {folder}, not in a folder "
                                  f"of its own inside the sweep folder {sweep_dir}")
            _check_folder("hydra.sweep.subdir", folder, point)
            if folder.resolve() in seen:
                raise ConfigError(f"sweep points `{seen[folder.resolve()]}` and `{what}` would share the run folder "
                                  f"{folder} (a folder is named by the overrides, '/' written '_', keys such as force "
                                  f"and logger left out); change the sweep so each point has a folder of its own")
            seen[folder.resolve()] = what
            check_target(folder, what)
            self.points.append((sweep_dir, subdir))
        _note_new_folders(sorted({d for d, _ in self.points}) or [Path(str(config.hydra.sweep.dir))])


def _keep_earlier_sweep_record(sweep_dir: Path) -> None:
    """Hydra writes the sweep's multirun.yaml over an earlier sweep's into the same experiment
    folder; the earlier one is kept beside it as multirun.<its time>.yaml (two sweeps at once, or
    one after another, each keep their record)."""
    old = sweep_dir / "multirun.yaml"
    if old.is_file():
        stamp = datetime.fromtimestamp(old.stat().st_mtime).strftime("%Y%m%dT%H%M%S.%f")
        old.rename(sweep_dir / f"multirun.{stamp}.yaml")


def _refuse_or_go(check: Callable[[], None]) -> None:
    """Hydra turns a callback's exception into a warning: a refusal exits here."""
    try:
        check()
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


def _check_folder(what: str, folder: Path, config: DictConfig) -> None:
    protected = {"the checkout": ROOT, "the working directory": Path.cwd(), "outputs_dir": repo_path(config.outputs_dir),
                 "artifacts_dir": repo_path(config.artifacts_dir)}
    check_run_folder(what, folder, repo_path(config.outputs_dir), bool(config.allow_outside_outputs), protected)


def _note_new_folders(folders: list[Path]) -> None:
    """The given folders and their parents that do not exist yet (main removes them after a failed start)."""
    new = [str(p.resolve()) for f in folders for p in (f, *f.parents) if not p.exists()]
    os.environ[NEW_FOLDERS_ENV] = json.dumps(new)


def _sweep_points(config: DictConfig) -> list[tuple[DictConfig, Path, str]]:
    """Each point of the sweep as Hydra's basic sweeper and launcher will compose it (its job number
    set), with its hydra.sweep.dir and subdir; a point that does not compose is left to Hydra, which
    reports it before any job runs."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import open_dict

    if not str(config.hydra.sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return []  # another sweeper chooses its points as it goes
    loader = GlobalHydra.instance().config_loader()
    params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    overrides = OverridesParser.create(config_loader=loader).parse_overrides(params + list(config.hydra.overrides.task))
    (batch,) = BasicSweeper.split_arguments(overrides, None)
    points = []
    for num, point in enumerate(batch):
        try:
            cfg = loader.load_sweep_config(config, list(point))
        except Exception:  # noqa: BLE001, S112 - Hydra's own validation reports it, before any job
            continue
        with open_dict(cfg):
            cfg.hydra.job.id, cfg.hydra.job.num = num, num
        with _hydra_config(cfg):
            points.append((cfg, Path(str(cfg.hydra.sweep.dir)), str(cfg.hydra.sweep.subdir)))
    return points


@contextmanager
def _hydra_config(config: DictConfig) -> Iterator[None]:
    """HydraConfig set to `config` for the with-block (Hydra sets it itself only when a job starts)."""
    before = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(config)
    try:
        yield
    finally:
        HydraConfig.instance().cfg = before


def check_command_line(argv: list[str]) -> None:
    """What must be refused before Hydra makes the run folder (it creates it before any of the
    project's code runs): an exp_name that would leave outputs_dir or is no plain name, an
    outputs_dir, experiment folder or artifacts_dir blocked by a file."""
    outputs_dir, artifacts_dir, names = "outputs", "outputs/artifacts", ["default"]  # conf/config.yaml's defaults
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        if key == "exp_name":
            if "${" in value:
                raise ConfigError(f"exp_name={value}: give the folder name itself, not an interpolation (its value "
                                  f"may hold '/' or be no folder name at all)")
            names = value.split(",")  # a sweep over names
            for name in names:
                folder_name(name)
        if key == "outputs_dir":
            outputs_dir = value
        if key == "artifacts_dir":
            artifacts_dir = value
    check_folder("outputs_dir", repo_path(outputs_dir))
    for name in names:
        check_folder("exp_name", repo_path(outputs_dir) / name)
    check_folder("artifacts_dir", repo_path(artifacts_dir))


GROUPS = ("model", "method", "task", "logger")  # conf/ groups a run needs one option of


def schema_gaps(cfg: DictConfig, schema: type = RunSchema, prefix: str = "",
                broken: list[str] | None = None) -> list[str]:
    """Keys of the schema with no value in `cfg`: deleted (`~budget`) or left ??? (`~model` empties
    the model group). Nested configs are walked by their own type (annotations are strings that a
    launcher's worker process could not resolve). `broken` collects `key=${...}` interpolations that
    do not resolve (`${outputs_dir}` after ~outputs_dir, `${no_such_key}`)."""
    import dataclasses

    broken = [] if broken is None else broken
    gaps = []
    for f in dataclasses.fields(schema):
        key = prefix + f.name
        if f.name not in cfg or OmegaConf.is_missing(cfg, f.name):
            gaps.append(key)
            continue
        try:
            node = cfg[f.name]
        except InterpolationResolutionError:
            broken.append(f"{key}={cfg._get_node(f.name)._value()}")
            continue
        kind = OmegaConf.get_type(node) if OmegaConf.is_config(node) else None
        if kind is not None and dataclasses.is_dataclass(kind):
            gaps += schema_gaps(node, kind, key + ".", broken)
    return gaps


def schema_extras(cfg: DictConfig, schema: type = RunSchema, prefix: str = "") -> list[tuple[str, list[str]]]:
    """Keys in `cfg` the schema does not have (a `+key=value` override adds any key: `+bugdet=4`,
    as Hydra's own hint after a typo suggests), each with the schema's keys beside it. Nested configs
    are walked by their own type; free-form sections (dict-typed: model.arch, task.*) are not."""
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(schema)}
    extras = []
    for key in cfg.keys():
        if key == "hydra" and not prefix:
            continue
        if key not in fields:
            extras.append((prefix + str(key), [prefix + k for k in fields]))
            continue
        if OmegaConf.is_missing(cfg, key):
            continue
        try:
            node = cfg[key]
        except InterpolationResolutionError:
            continue
        kind = OmegaConf.get_type(node) if OmegaConf.is_config(node) else None
        if kind is not None and dataclasses.is_dataclass(kind):
            extras += schema_extras(node, kind, f"{prefix}{key}.")
    return extras


def unknown_key(key: str, valid: list[str], more: str = "") -> ConfigError:
    """The refusal of a key the run does not read, naming the nearest valid one (or listing them)."""
    import difflib

    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]}?" if near else f"; the keys here are: {', '.join(valid)}"
    return ConfigError(f"{key}{more} is not a key of the run's configuration{hint} (a `+key=value` override adds a "
                       f"key the run would never read)")


def arch_key_error(key: str, cfg: DictConfig) -> ConfigError:
    """An override of a model.arch key the model's config does not set (Hydra: "not in struct")."""
    import difflib

    arch, model = sorted(cfg.model.get("arch") or {}), cfg.model.get("name")
    if cfg.model.get("init") != "random" or not arch:
        return ConfigError(f"{key}: model {model} loads a checkpoint (model.init={cfg.model.get('init')}), whose "
                           f"shape is its config.json; model.arch shapes a model built with random weights")
    near = difflib.get_close_matches(key.removeprefix("model.arch."), arch, n=1, cutoff=0.6)
    hint = f"did you mean model.arch.{near[0]}? " if near else ""
    return ConfigError(f"{key} is not set by model {model}'s config; {hint}(its keys: {', '.join(arch)}; "
                       f"+{key}=... adds a field of its transformers config, checked when the model is built)")


def check_known_keys(cfg: DictConfig) -> None:
    """Every key is one the run reads; an unknown one is refused naming the nearest valid key."""
    extras = schema_extras(cfg)
    if extras:
        key, valid = extras[0]
        raise unknown_key(key, valid, f" (and {', '.join(k for k, _ in extras[1:])})" if len(extras) > 1 else "")


def schema_keys_beside(key: str, schema: type = RunSchema) -> list[str] | None:
    """The schema's keys at `key`'s level (`method.kk0`: method's), or None where that level is
    free-form (model.arch, task.*) or `key`'s parent is no section of the schema."""
    import typing

    *parents, _ = key.split(".")
    for name in parents:
        kind = typing.get_type_hints(schema).get(name)
        if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
            return None
        schema = kind
    prefix = "".join(f"{p}." for p in parents)
    return [prefix + f.name for f in dataclasses.fields(schema)]


def check_complete(cfg: DictConfig) -> None:
    broken: list[str] = []
    gaps = schema_gaps(cfg, broken=broken)
    if not gaps and not broken:  # the schema's keys, then the free-form ones (model.arch.*, task.*)
        try:
            OmegaConf.to_container(cfg, resolve=True)
        except InterpolationResolutionError as err:
            broken.append(f"{err.full_key}")
    if broken and not gaps:
        raise ConfigError(f"{', '.join(dict.fromkeys(broken))} refers to a key that has no value: give it a "
                          f"value, or an interpolation of an existing key")
    if gaps:
        groups = sorted({g.split(".")[0] for g in gaps if g.split(".")[0] in GROUPS})
        hint = "; ".join(f"choose {g}=<{', '.join(group_options(g))}>" for g in groups)
        raise ConfigError(f"{', '.join(gaps[:8])}{' ...' if len(gaps) > 8 else ''} has no value (deleted by a ~key "
                          f"override, or a group left empty): every key of the run's schema needs one; set it "
                          f"(null where the key allows it) instead of deleting it{'; ' + hint if hint else ''}")


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))


def composition_points(overrides: list[str]) -> list[list[str]]:
    """A sweep's overrides as points to compose: the first value of every swept key, then each other
    value of each key once (the sum of the values, not their product: what composition refuses is one
    value of one key)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType

    def values(o) -> list[str]:
        if not o.is_sweep_override():
            return [o.input_line]
        if o.value_type == ValueType.GLOB_CHOICE_SWEEP:  # model=glob(tiny_*): the group's options
            return [f"{o.get_key_element()}={v}" for v in o.value().filter(group_options(o.key_or_group))]
        return [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()]

    columns = [values(o) for o in OverridesParser.create().parse_overrides(overrides)]
    first = [col[0] for col in columns]
    return [first] + [first[:i] + [v] + first[i + 1:] for i, col in enumerate(columns) for v in col[1:]]


def hydra_message(err: Exception) -> str:
    """Hydra's and OmegaConf's message for a refused override on one line, without its internals
    (object_type, the config search path)."""
    chain = [err]
    while chain[-1].__cause__ is not None and len(chain) < 4:  # "Error merging override" holds why in its cause
        chain.append(chain[-1].__cause__)
    text = "\n".join(str(e) for e in chain).split("Config search path")[0]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(("object_type=", "reference_type=", "Set the environment"))]
    out: list[str] = []
    listing = False  # after "Available options in 'model':" Hydra writes one option a line
    for line in lines:
        if listing and " " not in line:
            out[-1] += (" " if out[-1].endswith(":") else ", ") + line
        else:
            out.append(line)
            listing = line.endswith(":")
    return "; ".join(out) or type(err).__name__


def point_label(point: list[str]) -> str:
    return ",".join(point) or "the defaults"


def check_composition(argv: list[str]) -> None:
    """Composes the configuration as Hydra will (a sweep's values each once), so that what Hydra would
    refuse with its own exit code 1 (a wrong type, an unknown key or group option) or with a traceback
    (a null group, a deleted key) fails here as a ConfigError, before Hydra makes any folder."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    args = get_args_parser().parse_args(argv)  # argparse refuses unknown flags itself (exit 2)
    if args.help or args.hydra_help or args.info or args.shell_completion or args.config_path or args.config_dir \
            or args.experimental_rerun:
        return
    overrides = [o for o in args.overrides if not o.lstrip("~+").startswith("hydra")]
    check_renamed([o.lstrip("~+").partition("=")[0] for o in overrides])
    for o in overrides:
        key, _, value = o.lstrip("+").partition("=")
        if key in GROUPS and any(v.strip() in ("null", "~", "") for v in value.split(",")):  # a sweep's too
            raise ConfigError(f"{o}: a run needs a {key}; choose one of: {', '.join(group_options(key))} (conf/{key}/)")
        if key in GROUPS and value.strip().startswith("["):  # Hydra would merge the options, the last winning
            raise ConfigError(f"{o}: a run takes one {key} (a list merges its options into one run, the last "
                              f"winning); to run each, sweep: python run.py -m {key}={value.strip()[1:-1]}")
        # conf/config.yaml's `optional experiment`: Hydra skips an option it cannot find, so a typo
        # would run the default configuration (a sweep function, glob(...), is Hydra's to expand)
        if key == "experiment" and "(" not in value:
            known = group_options(key)
            unknown = [v.strip() for v in value.split(",") if v.strip() not in ("null", "~", "", *known)]
            if unknown:
                raise ConfigError(f"experiment={unknown[0]} is not an experiment; choose one of: {', '.join(known)} "
                                  f"(conf/experiment/)")
    try:
        points = composition_points(overrides) if args.multirun else [overrides]
    except HydraException as err:
        raise ConfigError(f"cannot parse the overrides: {hydra_message(err)}") from None
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for point in points:
            try:
                cfg = compose(config_name=args.config_name or "config", overrides=point)
            except (HydraException, OmegaConfBaseException) as err:
                check_renamed(_error_keys(err), " (set in a config file the run composes: conf/experiment/, conf/task/, ...)")
                missing = _error_keys(err) if "Could not override" in str(err) or "not in" in str(err) else []
                valid = schema_keys_beside(missing[0]) if missing else None
                if valid is not None and missing[0] not in valid:  # Hydra's own hint (+key=) adds a key nothing reads
                    raise unknown_key(missing[0], valid) from None
                if missing and missing[0].startswith("model.arch."):  # free-form: the model's own keys
                    try:
                        without = compose(config_name=args.config_name or "config", overrides=[
                            o for o in point if not o.lstrip("~+").startswith("model.arch.")])
                    except (HydraException, OmegaConfBaseException):
                        without = None  # another override fails too: Hydra's message for this one
                    if without is not None:
                        raise arch_key_error(missing[0], without) from None
                raise ConfigError(hydra_message(err)) from None
            check_known_keys(cfg)
            check_complete(cfg)
            shaped = [o for o in point if o.lstrip("~+").startswith("model.arch.")]
            if shaped and cfg.model.get("init") != "random":
                raise ConfigError(f"{shaped[0]}: model.arch shapes a model built with random weights "
                                  f"(model.init=random); model {cfg.model.get('name')} loads a checkpoint, whose "
                                  f"shape is its config.json")
            if args.multirun:  # every point's ranges and rules now: Hydra would run the points before a bad one
                try:
                    build_config(cfg, ROOT / "outputs" / "_check", point_label(point))
                except ConfigError as err:
                    raise ConfigError(f"{err} (sweep point: {point_label(point)})") from None
        if args.multirun:  # an experiment's own sweep (hydra.sweeper.params) names keys too
            swept = compose(config_name=args.config_name or "config", overrides=points[0], return_hydra_config=True)
            check_renamed([str(k) for k in (swept.hydra.sweeper.get("params") or {})], " (in hydra.sweeper.params)")


def check_renamed(keys: list[str], where: str = "") -> None:
    """A key renamed or moved since (base/config.py RENAMED_KEYS) is refused, naming the new one; a
    deleted engine option (DELETED_KEYS), saying why it went."""
    for key in keys:
        if key in RENAMED_KEYS:
            raise ConfigError(f"{key} was renamed {RENAMED_KEYS[key]}{where}: write {RENAMED_KEYS[key]} instead")
        if key in DELETED_KEYS:
            raise ConfigError(f"{key}{where} was deleted after its A/B ({DELETED_KEYS[key]}; docs/engine.md, "
                              f"'The switches that remain'): drop it")


def _error_keys(err: BaseException) -> list[str]:
    """The full keys OmegaConf names in a composition error and the errors behind it."""
    keys, seen = [], [err]
    while seen[-1] is not None and len(seen) < 8:
        if getattr(seen[-1], "full_key", None):
            keys.append(str(seen[-1].full_key))
        seen.append(seen[-1].__cause__ or seen[-1].__context__)
    return keys


OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
HUB = ("huggingface.co", 443)
NETWORK_VARS = ("HF_ENDPOINT", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")  # a mirror or proxy


def reachable(address: tuple[str, int] = HUB, timeout: float = 1.5) -> bool:
    """Does a TCP connection to `address` open within `timeout` s (its name lookup included)?"""
    opened: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection(address, timeout=timeout).close()
            opened.append(True)
        except OSError:
            opened.append(False)

    thread = threading.Thread(target=probe, daemon=True)  # getaddrinfo has no timeout of its own
    thread.start()
    thread.join(timeout)
    return bool(opened and opened[0])


def go_offline_without_network() -> str | None:
    """The module doc's rule: set OFFLINE_VARS to 1 when none is set and no network is configured;
    returns the warning line to print, or None."""
    if any(v in os.environ for v in OFFLINE_VARS) or any(os.environ.get(v) for v in NETWORK_VARS):
        return None
    if reachable():
        return None
    for v in OFFLINE_VARS:
        os.environ[v] = "1"
    return (f"warning: {HUB[0]}:{HUB[1]} is not reachable, so this run is offline ({'=1, '.join(OFFLINE_VARS)}=1): "
            f"models, tokenizers and datasets come from local files and the cache; HF_HUB_OFFLINE=0 tries the Hub")


def redeliver_lost_interrupts() -> None:
    """Ctrl-C that lands while Python runs a finaliser (`__del__`, e.g. of a regex object lm-eval
    dropped) raises its KeyboardInterrupt there, where Python prints "Exception ignored" and drops
    it: the run went on to its end and the sweep to its next point, exit 0 (seen in
    tests/test_start_refusals.py). Such an interrupt is delivered again a moment later, from another
    thread, so that it is raised in the code the main thread runs then (not in this hook, where it
    would be dropped too)."""
    import _thread

    default = sys.unraisablehook

    def hook(unraisable) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            threading.Timer(0.05, _thread.interrupt_main).start()
            return
        default(unraisable)

    sys.unraisablehook = hook


if __name__ == "__main__":
    redeliver_lost_interrupts()
    try:
        check_launcher_env()
        check_command_line(sys.argv[1:])
        check_composition(sys.argv[1:])
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    os.environ.setdefault(STARTED_ENV, repr(time.time()))
    offline = go_offline_without_network()  # before anything imports huggingface_hub (it reads them once)
    if offline:
        print(offline, file=sys.stderr)
    try:
        main()
    except KeyboardInterrupt:  # outside a job (Hydra composing or launching): nothing was run
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except OSError as err:  # Hydra's own writes (multirun.yaml) on a full disk
        if err.errno not in DISK_ERRORS:
            raise
        print(f"error: {disk_message(err)}", file=sys.stderr)
        sys.exit(2)
