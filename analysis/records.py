"""Per-prompt records of a grid: what every paired call of its tables is computed from, in one
compressed file per grid, so the calls can be re-derived from the repository (issue 27).

    python -m analysis.records write outputs/rules_mini results/records/rules_mini
    python -m analysis.records check results/records/rules_mini results/rules_mini_paired.csv

`write` reads the evaluate runs of one grid folder (report.json, samples.jsonl, selection_steps.csv)
and writes two gzip CSV files (byte-reproducible: no time stamp):

  <dest>.csv.gz          one row per (run, prompt), sorted by prompt, then run:
      model, tasks, limit          the prompt pool (one per grid)
      method                       the rule with its options (analysis.load.variant_label)
      budget                       kept experts per layer and step (empty: dense, oea, coverage)
      seed                         the batching seed (eval.seed)
      batching, admission          static | continuous; fifo | union
      engine                       the decode engine (analysis/engines.py; one per file: files written
                                   before it existed get their grid's from engines.LEGACY_GRIDS)
      task, doc_id, prompt_hash    the prompt
      correct                      1 right, 0 wrong (lm-eval's metric)
      prompt_tokens, new_tokens, decode_batch
      fidelity_tokens, kl_sum, dll_sum, agree_sum   eval.fidelity=true: the prompt's scored tokens and
                                   its sums of KL(dense || budgeted), log-likelihood change, top-1 agreement
  <dest>.batches.csv.gz  eval.fidelity=true, static batches: one row per (run, decode batch, layer):
      method, budget, seed, batching, admission, decode_batch, layer,
      energy_kept, energy_total, out_err, out_dense   the sums behind retained energy and output error

`write` refuses a destination that holds another grid's records (another model, prompt pool, grid
name or engine), or committed records it would change, unless `--force`.
`same` compares the runs of a folder with a records file, prompt by prompt (correct, token counts,
decode batch): where every field is identical, a grid made on an older engine is shown to give
the same outputs on the engine that made the folder.
`check` re-derives the paired table from a records file (analysis.ablation.paired_from_records,
the function `python -m analysis.ablation` itself uses) and reports every committed row whose
difference, p-value or call it does not give. `read` loads a records file back into frames.
Reads outputs/ and results/ only.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import subprocess

import numpy as np
import pandas as pd
import yaml

from analysis.engines import LEGACY_GRIDS, engine_of
from analysis.load import variant_label

RUN = ["method", "budget", "seed", "batching", "admission"]  # what tells the runs of one grid apart
POOL = ["model", "tasks", "limit", "engine"]  # what makes two runs score the same prompts, the same way
PROMPT = ["task", "doc_id"]
PROMPT_FIELDS = ["prompt_hash", "correct", "prompt_tokens", "new_tokens", "decode_batch", "fidelity_tokens", "kl_sum",
                 "dll_sum", "agree_sum"]
BATCH_FIELDS = ["energy_kept", "energy_total", "out_err", "out_dense"]
SUMS = ["fidelity_tokens", "kl_sum", "dll_sum", "agree_sum"]  # added over seeds per prompt
GZIP = {"method": "gzip", "mtime": 0}  # the same bytes for the same records


def runs(root: str | Path, summary: tuple[str, ...] = ()) -> pd.DataFrame:
    """One row per finished evaluate run under root: RUN and POOL keys, its folder (`dir`) and the
    `summary` metrics of its report.json."""
    rows = []
    for path in sorted(Path(root).rglob("report.json")):
        rep = json.loads(path.read_text())
        if rep.get("stage") != "evaluate":
            continue
        ev = rep.get("eval", {})
        config_path = path.parent / "config.yaml"
        config = (yaml.safe_load(config_path.read_text()) or {}) if config_path.exists() else {}
        # reports from before eval.admission was recorded: the run's overrides name it
        admission = ev.get("admission") or ("union" if "eval.admission=union" in rep.get("overrides", "") else "fifo")
        rows.append({"method": variant_label(rep["method"], rep.get("method_config", {})), "budget": rep["budget"],
                     "seed": ev.get("batch_seed", rep.get("seed")), "batching": ev.get("batching", "static"),
                     "admission": admission, "model": rep.get("model"), "tasks": ",".join(ev.get("tasks") or []),
                     "limit": ev.get("limit"), "engine": engine_of(rep, config),
                     "grid": config.get("exp_name") or path.parent.parent.name, "dir": str(path.parent),
                     "decode": rep.get("reused_from") or path.parent.name,  # a copy names the run that decoded
                     **{m: rep.get("summary", {}).get(m) for m in summary}})
    if not rows:
        raise SystemExit(f"error: no finished evaluate runs under {root}")
    df = pd.DataFrame(rows)
    df["budget"] = df["budget"].astype("Int64")
    return df


def batch_sums(run_dir: str | Path) -> pd.DataFrame | None:
    """Per (decode batch, layer) of one run: the sums behind energy_retained and out_error.

    selection_steps.csv numbers decode steps across the run; a static batch takes as many steps as
    its longest request (samples.jsonl: new_tokens - 1, the first token coming from the prefill),
    so the batches' step ranges follow from the requests. None when they do not add up (continuous
    batching has no fixed batches) or the run kept no such sums."""
    path, samples = Path(run_dir) / "selection_steps.csv", _samples(run_dir)
    if not path.exists() or not {"decode_batch", "new_tokens"} <= set(samples.columns):
        return None
    st = pd.read_csv(path)
    st = st[st["decode"].astype(bool)]
    if not set(BATCH_FIELDS) <= set(st.columns):
        return None
    per_batch = (samples.groupby("decode_batch")["new_tokens"].max() - 1).clip(lower=0).sort_index()
    steps = np.sort(st["step"].unique())
    if per_batch.sum() != len(steps):
        return None
    batch_of_step = pd.Series(np.repeat(per_batch.index.to_numpy(), per_batch.to_numpy()), index=steps)
    sums = st.assign(decode_batch=st["step"].map(batch_of_step)).groupby(["decode_batch", "layer"])[BATCH_FIELDS].sum()
    return sums.reset_index()


def _samples(run_dir: str | Path) -> pd.DataFrame:
    return pd.read_json(Path(run_dir) / "samples.jsonl", lines=True)


def of_runs(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(prompts, batches) records of the runs of `df` (runs()), in the files' order and columns."""
    prompts, batches = [], []
    for _, r in df.iterrows():
        keys = {k: r[k] for k in [*RUN, *POOL]}
        s = _samples(r["dir"])
        prompts.append(s.reindex(columns=[*PROMPT, *PROMPT_FIELDS]).assign(**keys))
        b = batch_sums(r["dir"])
        if b is not None:
            batches.append(b.assign(**{k: r[k] for k in RUN}))
    p = pd.concat(prompts, ignore_index=True)[[*POOL, *RUN, *PROMPT, *PROMPT_FIELDS]]
    b = (pd.concat(batches, ignore_index=True) if batches
         else pd.DataFrame(columns=["decode_batch", "layer", *BATCH_FIELDS]))
    b = b.reindex(columns=[*RUN, "decode_batch", "layer", *BATCH_FIELDS])
    return _typed(_order(p, [*PROMPT, *RUN])), _typed(_order(b, [*RUN, "decode_batch", "layer"]))


