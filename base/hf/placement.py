"""A model spread over several GPUs (model.device_map=auto): whole decoder layers per GPU,
accelerate's hooks moving activations between them, random weights initialised on the GPUs.

    model, info = load_on_devices(cfg, hf, root, dtype, kwargs, seed)
    model_devices(model)           # [cuda:0, cuda:1]: each decoder layer on one of them

Random weights: the model is built without memory (parameters on the meta device, buffers real),
the map is computed from the parameters' sizes (balanced over the GPUs, whole decoder layers;
`plan`, rather than accelerate's planner, which needs psutil and reserves room unevenly),
each parameter is allocated on its GPU filled with NaN, transformers' initialisation writes it
there, and a NaN left anywhere means a parameter the initialisation missed (refused). A 234 GB
model is initialised in seconds this way; on the CPU it would take an hour and the host's memory.
With no GPU the map is the CPU (the same code paths, for tests).
"""
from __future__ import annotations

import torch
from torch import nn

from base.config import ConfigError, ModelConfig


def model_devices(model: nn.Module) -> list[torch.device]:
    """The devices holding the model's parameters, in first-use order."""
    return list(dict.fromkeys(p.device for p in model.parameters()))


def _no_split(model: nn.Module) -> set[str]:
    return set(getattr(model, "_no_split_modules", None) or [])


def _bytes(module: nn.Module) -> int:
    """Parameter bytes (buffers are rotary tables and such: small, and placed with GPU 0's units)."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


def blocks(model: nn.Module) -> list[tuple[str, int]]:
    """The model cut into the units placed whole, in forward order, with their bytes: each decoder
    layer (the model's no-split classes) and each module around them (embeddings, norm, head)."""
    no_split = _no_split(model)
    out: list[tuple[str, int]] = []

    def walk(prefix: str, module: nn.Module) -> None:
        if next(module.parameters(recurse=False), None) is not None:
            raise ValueError(f"{type(module).__name__} holds parameters beside its decoder layers; "
                             f"model.device_map=auto cannot split it")
        for name, child in module.named_children():
            full = f"{prefix}.{name}" if prefix else name
            holds_layers = any(type(m).__name__ in no_split for m in child.modules())
            if type(child).__name__ not in no_split and holds_layers:
                walk(full, child)  # a container of decoder layers: place its children
            else:
                out.append((full, _bytes(child)))

    walk("", model)
    return out


def plan(units: list[tuple[str, int]], capacity: list[int]) -> dict[str, int]:
    """Unit -> GPU index, in order, about the same bytes on each GPU (a unit goes to the GPU its
    midpoint falls in), never above a GPU's capacity; units without parameters (rotary tables) go
    to GPU 0, where the inputs start. Raises ConfigError when the units do not fit."""
    n, total = len(capacity), sum(size for _, size in units)
    share = max(total / n, 1.0)
    used, dmap, cum = [0] * n, {}, 0
    for name, size in units:
        gpu = 0 if size == 0 else min(n - 1, int((cum + size / 2) // share))
        while gpu < n - 1 and used[gpu] + size > capacity[gpu]:
            gpu += 1  # a smaller or fuller GPU: the rest moves on
        dmap[name], used[gpu], cum = gpu, used[gpu] + size, cum + size
    over = [g for g in range(n) if used[g] > capacity[g]]
    if over:
        raise ConfigError(f"model.device_map=auto: the model's {total / 1e9:.1f} GB do not fit the {n} visible "
                          f"GPUs ({', '.join(f'{c / 1e9:.0f}' for c in capacity)} GB usable); run stage=describe "
                          f"for the GPUs it needs")
    return dmap


USABLE = 0.9  # share of each GPU's free memory given to weights (the rest: cache, activations)


def device_map_for(model: nn.Module) -> dict[str, int | str]:
    """Module name -> device: whole decoder layers, balanced over the visible GPUs; the CPU when
    there is none."""
    if not torch.cuda.is_available():
        return {"": "cpu"}
    capacity = [int(torch.cuda.mem_get_info(i)[0] * USABLE) for i in range(torch.cuda.device_count())]
    return plan(blocks(model), capacity)


def _as_device(d: int | str) -> torch.device:
    return torch.device(f"cuda:{d}" if isinstance(d, int) else d)


def _device_of(name: str, dmap: dict[str, int | str]) -> torch.device:
    """The device of a parameter: the map's entry for its longest enclosing module."""
    parts = name.split(".")
    for i in range(len(parts), -1, -1):
        key = ".".join(parts[:i])
        if key in dmap:
            return _as_device(dmap[key])
    raise KeyError(f"{name} is not in the device map")


@torch.no_grad()
def _materialise(model: nn.Module, dmap: dict[str, int | str]) -> None:
    """Give every meta parameter NaN-filled storage on its device (buffers follow at dispatch)."""
    for mod_name, module in model.named_modules():
        for pname, p in list(module._parameters.items()):
            if p is None or p.device.type != "meta":
                continue
            device = _device_of(f"{mod_name}.{pname}" if mod_name else pname, dmap)
            module._parameters[pname] = nn.Parameter(torch.full(p.shape, float("nan"), dtype=p.dtype, device=device),
                                                     requires_grad=p.requires_grad)


def _initialise(model: nn.Module) -> None:
    """transformers' own initialisation, run again now that the parameters have storage (it ran
    on the meta parameters while the model was built and marked every module done)."""
    for module in model.modules():
        module.__dict__.pop("_is_hf_initialized", None)
    model.init_weights()
    missed = [n for n, p in model.named_parameters() if p.is_floating_point() and torch.isnan(p).any()]
    if missed:
        raise RuntimeError(f"random initialisation left {len(missed)} parameters unwritten (NaN), e.g. {missed[:3]}")


def _dispatch(model: nn.Module, dmap: dict[str, int | str]) -> nn.Module:
    from accelerate import dispatch_model

    if len(set(dmap.values())) == 1:  # one device: no hooks
        return model.to(_as_device(next(iter(dmap.values()))))
    # a transformers cache passed as an argument stays where it is (as from_pretrained dispatches)
    return dispatch_model(model, device_map=dmap, skip_keys=list(getattr(model, "_skip_keys_device_placement", None) or []))


def empty_model(config, dtype: torch.dtype, kwargs: dict) -> nn.Module:
    """The model with its parameters on the meta device (no memory) and its buffers real."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        return AutoModelForCausalLM.from_config(config, dtype=dtype, **kwargs)


def random_on_devices(config, dtype: torch.dtype, kwargs: dict, seed: int) -> nn.Module:
    model = empty_model(config, dtype, kwargs)
    dmap = device_map_for(model)
    _materialise(model, dmap)
    torch.manual_seed(seed)
    _initialise(model)
    return _dispatch(model, dmap)


def load_on_devices(cfg: ModelConfig, hf, path: str, dtype: torch.dtype, kwargs: dict,
                    seed: int) -> tuple[nn.Module, dict]:
    """model.device_map=auto: random weights built on the GPUs, or a checkpoint loaded onto them
    (the same map, from the model built empty first); with transformers' loading info (missing and
    unexpected tensors) for the caller to check."""
    if cfg.init == "random":
        return random_on_devices(hf, dtype, kwargs, seed), {}
    from transformers import AutoConfig, AutoModelForCausalLM

    remote = {"trust_remote_code": kwargs.get("trust_remote_code", False)}
    empty = empty_model(AutoConfig.from_pretrained(path, **remote), dtype, kwargs)
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device_map_for(empty),
                                                output_loading_info=True, **kwargs)
