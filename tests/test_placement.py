"""Models over several GPUs on the CPU side: stage=describe's memory estimate (a model larger than
one GPU, and the KV term against the cache the engine really allocates), model.device_map=auto's
random initialisation (every parameter written, or refused), and the engine's stated fallback to
eager decoding when a model spans devices. tests/test_multi_gpu.py runs the two-GPU equivalence."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from base.config import ConfigError, ModelConfig
from base.hf.loading import hf_config, load_model
from base.runtime.engine import DecodeEngine
from base.runtime.memory import kv_cache_bytes, memory_estimate
from tests.helpers import tiny_model_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a subprocess building gpt-oss-120b on the meta device (~10 s); the planning tests below stay fast
def test_describe_a_model_larger_than_one_gpu(tmp_path):
    """gpt-oss-120b in bf16 on the meta device: 234 GB of weights, two H200s (141 GB) at batch 16."""
    cmd = [sys.executable, str(ROOT / "run.py"), f"outputs_dir={tmp_path}", "logger=none", "model=gpt_oss_120b",
           "model.init=random", "model.device=meta", "stage=describe", "batch_size=16"]
    proc = subprocess.run(cmd, check=False, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rep = json.loads(next(tmp_path.rglob("report.json")).read_text())["describe"]
    assert 116.8e9 < rep["params_total"] < 116.9e9  # the released model's count
    mem = rep["memory"]
    assert 233 < mem["weights_gb"] < 234.5 and not mem["fits_one_gpu"] and mem["cache_len"] == 256 + 384
    row16 = next(r for r in mem["by_batch"] if r["batch_size"] == 16)
    # 36 layers x 16 x 640 slots x 8 KV heads x (64 + 64) x 2 bytes
    assert row16["kv_cache_gb"] == pytest.approx(36 * 16 * 640 * 8 * 128 * 2 / 1e9)
    assert row16["gpus_needed"] == 2
    assert "weights 233.7 GB" in proc.stdout


def test_gpus_needed_follows_the_gpu_size():
    cfg = ModelConfig(**{**tiny_model_config("qwen3").__dict__, "device": "meta"})
    model = load_model(cfg, ROOT)
    weights = sum(p.numel() * 4 for p in model.parameters()) / 1e9
    hf = model.config
    for gpu_gb, want in ((weights / 0.9 * 1.01, 1), (weights / 0.9 / 2.5, 3)):
        est = memory_estimate(model, hf, torch.float32, [1], 8, gpu_gb)
        assert est["by_batch"][0]["gpus_needed"] == want


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "olmoe", "mixtral", "deepseek", "gpt_oss"])
def test_kv_estimate_is_the_cache_the_engine_allocates(family):
    """Sliding-window layers and DeepSeek's MLA included: the formula counts the buffers the
    engine's attention really registers."""
    cfg = tiny_model_config(family)
    model = load_model(cfg, ROOT)
    B, L = 3, 20
    engine = DecodeEngine(model, B, L)
    ids = torch.randint(3, 200, (B, 5))
    engine.prefill(ids, torch.ones_like(ids), 4)
    allocated = sum(m.base_k_cache.nbytes + m.base_v_cache.nbytes for m in engine.cache.modules)
    engine.release()
    assert allocated == kv_cache_bytes(hf_config(cfg, ROOT), torch.float32, B, L)


