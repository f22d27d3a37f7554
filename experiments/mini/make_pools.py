"""Fresh held-out prompt pools of the mini models, one per grid: tasks/pools/<pool>/.

tasks/mini holds 200 test prompts per domain, and every quality grid scored (a prefix of) those
same prompts, so the grids were not independent replications. Each pool here (`quality`,
`ablation`, `rules`) is 1000 further prompts per domain, drawn from the domain generators with
its own seed and held out from everything the models or the methods have seen (`replication`, issue 27's
pre-registered grid, is 800 per domain: POOL_SIZES):

* the training corpus, regenerated exactly as trained (`make_train_corpus`, 200 000 examples per
  domain, seed TRAIN_SEED; models/mini used all of it, models/mini_olmoe the first 40 000 per domain
  of the same streams) and checked with `data.check_disjoint`, the check training records;
* tasks/mini (`make_test_sets(200, TEST_SEED)`) and the calibration text
  (data/calibration/mini.jsonl, `experiments.mini_calibration`);
* the pools drawn before it (pools are drawn in the order of POOLS), with unique prompts in a pool.

A prompt is drawn like a test prompt (the generator's stream, duplicates and excluded prompts
rejected), so a pool follows the generator's distribution *conditioned on not being excluded*. Where a
domain's prompt space is small, the training corpus covers its frequent prompts and a pool differs
from tasks/mini: `cmp` keeps no equal pair (all 1000 occur in training) and few close pairs, `count`
leans to longer strings, and `unit` has no held-out prompt at all (its 9 990 prompts are all in
training or tasks/mini). A domain that cannot give `--n` prompts stops the run, naming the domain
and how many it gives, unless it is left out explicitly with `--skip`.

Layout as tasks/mini (same `_template.yaml` body, a `utils.py` reading the JSONL beside it): one
task `<pool>_<domain>` per domain and the group `pool_<pool>`; Hydra: `task=pool_<pool>`.

    python -m experiments.mini.make_pools --skip unit      # rewrites tasks/pools/ (about a minute)
"""

from __future__ import annotations

import argparse
import json
import random
from itertools import chain
from pathlib import Path

from experiments.mini.data import (
    TEST_SEED,
    Sample,
    check_disjoint,
    held_out_prompts,
    make_split,
    make_test_sets,
    make_train_corpus,
)
from experiments.mini.domains import DOMAINS
from experiments.mini.make_tasks import GROUP, TASK, TEMPLATE
from experiments.mini_calibration import SEED as CALIB_SEED

# Drawn in this order; a pool excludes the pools before it. Seeds differ from TEST_SEED, the
# training seeds (TRAIN_SEED + train.py's --seed) and the calibration seed, and the streams are
# named "pool-..." where those are "test-..."/"train-...", so no stream is shared either way.
POOLS: dict[str, int] = {"quality": 20260301, "ablation": 20260302, "rules": 20260303, "replication": 20260304,
                         "heldout": 20260305}
N_PER_DOMAIN = 1000
# Prompts per domain where a pool differs from N_PER_DOMAIN. replication: sized by the time one
# one-thread process has for its grid (docs/preregistration.md), not by the domains' capacity
# (each domain gives 3000 more held-out prompts after the other three pools).
POOL_SIZES: dict[str, int] = {"replication": 800, "heldout": 200}  # heldout: issue 41's models (docs/preregistration_heldout.md)
N_TEST = 200        # tasks/mini, per domain (make_tasks' default)
N_TRAIN = 200_000   # training corpus per domain as models/mini was trained (metrics.json: 1.6 M examples)
N_CALIB = 300       # data/calibration/mini.jsonl per domain (mini_calibration.main's default)
MAX_DRAWS_PER_PROMPT = 200  # a domain gets n * this many draws before it counts as exhausted
OUT = Path("tasks/pools")