def _order(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    key = lambda c: c.astype("string").fillna("") if c.name in ("method", "batching", "admission", "task") else c
    return df.sort_values(by, key=key, kind="stable", na_position="first").reset_index(drop=True)


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    for col in ("budget", "seed", "doc_id", "decode_batch", "layer", "limit"):
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("Int64")
    return df


def paths(dest: str | Path) -> tuple[Path, Path]:
    """The two files of a records destination (with or without its .csv.gz suffix)."""
    base = str(dest).removesuffix(".csv.gz")
    return Path(base + ".csv.gz"), Path(base + ".batches.csv.gz")


def _refuse(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _committed(path: Path) -> bool:
    """Whether git tracks `path` (a committed file)."""
    try:
        return subprocess.run(["git", "ls-files", "--error-unmatch", str(path.resolve())], cwd=path.resolve().parent,
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def one_per_cell(df: pd.DataFrame, root: str | Path) -> pd.DataFrame:
    """One run per RUN key: runs that are one decode (a dense or oea sweep point copied from another,
    report.json reused_from) are kept once; two measurements of one key (a rerun's kept-aside
    `<run>~<hash>` folder of another config, a repeat) are refused: their rows could not be told apart."""
    df = df.drop_duplicates([*RUN, "decode"]).reset_index(drop=True)
    twice = df[df.duplicated(RUN, keep=False)]
    if len(twice):
        cell = twice.iloc[0]
        _refuse(f"{root} holds {len(twice)} runs of {len(twice.drop_duplicates(RUN))} cells measured more than once "
                f"(e.g. {cell['method']} at budget {cell['budget']}, seed {cell['seed']}: "
                f"{', '.join(sorted(Path(d).name for d in twice.loc[(twice[RUN] == cell[RUN]).all(axis=1), 'dir']))}"
                f"): one records file holds one run per cell; move the others (a kept-aside `~` folder) out")
    return df


def write(root: str | Path, dest: str | Path, force: bool = False) -> tuple[Path, Path]:
    """Records of the grid under `root` -> <dest>.csv.gz and <dest>.batches.csv.gz. Refuses a folder
    mixing prompt pools or engines (one grid is one model on one prompt pool, decoded one way), and,
    unless `force`, a destination holding another grid's records or committed records it would change."""
    df = runs(root)
    pools = df[POOL].astype(str).drop_duplicates()
    if len(pools) > 1:
        _refuse(f"{root} holds runs of {len(pools)} prompt pools, models or engines "
                f"({'; '.join(' '.join(map(str, r)) for r in pools.itertuples(index=False))}): one records file is one grid")
    df = one_per_cell(df, root)
    prompts, batches = of_runs(df)
    p, b = paths(dest)
    grid = str(df["grid"].iloc[0])
    if p.exists() and not force:
        old, _ = read(dest)
        name = p.name.removesuffix(".csv.gz")
        if name != grid:
            _refuse(f"{p} is grid {name!r}'s records; {root} holds grid {grid!r}: another destination, or --force")
        for key in POOL:
            before, after = sorted(old[key].astype(str).unique()), sorted(prompts[key].astype(str).unique())
            if before != after:
                _refuse(f"{p} holds records of {key} {', '.join(before)}; {root}'s runs have {', '.join(after)}: "
                        f"replacing them needs --force")
        new_bytes = prompts.to_csv(index=False).encode()
        if _committed(p) and pd.read_csv(p, compression="gzip").to_csv(index=False).encode() != new_bytes:
            _refuse(f"{p} is committed and these records differ from it: --force replaces it "
                    f"(check first: `python -m analysis.records check {dest} <paired table>`)")
    p.parent.mkdir(parents=True, exist_ok=True)
    prompts.to_csv(p, index=False, compression=GZIP)
    batches.to_csv(b, index=False, compression=GZIP)
    return p, b


def read(dest: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(prompts, batches) of a records file; batches empty where the grid has none."""
    p, b = paths(dest)
    if not p.exists():
        raise SystemExit(f"error: {p} is missing: write it with `python -m analysis.records write <grid folder> {dest}`")
    str_cols = {"prompt_hash": "string", "task": "string", "method": "string", "batching": "string",
                "admission": "string", "model": "string", "tasks": "string", "engine": "string"}
    prompts = _typed(pd.read_csv(p, dtype=str_cols))
    if "engine" not in prompts:  # written before engines were recorded: the grid's, as committed
        name = p.name.removesuffix(".csv.gz")
        prompts.insert(prompts.columns.get_loc("limit") + 1, "engine", LEGACY_GRIDS.get(name, "unknown"))
        prompts["engine"] = prompts["engine"].astype("string")
    batches = _typed(pd.read_csv(b, dtype=str_cols)) if b.exists() else pd.DataFrame(columns=[*RUN, "decode_batch",
                                                                                            "layer", *BATCH_FIELDS])
    return prompts, batches


# ---- from records to the quantities a comparison needs ------------------------------------------

def at_point(frame: pd.DataFrame, method: str, budget, seeds) -> pd.DataFrame:
    """The rows of one (method, budget) over `seeds` (budget None or NA: no budget)."""
    same_budget = frame["budget"].isna() if pd.isna(budget) else frame["budget"] == budget
    return frame[(frame["method"] == method) & same_budget.fillna(False) & frame["seed"].isin(list(seeds))]


def per_prompt(frame: pd.DataFrame) -> pd.DataFrame:
    """Per prompt over the runs (seeds) of one point: correct averaged, fidelity sums added."""
    sums = [c for c in SUMS if c in frame and frame[c].notna().any()]
    agg = {"correct": "mean", "prompt_hash": "first", **{c: "sum" for c in sums}}
    return frame.groupby(PROMPT).agg(agg)


def batch_arrays(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per (seed, decode batch) and layer, (P, L) arrays of the BATCH_FIELDS sums and the (seed,
    batch) keys; empty when the point has no batch sums."""
    if frame.empty:
        return {}
    out = {"keys": []} | {k: [] for k in BATCH_FIELDS}
    for seed, g in frame.groupby("seed", sort=True):
        wide = g.set_index(["decode_batch", "layer"])[BATCH_FIELDS].astype(float).unstack("layer").fillna(0.0)
        wide = wide.sort_index()
        out["keys"] += [(seed, b) for b in wide.index]
        for k in BATCH_FIELDS:
            out[k].append(wide[k].to_numpy())
    return {"keys": np.array(out["keys"]), **{k: np.concatenate(out[k]) for k in BATCH_FIELDS}}


def check(dest: str | Path, paired_csv: str | Path, atol: float = 1e-9) -> list[str]:
    """Every row of a committed paired table that the records do not re-derive (diff, p, call)."""
    from analysis.ablation import paired_from_records

    prompts, batches = read(dest)
    derived = paired_from_records(prompts, batches).set_index(["method", "budget", "metric"])
    committed = pd.read_csv(paired_csv)
    committed["budget"] = committed["budget"].astype("Int64")
    failures = []
    for _, r in committed.iterrows():
        key = (r["method"], r["budget"], r["metric"])
        if key not in derived.index:
            failures.append(f"{key}: not in the records")
            continue
        d = derived.loc[key]
        for col in ("diff", "p"):
            if not np.isclose(d[col], r[col], rtol=0, atol=atol, equal_nan=True):
                failures.append(f"{key}: {col} {r[col]!r} committed, {d[col]!r} from the records")
        if d["call"] != r["call"]:
            failures.append(f"{key}: call {r['call']!r} committed, {d['call']!r} from the records")
    return failures


def same(root: str | Path, dest: str | Path) -> list[str]:
    """The differences between the runs under `root` and the same (method, budget, seed, batching,
    admission) in a records file, per prompt and field; [] where every run is identical."""
    new, _ = of_runs(runs(root))
    old, _ = read(dest)
    keys = [k for k in RUN if k in old]
    fields = ["correct", "prompt_tokens", "new_tokens", "decode_batch"]
    failures = []
    for point, mine in new.groupby(keys, dropna=False):
        at = pd.Series(True, index=old.index)
        for k, v in zip(keys, point):
            at &= old[k].isna() if pd.isna(v) else (old[k] == v)
        theirs = old[at.fillna(False)]
        label = ", ".join(f"{k}={v}" for k, v in zip(keys, point))
        if theirs.empty:
            failures.append(f"{label}: not in {dest}")
            continue
        a = mine.set_index(PROMPT)[fields].sort_index()
        b = theirs.set_index(PROMPT)[fields].sort_index()
        if not a.index.equals(b.index):
            failures.append(f"{label}: {len(a)} prompts here, {len(b)} in the records, not the same prompts")
            continue
        for f in fields:
            differ = ~((a[f] == b[f]) | (a[f].isna() & b[f].isna()))
            if differ.any():
                failures.append(f"{label}: {f} differs on {int(differ.sum())} of {len(a)} prompts")
        if not any(x.startswith(label) for x in failures):
            print(f"{label}: identical on all {len(a)} prompts ({mine['engine'].iloc[0]} here, "
                  f"{theirs['engine'].iloc[0]} in {dest})")
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="records of a grid folder -> <dest>.csv.gz and <dest>.batches.csv.gz")
    w.add_argument("root")
    w.add_argument("dest")
    w.add_argument("--force", action="store_true", help="replace another grid's or committed records")
    sm = sub.add_parser("same", help="are a folder's runs identical, prompt by prompt, to a records file's?")
    sm.add_argument("root")
    sm.add_argument("dest")
    c = sub.add_parser("check", help="re-derive a committed paired table from a records file")
    c.add_argument("dest")
    c.add_argument("paired_csv")
    args = ap.parse_args(argv)
    if args.cmd == "write":
        for path in write(args.root, args.dest, args.force):
            print(f"wrote {path}")
        return 0
    if args.cmd == "same":
        failures = same(args.root, args.dest)
        for f in failures:
            print(f)
        return 1 if failures else 0
    failures = check(args.dest, args.paired_csv)
    for f in failures:
        print(f)
    print(f"{args.paired_csv}: {len(failures)} disagreement{'s' if len(failures) != 1 else ''} with {args.dest}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
