"""Read finished runs from outputs/ and the committed results/ into pandas. analysis/ only reads
outputs/ and results/, never runs or loads a model.

    from analysis.load import load
    data = load("outputs", "results")      # either may be missing
    data.outputs.runs                      # one row per finished run, keyed by AXES
    data.outputs.samples                   # one row per request (samples.jsonl), same keys
    data.results.points                    # committed per-seed aggregates, one row per (point, metric)

Every frame of run folders carries the config axes (AXES) of its run, so any two frames join on
`run` and filter on the same columns. The run-level file readers at the bottom (`reports`,
`runs_frame`, `metrics_frame`, `throughput_frame`) are the older per-experiment helpers the other
analysis scripts use.

What every reader here shares: a run is finished when its folder holds report.json (written last);
a folder without one is a killed or running run, skipped with a warning naming it (`finished`). A
report.json or samples.jsonl that does not parse is an error naming the file (`read_report`,
`read_jsonl`), never a traceback, and never skipped: report.json is written atomically, so a
damaged one belongs to a run the pipeline counts as finished (and skips on rerun); leaving it out
would silently change a point's seeds. Reports of older schemas are read with defaults.
"""
from __future__ import annotations

import collections
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import NoReturn

import pandas as pd
import yaml

from analysis.engines import engine_of

# The config axes a run is keyed by. `exp` is the sweep (exp_name), `variant` the method with the
# options that make it another rule (variant_label), `seed` the batching seed of an evaluation.
# `engine` the decode engine's fingerprint (analysis/engines.py), `admission` report.json's eval.admission
# (swept by the admission grids: scheduler.admission, eval.admission before issue 44).
AXES = ("exp", "run", "stage", "model", "pool", "method", "variant", "reassign", "k0", "coverage", "budget_split",
        "budget", "batch_size", "seed", "routing", "hardware", "engine", "admission")
# What makes two evaluate runs one measurement: a second run of the same key (dense swept over
# budgets it ignores, a rerun under another folder name) is not another seed.
RUN_KEY = ("exp", "model", "pool", "variant", "budget", "batch_size", "engine", "admission", "seed")
# Top-level config keys that never make two evaluate runs of one key (RUN_KEY) different
# measurements: where they are written, the budget dense ignores, and what only other stages read.
NOT_SETTINGS = frozenset({"exp_name", "outputs_dir", "artifacts_dir", "logger", "force", "allow_outside_outputs",
                          "budget", "stage", "throughput", "stream", "serve", "describe", "hydra"})
# Per-run tables of one evaluate run folder, by the name its frame has on RunSet.
RUN_TABLES = {"metrics": "metrics.csv", "selection": "selection.csv", "steps": "selection_steps.csv",
              "fidelity": "fidelity_steps.csv", "samples": "samples.jsonl"}
ROOT = Path(__file__).resolve().parents[1]


def variant_label(method: str, mc: dict) -> str:
    """The method with the options that make it another rule: base, base+similar,
    base@cov0.9, base+split, base_anchor(k0=1), base(shrink=auto); defaults leave the plain name."""
    label = method
    if mc.get("k0") is not None:
        label += f"(k0={mc['k0']})"
    if mc.get("shrink") is not None:
        label += f"(shrink={mc['shrink']})"
    if mc.get("reassign", "backfill") != "backfill":
        label += f"+{mc['reassign']}"
    if mc.get("budget_split", "uniform") != "uniform":
        label += "+split"
    if mc.get("coverage") is not None:
        label += f"@cov{mc['coverage']:g}"
    return label


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def command_line(doc: str, least: int, most: int | None = None) -> list[str]:
    """An analysis module's positional arguments (sys.argv[1:]): between `least` and `most` of them,
    else exit 2 with the usage lines of its doc (the indented `python -m ...` lines); -h prints them."""
    args = sys.argv[1:]
    usage = "\n".join(line.strip() for line in doc.splitlines() if line.strip().startswith("python -m "))
    if any(a in ("-h", "--help") for a in args):
        print(f"usage: {usage}")
        raise SystemExit(0)
    if not least <= len(args) <= (least if most is None else most):
        fail(f"expected {least if most in (None, least) else f'{least} to {most}'} arguments, got {len(args)}; "
             f"usage: {usage}")
    return args