def test_two_h200s_take_gpt_oss_120b_in_two_balanced_halves():
    """The placement plan on the real model's sizes (built on the meta device): whole decoder
    layers, the embeddings on the first GPU and the head on the last, within a layer of even."""
    from base.hf.placement import blocks, plan

    cfg = ModelConfig(**{**yaml_model("gpt_oss_120b"), "init": "random", "device": "meta"})
    units = blocks(load_model(cfg, ROOT))
    names = [n for n, _ in units]
    assert names == ["model.embed_tokens", *[f"model.layers.{i}" for i in range(36)], "model.norm",
                     "model.rotary_emb", "lm_head"]
    h200 = int(139.8 * 2**30 * 0.9)  # what one H200 reports free, times USABLE
    dmap = plan(units, [h200, h200])
    assert dmap["model.embed_tokens"] == 0 and dmap["lm_head"] == 1 and dmap["model.rotary_emb"] == 0
    layers = [dmap[f"model.layers.{i}"] for i in range(36)]
    assert layers == sorted(layers) and set(layers) == {0, 1}  # in order, both GPUs
    per_gpu = [sum(size for n, size in units if dmap[n] == g) for g in (0, 1)]
    layer_bytes = dict(units)["model.layers.0"]
    assert abs(per_gpu[0] - per_gpu[1]) <= layer_bytes + dict(units)["lm_head"]
    with pytest.raises(ConfigError, match=r"the model's 233.7 GB do not fit the 1 visible GPUs \(135 GB usable\)"):
        plan(units, [h200])
    small = plan(units, [h200 // 3, h200, h200])  # a fuller first GPU: the rest moves on
    assert sum(size for n, size in units if small[n] == 0) <= h200 // 3


@pytest.mark.slow
def test_placement_needs_no_psutil():
    """The GPU host lacks psutil (accelerate's planner imports it); the placement path must not."""
    code = ("import sys; sys.modules['psutil'] = None\n"
            "from dataclasses import replace\nfrom pathlib import Path\n"
            "from base.hf.loading import load_model\nfrom tests.helpers import tiny_model_config\n"
            "from accelerate import dispatch_model, init_empty_weights\n"
            "m = load_model(replace(tiny_model_config('qwen3'), device='auto', device_map='auto'), Path('.'))\n"
            "print(sum(p.numel() for p in m.parameters()))")
    proc = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split()[-1]) > 0


def yaml_model(name: str) -> dict:
    import yaml

    return yaml.safe_load((ROOT / "conf" / "model" / f"{name}.yaml").read_text())


def test_device_map_auto_initialises_every_parameter():
    """On a machine without GPUs the map is the CPU: the same build-empty, fill, initialise path;
    the model is finite and runs."""
    cfg = replace(tiny_model_config("gpt_oss"), device="auto", device_map="auto")
    model = load_model(cfg, ROOT, seed=0)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert torch.isfinite(model(input_ids=torch.randint(3, 200, (2, 6))).logits).all()
    again = load_model(cfg, ROOT, seed=0)  # seeded: the same weights
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))


def test_a_parameter_the_initialisation_misses_is_refused(monkeypatch):
    from transformers import PreTrainedModel

    real = PreTrainedModel._initialize_weights

    def skip_norms(self, module, *args, **kwargs):
        if "RMSNorm" in type(module).__name__:
            module._is_hf_initialized = True  # as if transformers forgot this module
            return
        return real(self, module, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "_initialize_weights", skip_norms)
    cfg = replace(tiny_model_config("qwen3"), device="auto", device_map="auto")
    with pytest.raises(RuntimeError, match=r"left \d+ parameters unwritten \(NaN\), e.g. \['model.layers.0"):
        load_model(cfg, ROOT)


def test_a_model_too_big_for_the_gpus_fails_before_anything_is_written(compose, tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    import run
    from base.run.pipeline import run as run_pipeline

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # one 150 GB GPU, as preflight sees it
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i=None: (150 * 10**9, 150 * 10**9))
    cfg = compose(["model=gpt_oss_120b", "model.init=random", "model.tokenizer=bytes", "model.device_map=auto",
                   "stage=throughput", "logger=none"])
    with pytest.raises(ConfigError, match=r"the model's 233.7 GB do not fit the 1 visible GPUs \(135 GB usable\); "
                                          r"run stage=describe"):
        run_pipeline(run.build_config(cfg, tmp_path / "out"), OmegaConf.to_yaml(cfg, resolve=True))
    assert not (tmp_path / "out").exists()


def test_device_map_needs_a_gpu_device():
    with pytest.raises(ConfigError, match="model.device_map=auto places the model over the GPUs; it needs "
                                          "model.device=auto or cuda, got model.device=meta"):
        replace(tiny_model_config("qwen3"), device="meta", device_map="auto")
    with pytest.raises(ConfigError, match="model.device_map='balanced' is not valid; choose one of: auto"):
        replace(tiny_model_config("qwen3"), device="auto", device_map="balanced")


def test_engine_over_several_devices_says_it_decodes_eagerly(monkeypatch, capsys):
    import base.runtime.engine

    model = load_model(tiny_model_config("qwen3"), ROOT)
    two = [torch.device("cuda:0"), torch.device("cuda:1")]
    monkeypatch.setattr(base.runtime.engine, "model_devices", lambda m: two)
    with pytest.raises(ValueError, match="a CUDA graph captures one device's stream"):
        DecodeEngine(model, 2, 16, graph=True)
    engine = DecodeEngine(model, 2, 16)
    assert not engine.graph_enabled and engine.regions is None
    assert "the model spans cuda:0, cuda:1: a CUDA graph is captured on one GPU, so decode steps run eagerly" \
        in capsys.readouterr().out
    ids = torch.randint(3, 200, (2, 4))
    res = engine.generate(ids, torch.ones_like(ids), 5, stop_at_eos=False)
    assert res.eager_steps == res.steps == 4