UTILS = '''\
"""Dataset loader of the <pool>_<domain> lm-eval tasks (referenced as `!function utils.load_split`):
<domain>.jsonl beside this file (written by experiments/mini/make_pools.py), read by
base.eval.task_data.domain_split."""

from __future__ import annotations

from pathlib import Path

from base.eval.task_data import domain_split


def load_split(domain: str, **_: object):
    """lm-eval passes the task's metadata and dataset_kwargs as keyword arguments; only `domain` matters."""
    return domain_split(Path(__file__).resolve().parent, domain, "python -m experiments.mini.make_pools --skip unit")
'''


class PoolShortfall(RuntimeError):
    """A domain cannot give the requested number of distinct held-out prompts."""


def _rng(seed: int, domain: str) -> random.Random:
    return random.Random(f"pool-{seed}-{domain}")  # str seed: sha512, stable across runs


def training_corpus(domains: list[str] | None = None) -> list[Sample]:
    """The training corpus regenerated exactly as models/mini was trained (N_TRAIN per domain, seed
    TRAIN_SEED, tasks/mini held out); `domains` keeps only those domains' streams (the same samples)."""
    return make_split(N_TRAIN, N_TEST, domains=domains)[1]


def excluded_prompts(domains: list[str], train: list[Sample] | None = None) -> set[str]:
    """Every prompt a pool must avoid: training corpus, tasks/mini and calibration text of `domains`.

    `train` is the full training corpus when the caller has it; else the domains' streams are drawn
    (each domain has its own stream, so this is the same corpus restricted to `domains`).
    """
    tests = make_test_sets(N_TEST, TEST_SEED)
    test = held_out_prompts(tests)  # the training corpus and the calibration text exclude all of it
    if train is None:
        train = training_corpus(domains)
    calib = make_train_corpus(N_CALIB, test, CALIB_SEED, domains)
    keep = set(domains)
    return {s.prompt for s in chain(train, calib, *(tests[d] for d in domains)) if s.domain in keep}


def draw_domain(domain: str, seed: int, exclude: set[str], n: int) -> list[Sample]:
    """Up to `n` samples with distinct prompts outside `exclude`, in generation order (fewer only if
    the domain is exhausted within n * MAX_DRAWS_PER_PROMPT draws)."""
    gen, rng, seen, out = DOMAINS[domain], _rng(seed, domain), set(), []
    for _ in range(n * MAX_DRAWS_PER_PROMPT):
        if len(out) == n:
            break
        prompt, answer = gen(rng)
        if prompt not in exclude and prompt not in seen:
            seen.add(prompt)
            out.append(Sample(domain, prompt, answer))
    return out


def pool_size(pool: str) -> int:
    """Prompts per domain of `pool`."""
    return POOL_SIZES.get(pool, N_PER_DOMAIN)


def draw_pools(domains: list[str], n: int | None = None, train: list[Sample] | None = None,
               pools: list[str] | None = None) -> dict[str, dict[str, list[Sample]]]:
    """{pool: {domain: samples}} for POOLS (or its first ones up to the last of `pools`), `n` prompts
    per domain in every pool (None: each pool's pool_size).

    Raises PoolShortfall naming every domain that gives fewer prompts than asked, and how many.
    """
    names = list(POOLS) if pools is None else list(POOLS)[: max(list(POOLS).index(p) for p in pools) + 1]
    exclude = excluded_prompts(domains, train)
    out: dict[str, dict[str, list[Sample]]] = {p: {} for p in names}
    short = []
    for pool in names:
        size = pool_size(pool) if n is None else n
        for domain in domains:
            samples = draw_domain(domain, POOLS[pool], exclude, size)
            if len(samples) < size:
                short.append(f"{domain}: {len(samples)} of {size} in pool {pool} "
                             f"({size * MAX_DRAWS_PER_PROMPT} draws)")
            exclude |= {s.prompt for s in samples}
            out[pool][domain] = samples
    if short:
        raise PoolShortfall("domains without enough held-out prompts -- " + "; ".join(short))
    return out