def one_run_per_cell(df: pd.DataFrame, key: list[str], verb: str, example: Callable[[pd.Series], str],
                     advice: str) -> None:
    """Exit 2 where two run folders (column `_run`) give rows of one cell (`key`): a table would pool
    or set side by side what two runs measured as one run's. `example` names a row's cell."""
    twice = df.groupby(key, dropna=False)["_run"].transform("nunique") > 1
    if twice.any():
        fail(f"{df[twice].groupby(key, dropna=False).ngroups} cells are {verb} by more than one run folder (e.g. "
             f"{example(df[twice].iloc[0])}; folders: {', '.join(sorted(df.loc[twice, '_run'].unique()))}); {advice}")


def read_report(path: str | Path) -> dict:
    """One report.json; one that does not parse is an error naming it (see the module doc)."""
    try:
        rep = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        fail(f"{path} is not valid JSON ({e}); the run's report is damaged: rerun the run (force=true) or move "
             "its folder out of the tree read")
    if not isinstance(rep, dict):
        fail(f"{path} holds no JSON object; rerun the run (force=true) or move its folder out of the tree read")
    return rep


def read_jsonl(path: str | Path) -> pd.DataFrame:
    """One JSON record per line (samples.jsonl); a line that does not parse is an error naming the
    file and the line (a truncated file would otherwise lose its last requests or stop the reader)."""
    rows = []
    for i, line in enumerate(Path(path).read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            fail(f"{path} line {i} is not valid JSON ({e.msg}): the file is truncated or damaged; rerun the run "
                 "(force=true)")
    return pd.DataFrame(rows)


def finished(root: str | Path, name: str) -> list[Path]:
    """Every `name` file under root whose folder holds report.json. The others are a killed or
    running run's partial outputs (its `.<run>.partial-<pid>` folder, a run stopped midway):
    skipped, each folder named, so a partial file never joins a finished run's rows."""
    found = sorted(Path(root).rglob(name))
    partial = [p for p in found if not (p.parent / "report.json").exists()]
    for p in partial:
        warn(f"skipped {p.parent}: no report.json (a killed or unfinished run), so its {name} is partial")
    return [p for p in found if p not in partial]


def _config(run_dir: Path) -> dict:
    path = run_dir / "config.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def _exp_name(run_dir: Path, root: Path, config: dict | None = None) -> str:
    """exp_name from the run's config.yaml; else the top folder under root (outputs/<exp>/<run>)."""
    name = (_config(run_dir) if config is None else config).get("exp_name")
    if name:
        return str(name)
    rel = run_dir.relative_to(root).parts
    return rel[0] if len(rel) > 1 else root.name


def prompt_pool(ev: dict) -> str | None:
    """The prompts an evaluate run scored: its tasks and per-task limit ("mini@25"); runs of two
    pools are different measurements, never replicates (analysis/tables.py refuses to pool them)."""
    if not ev.get("tasks"):
        return None
    return ",".join(ev["tasks"]) + ("" if ev.get("limit") is None else f"@{ev['limit']}")


def run_axes(rep: dict, exp: str, run: str, config: dict | None = None) -> dict:
    """The AXES of one report.json (throughput reports hold many variants: theirs are per row);
    what an older report lacks is taken from its config.yaml where that holds it."""
    config = config or {}
    mc = rep.get("method_config") or {}
    ev = rep.get("eval") or {}
    return {"exp": exp, "run": run, "stage": rep.get("stage"), "model": rep.get("model"), "pool": prompt_pool(ev),
            "method": rep.get("method"), "variant": variant_label(rep.get("method", "?"), mc),
            "reassign": mc.get("reassign"), "k0": mc.get("k0"), "coverage": mc.get("coverage"),
            "budget_split": mc.get("budget_split"), "budget": rep.get("budget"),
            "batch_size": rep.get("batch_size", config.get("batch_size")),
            "seed": ev.get("batch_seed", rep.get("seed")), "routing": rep.get("routing", "uniform"),
            "hardware": rep.get("gpu") or rep.get("device"), "engine": engine_of(rep, config),
            "admission": ev.get("admission")}


def _flat(node: dict, prefix: str = "") -> dict[str, str]:
    """A config as {dotted key: value as text} (lists and nulls as JSON)."""
    out: dict[str, str] = {}
    for k, v in node.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, str) else json.dumps(v)
    return out


