"""The held-out prompt pools (tasks/pools/<pool>/, experiments/mini/make_pools.py): disjoint from
each other, tasks/mini, the calibration text and the training corpus; regenerable; buildable by lm-eval."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.mini.data import Sample, check_disjoint
from experiments.mini.domains import DOMAINS
from experiments.mini.make_pools import POOLS, draw_pools, pool_size, training_corpus, write_pool

ROOT = Path(__file__).resolve().parents[1]
POOL_DIR = ROOT / "tasks" / "pools"
DOMAIN = "cmp"  # the domain the training corpus covers most (half its draws are rejected), 1.4 s to redraw


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _pool(pool: str) -> dict[str, list[Sample]]:
    return {p.stem: [Sample(r["domain"], r["prompt"], r["answer"]) for r in _rows(p)]
            for p in sorted((POOL_DIR / pool).glob("*.jsonl"))}


@pytest.fixture(scope="module")
def pools() -> dict[str, dict[str, list[Sample]]]:
    return {pool: _pool(pool) for pool in POOLS}


@pytest.fixture(scope="module")
def train_domain() -> list[Sample]:
    """The training corpus's DOMAIN stream, as trained (training_corpus restricted to one domain)."""
    return training_corpus([DOMAIN])


def test_pools_are_disjoint_from_each_other_tasks_mini_and_calibration(pools):
    mini = {r["prompt"] for p in (ROOT / "tasks" / "mini").glob("*.jsonl") for r in _rows(p)}
    calib = {json.loads(line)["text"].split("=", 1)[0] + "="
             for line in (ROOT / "data" / "calibration" / "mini.jsonl").read_text().splitlines()}
    assert len(mini) == 8 * 200 and len(calib) > 0
    seen: set[str] = set()
    for pool, sets in pools.items():
        assert set(sets) <= set(DOMAINS) and set(sets) == set(pools["quality"]), pool
        prompts = [s.prompt for samples in sets.values() for s in samples]
        assert all(len(samples) == pool_size(pool) for samples in sets.values()), pool
        assert all(s.domain == d for d, samples in sets.items() for s in samples)
        assert len(set(prompts)) == len(prompts), f"{pool} repeats a prompt"
        assert not set(prompts) & mini, f"{pool} shares prompts with tasks/mini"
        assert not set(prompts) & calib, f"{pool} shares prompts with the calibration text"
        assert not set(prompts) & seen, f"{pool} shares prompts with another pool"
        seen |= set(prompts)


def test_pools_are_held_out_from_the_training_corpus(pools, train_domain):
    """data.check_disjoint, the check training records, on one domain's full training stream."""
    for sets in pools.values():
        assert check_disjoint(train_domain, {DOMAIN: sets[DOMAIN]})["disjoint"]


@pytest.mark.slow  # draws the whole 1.6 M-example training corpus (~25 s)
def test_pools_are_held_out_from_the_whole_training_corpus(pools):
    train = training_corpus()
    for sets in pools.values():
        assert check_disjoint(train, sets)["disjoint"]


def test_replication_pool_is_the_preregistered_size_and_new():
    """Issue 27's pool: 800 prompts per domain (docs/preregistration.md), drawn after every other pool,
    so none of its prompts is in a pool a committed grid scored."""
    sets = _pool("replication")
    assert list(POOLS)[3] == "replication" and {len(v) for v in sets.values()} == {800} and len(sets) == 7
    earlier = {s.prompt for pool in list(POOLS)[:3] for v in _pool(pool).values() for s in v}
    assert len(earlier) == 3 * 7 * 1000 and not earlier & {s.prompt for v in sets.values() for s in v}


def test_heldout_pool_is_the_preregistered_size_and_new():
    """Issue 41's pool (docs/preregistration_heldout.md): 200 prompts per domain, drawn after every
    other pool, none of its prompts in a pool a committed grid scored."""
    sets = _pool("heldout")
    assert list(POOLS)[-1] == "heldout" and {len(v) for v in sets.values()} == {200} and len(sets) == 7
    earlier = {s.prompt for pool in list(POOLS)[:-1] for v in _pool(pool).values() for s in v}
    assert not earlier & {s.prompt for v in sets.values() for s in v}


@pytest.mark.parametrize("pool", ["ablation", "replication", "heldout"])
def test_regenerating_one_domain_gives_the_committed_files(train_domain, tmp_path, pool):
    drawn = draw_pools([DOMAIN], train=train_domain, pools=[pool])  # draws the pools before it first, as the generator
    write_pool(tmp_path, pool, drawn[pool])
    for name in [f"{DOMAIN}.jsonl", f"{DOMAIN}.yaml", "_template.yaml", "utils.py"]:
        assert (tmp_path / name).read_text() == (POOL_DIR / pool / name).read_text(), name


def test_pool_template_is_the_mini_template():
    def body(p: Path) -> str:
        return "".join(line for line in p.read_text().splitlines(keepends=True) if not line.startswith("#"))

    for pool in POOLS:
        assert body(POOL_DIR / pool / "_template.yaml") == body(ROOT / "tasks" / "mini" / "_template.yaml")


def test_a_pool_builds_as_an_lm_eval_group():
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(POOL_DIR / "ablation"), include_defaults=False)
    assert "pool_ablation" in tm.all_tasks
    task = tm.load(["ablation_cmp"])["tasks"]["ablation_cmp"]
    doc = next(iter(task.test_docs()))
    first = _rows(POOL_DIR / "ablation" / "cmp.jsonl")[0]
    assert task.OUTPUT_TYPE == "generate_until"
    assert (task.doc_to_text(doc), task.doc_to_target(doc)) == (first["prompt"], first["answer"])
    assert task.config.generation_kwargs["until"] == ["\n"] and len(task.test_docs()) == pool_size("ablation")


def test_task_names_are_unique_across_pools_and_tasks_mini():
    import yaml

    names = [yaml.safe_load(p.read_text().replace("!function", "")).get(key)
             for folder in [ROOT / "tasks" / "mini", *(POOL_DIR / pool for pool in POOLS)]
             for p in folder.glob("[!_]*.yaml") for key in ("task", "group")]
    names = [n for n in names if isinstance(n, str)]
    assert len(names) == len(set(names)) and {f"pool_{pool}" for pool in POOLS} <= set(names)


@pytest.mark.parametrize(("model", "pool"), [("mini", "ablation"), ("mini_olmoe", "rules")])
def test_task_config_composes_for_both_models(compose, model, pool):
    cfg = compose([f"model={model}", f"task=pool_{pool}", "task.limit=100"])
    assert list(cfg.task.tasks) == [f"pool_{pool}"] and cfg.task.limit == 100
    assert (ROOT / cfg.task.include_path / f"pool_{pool}.yaml").exists()


def test_every_pool_has_a_task_config():
    import yaml

    for pool in POOLS:
        cfg = yaml.safe_load((ROOT / "conf" / "task" / f"pool_{pool}.yaml").read_text())
        assert cfg["tasks"] == [f"pool_{pool}"] and (ROOT / cfg["include_path"] / f"pool_{pool}.yaml").exists()
