"""Run the points of one or more experiment sweeps as separate processes, N at a time, on one host.

    python -m experiments.run_points --jobs 16 quality_seeds_mini quality_seeds_mini_olmoe \
        --extra "method=dense budget=null" --extra "method=oea method.k0=1,2 budget=null"

Each point runs as its own one-point multirun, `python run.py -m experiment=E <point>`, with one
torch thread, so it lands in the folder, sweep summary and config hash the plain multirun
(`python run.py -m experiment=E`) gives it, and a finished point is skipped on a rerun. Hydra's
basic launcher runs a sweep's points one after another; this spreads the points of several sweeps
over a host's cores from one queue (the quality grids, 62 points of one to three minutes each,
on the 16 cores of a GPU host). The points of a sweep are the product of its experiment's
`hydra.sweeper.params`; each `--extra` is another sweep of the same experiment, as the Makefile's
dense and oea lines are (its keys replace the grid's, the rest of the grid stays).
Exit status: 0 when every point finished (or was finished before), 1 otherwise.
"""
from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def sweep_params(experiment: str) -> dict[str, str]:
    """The experiment's `hydra.sweeper.params`, key -> comma list, as composed by Hydra."""
    import run  # noqa: F401  (registers the typed schema the primary config names)

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=[f"experiment={experiment}"], return_hydra_config=True)
    return {str(k): str(v) for k, v in (cfg.hydra.sweeper.params or {}).items()}


def expand(params: dict[str, str]) -> list[list[str]]:
    """Every point of a grid: the product of the comma lists, as `key=value` overrides."""
    keys = list(params)
    values = [params[k].split(",") for k in keys]
    return [[f"{k}={v.strip()}" for k, v in zip(keys, combo)] for combo in itertools.product(*values)]


def parse_extra(text: str) -> dict[str, str]:
    out = {}
    for item in text.split():
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise SystemExit(f"error: --extra {text!r}: each item must be key=value (a comma list sweeps), got {item!r}")
        out[key] = value
    return out


def points(experiment: str, extras: list[str]) -> list[list[str]]:
    """The grid's points, then each extra sweep's (its keys replace the grid's)."""
    grid = sweep_params(experiment)
    sweeps = [grid] + [{**grid, **parse_extra(e)} for e in extras]
    seen, out = set(), []
    for sweep in sweeps:
        for point in expand(sweep):
            key = tuple(sorted(point))
            if key not in seen:
                seen.add(key)
                out.append(point)
    return out


def run_point(experiment: str, point: list[str], log_dir: Path) -> tuple[str, int, float]:
    name = f"{experiment}:" + ",".join(sorted(point))
    log = log_dir / (experiment + "__" + "_".join(sorted(point)).replace("/", "_") + ".log")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    t0 = time.time()
    with open(log, "w") as fh:
        rc = subprocess.call([sys.executable, "run.py", "-m", f"experiment={experiment}", *point],
                             cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
    return name, rc, time.time() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("experiments", nargs="+", help="names under conf/experiment/")
    ap.add_argument("--extra", action="append", default=[],
                    help='another sweep of each experiment, e.g. "method=dense budget=null"')
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override added to every point (e.g. task.limit=2 for a smoke run)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="points at a time (default: cores)")
    ap.add_argument("--log-dir", type=Path, default=ROOT / "outputs" / "run_points_logs")
    ap.add_argument("--dry-run", action="store_true", help="print the commands and stop")
    args = ap.parse_args(argv)
    valid = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
    unknown = [e for e in args.experiments if e not in valid]
    if unknown:
        raise SystemExit(f"error: unknown experiment(s) {unknown}; valid: {', '.join(valid)}")
    if args.jobs < 1:
        raise SystemExit(f"error: --jobs={args.jobs}: must be >= 1")
    queue = [(e, p + args.set) for e in args.experiments for p in points(e, args.extra)]
    if args.dry_run:
        for e, p in queue:
            print("python run.py -m", f"experiment={e}", *p)
        return 0
    args.log_dir.mkdir(parents=True, exist_ok=True)
    print(f"{len(queue)} points, {args.jobs} at a time; logs in {args.log_dir}", flush=True)
    failed = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for name, rc, wall in pool.map(lambda q: run_point(*q, args.log_dir), queue):
            print(f"{'ok  ' if rc == 0 else 'FAIL'} {wall:7.1f} s  {name}", flush=True)
            if rc:
                failed.append(name)
    print(f"{len(queue) - len(failed)} of {len(queue)} points finished", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