def settings(reps: list[dict]) -> list[str]:
    """Per run, what sets it apart from the runs of its key (RUN_KEY: model, prompt pool, variant,
    budget, batch size, engine, admission, seed) that hold another configuration: its values of the
    config keys (config.yaml, `_config`) whose values differ within the key, e.g.
    `predictor.ridge=1000`. "" where every run of its key has one configuration (repeats of one
    measurement, dense swept over budgets it ignores). A run is labelled only with the keys where it
    holds other than the given runs' most common value (the sweep's own configuration keeps "";
    where no value is most common, every run of the key names its own). A key only some runs
    record (added since) is no difference; NOT_SETTINGS never are."""
    flats = [{k: v for k, v in _flat(r.get("_config") or {}).items() if k.split(".")[0] not in NOT_SETTINGS}
             for r in reps]
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(reps):  # `_axes`: run_axes, set by whoever read the reports
        groups.setdefault(tuple(str(r["_axes"].get(k)) for k in RUN_KEY if k != "exp"), []).append(i)
    out = [""] * len(reps)
    for idx in groups.values():
        if len(idx) < 2:
            continue
        values: dict[str, set[str]] = {}
        for i in idx:
            for k, v in flats[i].items():
                values.setdefault(k, set()).add(v)
        varying = sorted(k for k, vs in values.items() if len(vs) > 1)
        common = {k: _most_common(flats, k) for k in varying}
        for i in idx:  # the keys where the run holds other than the sweep's most common value
            out[i] = ",".join(f"{k}={flats[i][k]}" for k in varying if k in flats[i] and flats[i][k] != common[k])
    return out


def _most_common(flats: list[dict[str, str]], key: str) -> str | None:
    """The value of `key` most runs hold (None on a tie)."""
    counts = collections.Counter(f[key] for f in flats if key in f).most_common(2)
    return counts[0][0] if counts and (len(counts) == 1 or counts[0][1] > counts[1][1]) else None


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    """Integer axes as nullable ints, so a missing budget (dense, adaptive) stays <NA>, not 6.0."""
    for col in ("budget", "batch_size", "seed", "k0"):
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("Int64")
    return df


def _run_table(name: str, rows: str) -> cached_property:
    """A RunSet property: RunSet.table(name) of every evaluate run, read once."""
    prop = cached_property(lambda self: self.table(name))
    prop.__doc__ = f"Every evaluate run's {RUN_TABLES[name]}: {rows}."
    return prop