def test_decoding_through_accelerates_hooks_equals_the_plain_model():
    """What a spread model adds on the way, on one device: accelerate's hooks on every placed unit
    (moving each layer's inputs, bringing the output back). The engine with a budget decodes the
    same tokens and selections through them."""
    from accelerate import dispatch_model

    from base.hf.budget import BudgetOptions, install_budget
    from base.hf.placement import blocks
    from base.method.selectors import build_selector
    from tests.helpers import model_artifacts

    plain = load_model(tiny_model_config("qwen3"), ROOT, seed=0)
    hooked = load_model(tiny_model_config("qwen3"), ROOT, seed=0)
    hooked = dispatch_model(hooked, device_map={n: "cpu" for n, _ in blocks(hooked)}, force_hooks=True)
    assert hasattr(hooked.model.layers[0], "_hf_hook")
    ids = torch.randint(3, 200, (3, 6), generator=torch.Generator().manual_seed(1))

    def decode(model):
        budget = install_budget(model, "qwen3_moe", build_selector("base", model_artifacts(plain)), BudgetOptions(budget=3))
        engine = DecodeEngine(model, 4, 20, budget=budget)
        try:
            return engine.generate(ids, torch.ones_like(ids), 8, stop_at_eos=False).tokens_BN, budget.stats_rows()
        finally:
            engine.release()
            budget.remove()

    (a, rows_a), (b, rows_b) = decode(plain), decode(hooked)
    assert torch.equal(a, b) and rows_a == rows_b and len(rows_a) == 7 * 2


def test_triton_launches_switch_to_the_tensors_gpu(monkeypatch):
    """Triton launches on the current CUDA device; a layer on cuda:1 while cuda:0 is current must
    launch inside torch.cuda.device(cuda:1), and the one-GPU case must not switch at all."""
    from contextlib import contextmanager

    from kernels._triton import DualKernel

    def body(x):  # never compiled here
        pass

    seen = []
    current = {"gpu": 0}

    @contextmanager
    def on_device(d):
        before, current["gpu"] = current["gpu"], d.index
        try:
            yield
        finally:
            current["gpu"] = before

    class FakeJit:
        def __getitem__(self, grid):
            return lambda *a, **k: seen.append((grid, current["gpu"]))

    kernel = DualKernel(body)
    kernel.gpu = FakeJit()
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current["gpu"])
    monkeypatch.setattr(torch.cuda, "device", on_device)
    kernel.on(torch.device("cuda", 1))[(4,)]("x")
    assert kernel.on(torch.device("cuda", 0)) is kernel.gpu
    kernel.on(torch.device("cuda", 0))[(2,)]("x")
    assert seen == [((4,), 1), ((2,), 0)] and current["gpu"] == 0


def test_each_layers_cache_and_write_position_sit_on_its_device():
    """StaticKV over two devices (cpu and meta stand in for two GPUs): buffers beside each layer,
    one shared position tensor per device, and the other device's copy follows in-place steps."""
    from torch import nn

    from base.hf.attention import StaticKV

    kv = StaticKV(8, torch.device("cpu"))
    near, far = nn.Module(), nn.Module()
    kv.allocate(near, torch.zeros(2, 1, 1, 4), torch.zeros(2, 1, 1, 4))
    kv.allocate(far, torch.zeros(2, 1, 1, 4, device="meta"), torch.zeros(2, 1, 1, 4, device="meta"))
    assert far.base_k_cache.device.type == "meta" and far.base_write_pos.device.type == "meta"
    pos = torch.tensor([3])
    kv.set_write_pos(pos)
    assert near.base_write_pos is pos and far.base_write_pos.device.type == "meta"
    mirror = far.base_write_pos
    pos += 1
    kv.sync()  # (a copy into meta: shapes and devices only)
    assert far.base_write_pos is mirror and near.base_write_pos is pos and int(pos) == 4
    kv.release()
    assert not hasattr(far, "base_k_cache") and kv._mirrors == {}


def test_config_hash_of_runs_recorded_before_the_new_options_is_unchanged(compose):
    """model.device_map, describe.gpu_gb, eval.batching / admission / max_wait_rounds,
    throughput.mode, stream.* and serve.* at the values every earlier run had (and scheduler.*, which
    static batching does not use) leave the hash as it was before
    they existed, and a run hashed before artifacts_dir, outputs_dir and exp_name were left out is
    still the same config: finished runs are still skipped."""
    import hashlib

    import yaml
    from omegaconf import OmegaConf

    from base.run.outputs import same_config

    text = OmegaConf.to_yaml(compose(["model=tiny_qwen3", "method=router_sum", "eval.batching=static"]), resolve=True)
    old = yaml.safe_load(text)
    del old["describe"], old["model"]["device_map"], old["force"], old["logger"], old["eval"]["batching"]
    del old["throughput"]["mode"], old["stream"]
    old["eval"]["gen_toks"], old["eval"]["max_gen_toks"] = old["eval"].pop("gen_tokens"), old["eval"].pop("max_gen_tokens")
    del old["serve"], old["scheduler"]  # serve.* at its defaults; scheduler.* unused by static batching
    old.pop("allow_outside_outputs", None)  # at its default (issue 28)
    del old["diagnose"], old["calibration"]["tokens_per_expert"], old["method"]["shrink"]  # at their defaults (issue 41)
    old_hash = hashlib.sha1(json.dumps(old, sort_keys=True, default=str).encode()).hexdigest()[:12]
    assert same_config(text, old_hash)
    changed = OmegaConf.to_yaml(compose(["model=tiny_qwen3", "method=router_sum", "describe.gpu_gb=80"]), resolve=True)
    assert not same_config(changed, old_hash)
    continuous = OmegaConf.to_yaml(compose(["model=tiny_qwen3", "method=router_sum"]), resolve=True)
    assert not same_config(continuous, old_hash)  # the new default batching is a new run


