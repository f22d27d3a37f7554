"""Shared fixtures: Hydra composition (as run.py sees it) and offline settings for every test."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# TORCHINDUCTOR_VEC_ISA_OK: Inductor's CPU backend (the compiled-region tests) takes the vector ISA the
# CPU's flags name instead of building and loading a probe library per ISA with g++ before the first
# compile of a process whose Inductor cache is empty (a fresh CI machine): the compiled-region test took
# 20.6 and 24.1 s alone there, 12.3-13.4 s without the probe. Read when torch._inductor.config is imported.
for key, value in {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                   "WANDB_MODE": "offline", "WANDB_SILENT": "true", "TORCHINDUCTOR_VEC_ISA_OK": "1"}.items():
    os.environ.setdefault(key, value)


def _sample_parametrized(items) -> None:
    """`make test` (the fast tier) runs a CPU parametrized test's first and last case, so a family of
    80 refusals costs what two do: the others are marked `slow`, and `make test-all` (-m "slow or not
    slow") runs every case. Cases marked slow or gpu by hand keep their marks."""
    families: dict[tuple, list] = {}
    for item in items:
        if getattr(item, "callspec", None) is None or item.get_closest_marker("slow") or item.get_closest_marker("gpu"):
            continue
        families.setdefault((item.path, item.cls, item.originalname), []).append(item)
    for cases in families.values():
        for item in cases[1:-1]:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True)  # before `-m 'not slow'` deselects
def pytest_collection_modifyitems(config, items):
    import torch  # here, not at the top: xdist's controller process never needs it (1 s of every `make test`)

    _sample_parametrized(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session):
    """Every object collecting made (torch, transformers, pandas... as the test modules import them:
    about 550,000) goes to the garbage collector's permanent generation, so a full collection no
    longer walks them. statsmodels' Holm correction runs one per call (multipletests' gc.collect),
    the interpreter more as tests allocate: 0.2 s each, 20 s of a `make test`'s summed 105 s, 9 s
    after. Objects made by tests are collected as before; a worker's imports stay alive anyway."""
    import gc

    gc.collect()  # what collecting left unreachable is freed, not kept
    gc.freeze()


def pytest_unconfigure(config):
    """Frozen objects back to the collector before the interpreter exits: kept frozen, its last
    collection misses them and Triton's bindings (nanobind) print pages of "leaked" objects."""
    import gc

    gc.unfreeze()


@pytest.fixture
def compose():
    """compose(overrides) -> the DictConfig run.py would get, without running anything."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import run  # noqa: F401 - registers the typed schema (RunSchema) conf/config.yaml starts from

    def _compose(overrides: list[str] | None = None):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=overrides or [], return_hydra_config=False)

    yield _compose
    GlobalHydra.instance().clear()