class RunSet:
    """The finished runs (folders with report.json) under one root, as frames keyed by AXES.
    Frames are read on first use; `table(name, runs)` reads one per-run file for some runs only."""

    def __init__(self, root: str | Path | None) -> None:
        self.root = Path(root) if root is not None else None
        self.reports: list[dict] = []
        if self.root is None or not self.root.is_dir():
            return
        for path in sorted(self.root.rglob("report.json")):
            rep = read_report(path)
            run = str(path.parent.relative_to(self.root)) if path.parent != self.root else "."
            config = _config(path.parent)
            rep["_axes"] = run_axes(rep, _exp_name(path.parent, self.root, config), run, config)
            rep["_config"] = config
            self.reports.append(rep)
        by_exp: dict[str, list[dict]] = {}
        for rep in self.reports:
            rep["_setting"] = ""
            if rep.get("stage") == "evaluate":
                by_exp.setdefault(rep["_axes"]["exp"], []).append(rep)
        for reps in by_exp.values():
            for rep, setting in zip(reps, settings(reps)):
                rep["_setting"] = setting

    def __len__(self) -> int:
        return len(self.reports)

    def only(self, exps: list[str]) -> RunSet:
        """The runs of the named experiments (exp_name; `sweep` names `sweep[...]` too): what a report
        of some sweeps reads, so that another experiment's runs can neither join nor stop it."""
        kept = RunSet(None)
        kept.root = self.root
        kept.reports = [rep for rep in self.reports
                        if rep["_axes"]["exp"] in exps or rep["_axes"]["exp"].split("[")[0] in exps]
        return kept

    @cached_property
    def runs(self) -> pd.DataFrame:
        """One row per finished run: AXES, its `setting` (what else its sweep varied: `settings`), the
        summary (accuracy, kept_mean, kl, ...), size and wall time."""
        rows = [{**rep["_axes"], "setting": rep["_setting"],
                 **{k: rep.get(k) for k in ("num_experts", "moe_layers", "top_k", "wall_s", "reused_from")},
                 **(rep.get("summary") or {})} for rep in self.reports]
        return _typed(pd.DataFrame(rows, columns=None if rows else list(AXES)))

    @cached_property
    def evaluations(self) -> pd.DataFrame:
        """The evaluate runs, one per RUN_KEY and setting: of runs that are one measurement the
        first (by folder) is kept, and the others named in a warning."""
        ev = self.runs[self.runs["stage"] == "evaluate"] if len(self.runs) else self.runs
        if ev.empty:
            return ev
        key = [*RUN_KEY, "setting"]  # missing values (no budget, no pool) compare equal

        def words(r: pd.Series) -> tuple[str, str, str]:
            setting = f", {r['setting']}" if r["setting"] else ""
            shared = (f"model {r['model']}, tasks {r['pool']}, {r['variant']}, budget {r['budget']}, "
                      f"engine {r['engine']}, seed {r['seed']}{setting}")
            return f"{r['exp']}: ", shared, "counted once"

        return once_per_measurement(ev, key, words)

    def table(self, name: str, runs: pd.DataFrame | None = None) -> pd.DataFrame:
        """One per-run file (a RUN_TABLES key or a file name) of the given runs (default: every
        evaluate run, a repeated measurement once), its rows prefixed with their run's AXES; runs
        without the file are skipped."""
        fname = RUN_TABLES.get(name, name)
        runs = self.evaluations if runs is None else runs
        frames = []
        for _, r in runs.iterrows():
            path = self.root / r["run"] / fname
            if not path.exists():
                continue
            df = read_jsonl(path) if fname.endswith(".jsonl") else pd.read_csv(path)
            axes = r[list(AXES)].to_dict()
            frames.append(df.assign(**axes)[[*AXES, *[c for c in df.columns if c not in axes]]])
        return _typed(pd.concat(frames, ignore_index=True)) if frames else pd.DataFrame(columns=list(AXES))

    metrics = _run_table("metrics", "one row per metric (task, kind, metric, filter, value, stderr, n)")
    selection = _run_table("selection", "one row per MoE layer")
    steps = _run_table("steps", "one row per (layer, decode step)")
    samples = _run_table("samples", "one row per request (task, doc_id, prompt_hash, correct, ...)")

    @cached_property
    def throughput(self) -> pd.DataFrame:
        """One row per timed configuration of every throughput run: the run's AXES (its variant,
        budget and batch size replaced by the row's) and the row (mode, ms_per_step, tokens_per_s,
        speedup_vs_dense, union_mean, kept_mean, ...), with the model's expert count."""
        rows = []
        for rep in self.reports:
            for r in rep.get("throughput") or []:
                # rows before the engine-based sweep (6a65cac) name no variant and no timing mode
                rows.append({**rep["_axes"], "num_experts": rep.get("num_experts"), "variant": r.get("method"),
                             "mode": None, **r})
        return _typed(pd.DataFrame(rows))

    @cached_property
    def predictor(self) -> pd.DataFrame:
        """Held-out R² per (model, layer): fit runs' predictor.csv; models with no fit run here take
        the R² their evaluate/throughput reports carry (artifacts: no within-expert R²)."""
        frames = []
        for rep in self.reports:
            path = self.root / rep["_axes"]["run"] / "predictor.csv"
            if rep.get("stage") == "fit" and path.exists():
                frames.append(pd.read_csv(path).assign(model=rep.get("model"), source=rep["_axes"]["exp"]))
        have = {f["model"].iloc[0] for f in frames}
        for rep in self.reports:
            arts = [rep.get("artifacts") or {}] + list((rep.get("artifacts_by_method") or {}).values())
            r2 = next((a["predictor_r2"] for a in arts if a.get("predictor_r2")), None)
            if r2 and rep.get("model") not in have:
                have.add(rep["model"])
                frames.append(pd.DataFrame({"layer": range(len(r2)), "r2": r2, "model": rep["model"],
                                            "source": rep["_axes"]["exp"]}))
        cols = ["model", "layer", "r2", "r2_within", "source"]
        return pd.concat(frames, ignore_index=True).reindex(columns=cols) if frames else pd.DataFrame(columns=cols)


# ---- committed results/ ------------------------------------------------------------------------
def _models() -> list[str]:
    return sorted((p.stem for p in (ROOT / "conf" / "model").glob("*.yaml")), key=len, reverse=True)


def model_of(exp: str) -> str:
    """The model an experiment name holds as a word (ablation_mini_olmoe -> mini_olmoe,
    quality_seeds_mini_continuous -> mini), the longest name first."""
    return next((m for m in _models() if f"_{m}_" in f"_{exp}_"), exp.split("_", 1)[-1])