def verify(pools: dict[str, dict[str, list[Sample]]], train: list[Sample]) -> dict:
    """Re-check what draw_pools guarantees by construction; returns a record per pool."""
    test = held_out_prompts(make_test_sets(N_TEST, TEST_SEED))
    calib = {s.prompt for s in make_train_corpus(N_CALIB, test, CALIB_SEED)}
    record, seen = {}, set()
    for pool, sets in pools.items():
        prompts = [s.prompt for samples in sets.values() for s in samples]
        assert len(set(prompts)) == len(prompts), f"pool {pool} repeats a prompt"
        assert not set(prompts) & test, f"pool {pool} shares prompts with tasks/mini"
        assert not set(prompts) & calib, f"pool {pool} shares prompts with the calibration text"
        assert not set(prompts) & seen, f"pool {pool} shares prompts with an earlier pool"
        seen |= set(prompts)
        record[pool] = check_disjoint(train, sets)  # raises on any prompt in the training corpus
    return record


def write_pool(out: Path, pool: str, sets: dict[str, list[Sample]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for domain, samples in sets.items():
        rows = [{"prompt": s.prompt, "answer": s.answer, "domain": domain} for s in samples]
        (out / f"{domain}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (out / f"{domain}.yaml").write_text(TASK.replace("mini_{domain}", f"{pool}_{{domain}}").format(domain=domain))
    body = "".join(line for line in TEMPLATE.splitlines(keepends=True) if not line.startswith("#"))
    header = (f"# Shared by every {pool}_<domain> task of the held-out pool '{pool}' (written by\n"
              "# experiments/mini/make_pools.py; same template as tasks/mini). The test split is read by\n"
              "# utils.load_split from the JSONL beside this file: offline, from any working directory.\n")
    (out / "_template.yaml").write_text(header + body)
    (out / "utils.py").write_text(UTILS)
    missing = [d for d in DOMAINS if d not in sets]
    note = (f"# Domains without a held-out pool (left out with --skip): {', '.join(missing)}\n" if missing else "")
    group = GROUP.replace("group: mini", f"group: pool_{pool}")
    (out / f"pool_{pool}.yaml").write_text(note + group.format(tasks=", ".join(f"{pool}_{d}" for d in sets)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--n", type=int, default=None,
                    help=f"prompts per domain in every pool (default: {N_PER_DOMAIN}, or the pool's POOL_SIZES entry)")
    ap.add_argument("--skip", nargs="*", default=[], choices=list(DOMAINS),
                    help="domains to leave out of every pool (say why in the docs)")
    args = ap.parse_args()
    domains = [d for d in DOMAINS if d not in args.skip]
    first = args.n or pool_size(next(iter(POOLS)))
    for d in args.skip:  # loud, so that a smaller pool is never a surprise
        got = draw_domain(d, POOLS[next(iter(POOLS))], excluded_prompts([d]), first)
        print(f"WARNING: domain {d} left out of the pools (--skip); it gives {len(got)} of {first} "
              f"held-out prompts in {first * MAX_DRAWS_PER_PROMPT} draws")
    train = training_corpus()
    try:
        pools = draw_pools(domains, args.n, train)
    except PoolShortfall as e:
        raise SystemExit(f"error: {e}. Nothing written; leave such a domain out with --skip.") from None
    record = verify(pools, train)
    out = Path(args.out)
    for pool, sets in pools.items():
        write_pool(out / pool, pool, sets)
        r = record[pool]
        print(f"pool {pool}: {len(sets)} domains x {len(next(iter(sets.values())))} prompts -> {out / pool}; "
              f"{r['test_prompts_in_train']} in the {r['train_examples']} training examples, "
              f"none in tasks/mini, the calibration text or another pool")


if __name__ == "__main__":
    main()
