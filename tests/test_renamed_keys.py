"""Keys renamed or moved in issue 44 (base/config.py RENAMED_KEYS): eval.gen_toks -> eval.gen_tokens,
eval.max_gen_toks -> eval.max_gen_tokens, eval.admission / stream.admission -> scheduler.admission,
eval.max_wait_rounds / stream.max_wait_rounds -> scheduler.max_wait_rounds.

An old key is refused at start (exit 2, one line naming the new key) wherever it is written: on
the command line, in a config file, in an experiment's sweep. A run recorded with the old keys
keeps its config hash (base/run/outputs.py as_recorded), so a finished run is still skipped.
Engine options deleted when they lost their A/B (DELETED_KEYS) are refused saying so."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

import run
from base.config import DELETED_KEYS, RENAMED_KEYS, ConfigError
from base.run.outputs import config_hash, same_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("old, new", sorted(RENAMED_KEYS.items()))
def test_an_old_key_on_the_command_line_is_refused_naming_the_new_one(old, new):
    for arg in (f"{old}=4", f"+{old}=4", f"~{old}"):
        with pytest.raises(ConfigError, match=f"^{old} was renamed {new}"):
            run.check_composition(["model=tiny_qwen3", arg])


@pytest.mark.parametrize("key", sorted(DELETED_KEYS))
def test_a_deleted_engine_option_is_refused_saying_it_lost_its_a_b(key):
    """An option deleted when it lost its A/B (base/config.py DELETED_KEYS) is not refused as an
    unknown key with a near miss (throughput.regions -> throughput.repeats) but as deleted, with why."""
    for arg in (f"{key}=true", f"+{key}=true"):
        with pytest.raises(ConfigError, match=f"^{key} was deleted after its A/B .*: drop it$"):
            run.check_composition(["model=tiny_qwen3", "stage=throughput", arg])


def test_an_old_key_in_a_config_file_or_a_sweep_is_refused(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    monkeypatch.setattr(run, "ROOT", tmp_path)
    (tmp_path / "conf/experiment/old_key.yaml").write_text("# @package _global_\neval:\n  gen_toks: 5\n")
    with pytest.raises(ConfigError, match="eval.gen_toks was renamed eval.gen_tokens .set in a config file"):
        run.check_composition(["experiment=old_key"])
    (tmp_path / "conf/experiment/old_sweep.yaml").write_text(
        "# @package _global_\nhydra:\n  sweeper:\n    params:\n      eval.admission: fifo,union\n")
    with pytest.raises(ConfigError, match=r"eval.admission was renamed scheduler.admission \(in hydra.sweeper.params\)"):
        run.check_composition(["-m", "experiment=old_sweep"])


def test_the_error_line_and_exit_code(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), "eval.gen_toks=384"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: eval.gen_toks was renamed eval.gen_tokens: write eval.gen_tokens "
                                                "instead"]


def _as_before(text: str) -> str:
    """A resolved configuration as run.py wrote it before issue 44 (by hand, not by as_recorded):
    gen_toks names, and the admission keys in eval.* and stream.* (an evaluation's in eval, a
    throughput run's in stream, the other group at fifo / 4)."""
    cfg = yaml.safe_load(text)
    cfg["eval"]["gen_toks"] = cfg["eval"].pop("gen_tokens")
    cfg["eval"]["max_gen_toks"] = cfg["eval"].pop("max_gen_tokens")
    admission, rounds = cfg["scheduler"].pop("admission"), cfg["scheduler"].pop("max_wait_rounds")
    home = "stream" if cfg["stage"] == "throughput" else "eval"
    for group in ("eval", "stream"):
        cfg[group]["admission"] = admission if group == home else "fifo"
        cfg[group]["max_wait_rounds"] = rounds if group == home else 4
    return yaml.safe_dump(cfg, sort_keys=False)


# Hashes the code before issue 44 gave these configurations (old keys: eval.gen_toks=5,
# eval.admission=union, stream.admission=union, ...): a change here makes finished runs stale.
RECORDED = [
    (["model=tiny_qwen3", "task=smoke"], "39fcd90bee34"),
    (["model=tiny_qwen3", "task=smoke", "scheduler.admission=union", "scheduler.max_wait_rounds=2",
      "eval.gen_tokens=5", "eval.max_gen_tokens=7"], "bc71b17d3c57"),
    (["model=tiny_qwen3", "task=smoke", "eval.batching=static", "eval.gen_tokens=3"], "be543c567f43"),
    (["model=tiny_qwen3", "stage=throughput", "throughput.mode=stream", "scheduler.admission=union",
      "scheduler.max_wait_rounds=3", "throughput.batch_sizes=[2]"], "be1110989183"),
    (["model=tiny_qwen3", "stage=throughput", "throughput.mode=serve", "throughput.batch_sizes=[2]"], "ae7170a75df7"),
    (["model=tiny_qwen3", "stage=throughput", "throughput.batch_sizes=[2]"], "6564e1f16e12"),
    (["model=tiny_qwen3", "stage=fit"], "ba827e7cf1e6"),
    # the replication grid recording while issue 44 was made (report.json of
    # outputs/replication_mini/budget=8,eval.seed=0,method=base, made at commit a9927a0)
    (["experiment=replication_mini", "method=base", "budget=8", "eval.seed=0"], "2647d2077831"),
]


@pytest.mark.parametrize("overrides, recorded", RECORDED)
def test_renamed_keys_keep_the_hash_runs_were_recorded_with(compose, overrides, recorded):
    new = OmegaConf.to_yaml(compose(overrides), resolve=True)
    old = _as_before(new)
    assert "gen_toks" in old and "admission" not in yaml.safe_load(old)["scheduler"]
    assert config_hash(old) == config_hash(new)  # the same configuration, either layout
    assert same_config(new, recorded) and same_config(old, recorded)


def test_a_moved_key_off_its_default_still_changes_the_hash(compose):
    fifo = OmegaConf.to_yaml(compose(["model=tiny_qwen3", "task=smoke"]), resolve=True)
    union = OmegaConf.to_yaml(compose(["model=tiny_qwen3", "task=smoke", "scheduler.admission=union"]), resolve=True)
    assert config_hash(fifo) != config_hash(union) == config_hash(_as_before(union))
    old = yaml.safe_load(_as_before(union))
    assert old["eval"]["admission"] == "union" and old["stream"]["admission"] == "fifo"