def experiment_setting(exp: str, key: str):
    """A top-level setting of conf/experiment/<exp>.yaml, else conf/config.yaml's default: the
    committed aggregates do not repeat settings every run of a sweep shares (batch size)."""
    for path in (ROOT / "conf" / "experiment" / f"{exp}.yaml", ROOT / "conf" / "config.yaml"):
        if path.exists():
            value = (yaml.safe_load(path.read_text()) or {}).get(key)
            if value is not None:
                return value
    return None


@dataclass
class Results:
    """The committed results/ tree as frames:
    runs        per-run quality tables (results/<exp>.csv with a `variant` column): AXES subset + summary
    points      per-seed aggregates (results/<exp>.csv with metric/mean/low/high/seeds):
                exp, model, variant, budget, batch_size, metric, mean, low, high, n (seeds)
    paired      results/<exp>_paired.csv: each variant minus base, paired, with its call
    predictor   results/<exp>_predictor_r2.csv: model, layer, r2, r2_within
    routing     results/routing/**/routing_stats.csv, the per-model mean row: model, experts, union_<b>
    throughput  results/throughput/runs/ as a RunSet (its .throughput frame)
    """
    root: Path | None
    runs: pd.DataFrame = field(default_factory=pd.DataFrame)
    points: pd.DataFrame = field(default_factory=pd.DataFrame)
    paired: pd.DataFrame = field(default_factory=pd.DataFrame)
    predictor: pd.DataFrame = field(default_factory=pd.DataFrame)
    routing: pd.DataFrame = field(default_factory=pd.DataFrame)
    throughput: RunSet | None = None


def load_results(root: str | Path | None = "results") -> Results:
    """The committed tables under root (None or a missing folder: every frame empty)."""
    root = Path(root) if root is not None else None
    out = Results(root=root, throughput=RunSet(root / "throughput" / "runs" if root else None))
    present = root is not None and root.is_dir()
    runs, points, paired, pred = [], [], [], []
    for path in sorted(root.glob("*.csv")) if present else []:
        if path.stat().st_size <= 1:  # an empty table (e.g. a one-model family's interaction tests)
            continue
        name = path.stem
        if name.endswith("_predictor_r2"):
            exp = name.removesuffix("_predictor_r2")
            pred.append(pd.read_csv(path).assign(model=model_of(exp), source=exp))
            continue
        if name.endswith("_paired"):
            exp = name.removesuffix("_paired")
            paired.append(pd.read_csv(path).rename(columns={"method": "variant"}).assign(exp=exp, model=model_of(exp)))
            continue
        df = pd.read_csv(path)
        batch = experiment_setting(name, "batch_size")
        if {"metric", "mean", "low", "high", "seeds"} <= set(df.columns):
            points.append(df.rename(columns={"method": "variant", "seeds": "n"})
                          .assign(exp=name, model=model_of(name), batch_size=batch))
        elif {"variant", "accuracy"} <= set(df.columns):
            df = df.rename(columns={"batch_seed": "seed"})
            if "batch_size" not in df:
                df["batch_size"] = batch
            runs.append(df.assign(exp=name, model=model_of(name), stage="evaluate", run=[f"{name}:{i}" for i in
                                                                                          range(len(df))]))
    out.runs = _typed(pd.concat(runs, ignore_index=True)) if runs else pd.DataFrame(columns=list(AXES))
    cols = ["exp", "model", "variant", "budget", "batch_size", "metric", "mean", "low", "high", "n"]
    out.points = _typed(pd.concat(points, ignore_index=True)[cols]) if points else pd.DataFrame(columns=cols)
    out.paired = _typed(pd.concat(paired, ignore_index=True)) if paired else pd.DataFrame()
    out.predictor = (pd.concat(pred, ignore_index=True) if pred
                     else pd.DataFrame(columns=["model", "layer", "r2", "r2_within", "source"]))
    stats = []
    for path in sorted(root.glob("routing/**/routing_stats.csv")) if present else []:
        df = pd.read_csv(path, comment="#")
        stats.append(df[df["layer"].astype(str) == "mean"].assign(source=str(path.parent.relative_to(root))))
    out.routing = pd.concat(stats, ignore_index=True) if stats else pd.DataFrame()
    return out


@dataclass
class Data:
    """What load() found: a RunSet of outputs/ and the committed Results (either may be empty)."""
    outputs: RunSet
    results: Results


