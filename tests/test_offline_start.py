"""run.py goes offline by itself when no network is configured (its module doc): the three Hugging
Face offline variables set to 1 with one warning line, unless the user set any of them, named a
mirror (HF_ENDPOINT) or a proxy, or huggingface.co:443 answers."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def clean_env(monkeypatch):
    for v in (*run.OFFLINE_VARS, *run.NETWORK_VARS):
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


def test_no_network_sets_all_three_with_one_line(clean_env):
    clean_env.setattr(run, "reachable", lambda *a, **k: False)
    said = run.go_offline_without_network()
    assert [os.environ[v] for v in run.OFFLINE_VARS] == ["1", "1", "1"]
    assert said.startswith("warning: huggingface.co:443 is not reachable") and "\n" not in said


@pytest.mark.parametrize("setting", ["HF_HUB_OFFLINE=0", "TRANSFORMERS_OFFLINE=1", "HF_ENDPOINT=https://mirror.example",
                                     "HTTPS_PROXY=http://proxy:3128", "reachable"])
def test_a_users_setting_a_mirror_a_proxy_or_the_hub_answering_changes_nothing(clean_env, setting):
    probes = []
    clean_env.setattr(run, "reachable", lambda *a, **k: probes.append(1) or setting == "reachable")
    if setting != "reachable":
        key, value = setting.split("=", 1)
        clean_env.setenv(key, value)
    before = {v: os.environ.get(v) for v in run.OFFLINE_VARS}
    assert run.go_offline_without_network() is None
    assert {v: os.environ.get(v) for v in run.OFFLINE_VARS} == before
    assert probes == ([1] if setting == "reachable" else [])  # a configured network is not probed


def test_the_probe_answers_within_its_timeout(monkeypatch):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert run.reachable(server.getsockname(), timeout=1.0)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, not listening: refused
    assert not run.reachable(("127.0.0.1", port), timeout=1.0)
    # a name lookup that never returns (getaddrinfo has no timeout): the probe gives up, not waits
    released = threading.Event()

    def hangs(*args, **kwargs):
        released.wait()
        raise OSError("released")

    monkeypatch.setattr(run.socket, "create_connection", hangs)
    assert not run.reachable(("hub.invalid", 443), timeout=0.05)
    released.set()


@pytest.mark.slow
def test_run_py_without_network_says_so_once(tmp_path):
    if run.reachable():
        pytest.skip("huggingface.co is reachable from here")
    env = {k: v for k, v in os.environ.items() if k not in (*run.OFFLINE_VARS, *run.NETWORK_VARS)}
    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), "model=tiny_qwen3", "task=smoke", "logger=none",
                           "stage=describe", f"outputs_dir={tmp_path}"], cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = [line for line in proc.stderr.splitlines() if "warn" in line.lower()]
    assert len(warnings) == 1 and warnings[0].startswith("warning: huggingface.co:443 is not reachable")