def test_config_hash_of_continuous_runs_recorded_before_scheduler_options(compose):
    """A continuous-batching run hashed before scheduler.* existed is the same config at the
    engine's old behaviour (padded prefill, a host sync per step), not at the new defaults (it
    would compute differently); a run that does not serve through the continuous engine ignores
    scheduler.*."""
    import yaml
    from omegaconf import OmegaConf

    from base.run.outputs import config_hash, same_config

    def hashed_before(overrides):  # the run's configuration as it was before scheduler.* and serve.*
        old = yaml.safe_load(OmegaConf.to_yaml(compose(overrides), resolve=True))
        del old["serve"]
        for key in ("admission", "max_wait_rounds"):  # eval.* and stream.* then (issue 44 moved them)
            old["eval"][key] = old["stream"][key] = old["scheduler"].pop(key)
        del old["scheduler"]
        return config_hash(yaml.safe_dump(old))

    def text(overrides):
        return OmegaConf.to_yaml(compose(overrides), resolve=True)

    base = ["model=tiny_qwen3", "method=router_sum"]
    old = hashed_before(base)
    assert same_config(text(base + ["scheduler.packing=padded", "scheduler.overlap=false"]), old)
    assert not same_config(text(base), old)
    static = base + ["eval.batching=static"]
    assert same_config(text(static + ["scheduler.chunked=true", "scheduler.chunk_tokens=64"]), hashed_before(static))


@pytest.mark.parametrize("recorded_as", [None, False, True])
def test_config_hash_of_continuous_runs_recorded_with_compile_prefill(compose, recorded_as):
    """scheduler.compile_prefill existed from 2026-12-04 to 12-06 (deleted when its eager setting lost
    its A/B; compiled is what runs now): a continuous run recorded before it (None), at its default
    false (hashed without it) or at true (REMOVED_OPTIONS) is still this configuration; one that
    differs in another scheduler key is not."""
    import yaml
    from omegaconf import OmegaConf

    from base.run.outputs import config_hash, same_config

    overrides = ["model=tiny_qwen3", "method=router_sum", "eval.batching=continuous"]
    text = OmegaConf.to_yaml(compose(overrides), resolve=True)
    old = yaml.safe_load(text)
    assert "compile_prefill" not in old["scheduler"]
    if recorded_as is not None:
        old["scheduler"]["compile_prefill"] = recorded_as
    assert same_config(text, config_hash(yaml.safe_dump(old)))
    old["scheduler"]["overlap"] = not old["scheduler"]["overlap"]
    assert not same_config(text, config_hash(yaml.safe_dump(old)))


@pytest.mark.parametrize("removed", [[("method", "route_in_select")],
                                     [("method", "route_in_select"), ("throughput", "pdl")],
                                     [("throughput", "pdl"), ("throughput", "regions")],
                                     [("throughput", "regions")]])  # the fast tier runs the first and the last
def test_config_hash_of_runs_recorded_with_a_removed_option(compose, removed):
    """Options deleted when they lost their A/B (method.route_in_select, throughput.pdl; the
    throughput.regions key, whose other values lost), at the value every run recorded with them had
    (false; regions: layer_combo), leave such a run the same config, so it is still skipped,
    whichever of them it was recorded with (they existed at different times); a run recorded with
    another value computed another step and is not."""
    import yaml
    from omegaconf import OmegaConf

    from base.run.outputs import REMOVED_OPTIONS, config_hash, same_config

    text = OmegaConf.to_yaml(compose(["model=tiny_qwen3", "method=router_sum"]), resolve=True)
    recorded = yaml.safe_load(text)
    for group, key in removed:
        assert key not in recorded[group]
        recorded[group][key] = REMOVED_OPTIONS[(group, key)]
    assert same_config(text, config_hash(yaml.safe_dump(recorded)))
    group, key = removed[-1]
    recorded[group][key] = {"pdl": True, "route_in_select": True, "regions": "modules"}[key]
    assert not same_config(text, config_hash(yaml.safe_dump(recorded)))