def load(outputs: str | Path | None = "outputs", results: str | Path | None = "results") -> Data:
    """The loader every figure and the notebook start from; None (or a missing folder) = nothing there."""
    return Data(outputs=RunSet(outputs), results=load_results(results))


# ---- per-experiment helpers (analysis.quality, analysis.compare) ------------------------------
def reports(root: str | Path) -> list[dict]:
    """Every finished run (a folder with report.json) under root, with its folder as `run` and its
    config.yaml as `_config`."""
    out = []
    for path in sorted(Path(root).rglob("report.json")):
        rep = read_report(path)
        rep["run"] = str(path.parent.relative_to(root)) if path.parent != Path(root) else "."
        rep["_config"] = _config(path.parent)
        out.append(rep)
    return out


def runs_frame(root: str | Path) -> pd.DataFrame:
    """One row per finished evaluate run: its key (model, tasks: the prompt pool, variant, budget,
    batch size, engine, admission, batching seed), its setting (what else the runs under root
    differ in: `settings`), method options, and the selection summary."""
    rows = []
    evals = [rep for rep in reports(root) if rep.get("stage") == "evaluate"]
    for rep in evals:
        rep["_axes"] = run_axes(rep, "", rep["run"], rep["_config"])
    for rep, setting in zip(evals, settings(evals)):
        mc = rep.get("method_config") or {}
        axes = rep["_axes"]
        rows.append({"run": rep["run"], "model": axes["model"], "tasks": axes["pool"], "method": axes["method"],
                     "variant": axes["variant"], "budget": axes["budget"], "batch_size": axes["batch_size"],
                     "engine": axes["engine"], "admission": axes["admission"], "routing": axes["routing"],
                     "reassign": mc.get("reassign"), "k0": mc.get("k0"), "order": (rep.get("eval") or {}).get("order"),
                     "batch_seed": axes["seed"], "setting": setting, "reused_from": rep.get("reused_from"),
                     **(rep.get("summary") or {})})
    return pd.DataFrame(rows)


def once_per_measurement(runs: pd.DataFrame, key: list[str],
                         words: Callable[[pd.Series], tuple[str, str, str]]) -> pd.DataFrame:
    """`runs` with one row per `key` (the first by folder): the others are the same measurement
    again, named in a warning, `words(first row)` giving its prefix, what they share and what
    happens to them; a run's copies (copies_of_one) are one measurement without a warning."""
    for _, g in runs[runs.duplicated(key, keep=False)].groupby(key, dropna=False, sort=True):
        if copies_of_one(g["run"].tolist(), g["reused_from"].tolist()):
            continue  # dense's copies in a sweep over budgets: one decode, nothing to warn of
        first, *others = g["run"].tolist()
        prefix, shared, fate = words(g.iloc[0])
        warn(f"{prefix}{', '.join(others)} {'is' if len(others) == 1 else 'are'} the same measurement as {first} "
             f"({shared}): {fate}")
    return runs[~runs.duplicated(key, keep="first")]


def copies_of_one(runs: list[str], reused_from: list) -> bool:
    """Are these runs one measurement and its copies (`reused_from` naming another of them:
    base/run/dense_reuse.py, a dense sweep point that took a sibling's outputs), not the same
    measurement made again?"""
    names = {Path(r).name for r in runs}
    copies = [src for src in reused_from if isinstance(src, str)]
    return len(copies) == len(runs) - 1 and all(src in names for src in copies)


def metrics_frame(root: str | Path) -> pd.DataFrame:
    """One row per (run, task, metric) from each run's metrics.csv."""
    frames = []
    for rep in reports(root):
        csv = Path(root) / rep["run"] / "metrics.csv"
        if rep.get("stage") == "evaluate" and csv.exists():
            df = pd.read_csv(csv)
            df.insert(0, "run", rep["run"])
            df.insert(1, "method", rep.get("method"))
            df.insert(2, "budget", rep.get("budget"))
            frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def throughput_frame(root: str | Path) -> pd.DataFrame:
    """One row per timed configuration of every throughput run under root, with its run's folder,
    model, routing, engine fingerprint and device."""
    rows = []
    for rep in reports(root):
        for r in rep.get("throughput") or []:
            rows.append({"run": rep["run"], "model": rep.get("model"), "routing": rep.get("routing", "uniform"),
                         "timed_engine": engine_of(rep, rep["_config"]), "timed_on": rep.get("gpu") or rep.get("device"),
                         **r})
    return pd.DataFrame(rows)
