"""Loading a model and its tokenizer from a typed ModelConfig: a local checkpoint, or the exact
architecture with random weights (`model.init=random`), on one device or spread over GPUs.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
)

from base.config import ConfigError, ModelConfig
from base.hf.families import FAMILIES

try:  # transformers' configs validate their fields through huggingface_hub's strict dataclasses
    from huggingface_hub.errors import StrictDataclassError
except ImportError:  # an older huggingface_hub raises ValueError itself
    class StrictDataclassError(Exception):
        pass


def resolve_path(path: str, root: Path) -> str:
    """Local directories resolve against the repo root; anything else is a hub id."""
    p = Path(path)
    if p.is_absolute():
        return str(p)
    return str(root / p) if (root / p).exists() else path


def check_arch_keys(cfg: ModelConfig, model_type: str) -> None:
    """A model.arch key close to one of the config's fields but not one is a typo: transformers keeps
    any keyword as an attribute that no module reads, so `num_expertz=4` would build the default
    expert count. (Keys the modelling code reads outside the fields, head_dim, or that the config
    converts, rope_theta, are not close to a field and pass.)"""
    import dataclasses
    import difflib

    from transformers import CONFIG_MAPPING

    kind = CONFIG_MAPPING[model_type]
    if not dataclasses.is_dataclass(kind):
        return
    names = {f.name for f in dataclasses.fields(kind)} | set(getattr(kind, "attribute_map", {}))
    for key in cfg.arch:
        near = difflib.get_close_matches(key, names, n=1, cutoff=0.8) if key not in names else []
        if near:
            raise ConfigError(f"model.arch.{key} is not a field of {model_type}'s config; did you mean "
                              f"model.arch.{near[0]}?")


def hf_config(cfg: ModelConfig, root: Path) -> PretrainedConfig:
    family = FAMILIES.get(cfg.family)
    if cfg.init == "random":
        check_arch_keys(cfg, family.model_type)
        try:
            return AutoConfig.for_model(family.model_type, **cfg.arch)
        except (TypeError, ValueError, StrictDataclassError) as err:  # transformers validates fields on building
            cause = err.__cause__ if isinstance(err, StrictDataclassError) and err.__cause__ is not None else err
            raise ConfigError(f"model.arch of {cfg.name} is not a valid {family.model_type} config: {cause}") from None
    if not isinstance(cfg.trust_remote_code, bool):  # only the boolean true lets a checkpoint's code run
        raise ConfigError(f"model.trust_remote_code={cfg.trust_remote_code!r} must be true or false")
    local = Path(resolve_path(cfg.path, root))
    if local.is_dir() and not (local / "config.json").is_file():
        raise ConfigError(f"model.path={cfg.path}: no config.json in {local}; a checkpoint folder holds config.json, "
                          f"the weights and the tokenizer files (or use model.init=random with model.arch)")
    try:
        return AutoConfig.from_pretrained(resolve_path(cfg.path, root), trust_remote_code=cfg.trust_remote_code)
    except ValueError as err:
        if "trust_remote_code" not in str(err):
            raise ConfigError(f"model.path={cfg.path}: its config.json does not describe a model transformers knows "
                              f"({err})") from None
        raise ConfigError(f"model {cfg.name}: the checkpoint at {cfg.path!r} asks to run its own Python code "
                          f"(its config names custom classes); set model.trust_remote_code=true only if you trust "
                          f"it") from None
    except OSError as err:
        raise ConfigError(
            f"model {cfg.name}: cannot load {cfg.path!r} ({type(err).__name__}); point model.path at a local "
            f"checkpoint directory, or use model.init=random to build the architecture with random weights"
        ) from err


def num_experts(cfg: ModelConfig, root: Path) -> int:
    return int(getattr(hf_config(cfg, root), FAMILIES.get(cfg.family).experts_key))


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_model(cfg: ModelConfig, root: Path, seed: int = 0, experts_impl: str | None = None) -> nn.Module:
    """The model in eval mode on its device. `init=random` builds the exact architecture offline."""
    dtype = getattr(torch, cfg.dtype)
    device = pick_device(cfg.device)
    if experts_impl is None and device.type == "cuda":
        experts_impl = "base_triton"  # capturable in a CUDA graph in any dtype (grouped_mm: bf16 only)
    if experts_impl == "base_triton":
        from base.hf.experts_impl import register_base_triton

        register_base_triton()
    kwargs = {"experts_implementation": experts_impl} if experts_impl else {}
    if cfg.device_map is not None:
        from base.hf.placement import load_on_devices

        hf = hf_config(cfg, root) if cfg.init == "random" else None
        model, info = load_on_devices(cfg, hf, resolve_path(cfg.path, root), dtype,
                                      {**kwargs, "trust_remote_code": cfg.trust_remote_code}, seed)
        check_loading_info(cfg, info)
    elif cfg.init == "random":
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(
                hf_config(cfg, root), dtype=dtype, trust_remote_code=cfg.trust_remote_code, **kwargs
            )
    else:
        try:  # a tensor of another shape is reported in `info` (check_loading_info names it), not raised
            model, info = AutoModelForCausalLM.from_pretrained(
                resolve_path(cfg.path, root), dtype=dtype, trust_remote_code=cfg.trust_remote_code,
                output_loading_info=True, ignore_mismatched_sizes=True, **kwargs
            )
        except RuntimeError as err:  # transformers' conversion of per-expert tensors into fused ones
            raise ConfigError(f"model.path={cfg.path}: the checkpoint's tensors do not convert into the model "
                              f"({str(err).splitlines()[0]}; transformers' load report above names them): the "
                              f"checkpoint is incomplete or of another architecture") from None
        check_loading_info(cfg, info)
        model.to(device)
    if cfg.init == "pretrained" or cfg.device_map is not None:
        check_finite(cfg, model)
    model.eval()
    if cfg.routing == "skewed":
        from base.hf.skew import skew_routing

        family = FAMILIES.get(cfg.family)
        model.base_skew_report = skew_routing(model, family, family.renormalizes(model.config), cfg.skew_ratio, seed)
    return model


def check_loading_info(cfg: ModelConfig, info: dict) -> None:
    """Every tensor the model has came from the checkpoint and every checkpoint tensor went into the
    model: transformers initialises a missing one at random and drops an unexpected one, with only a
    table on stderr (a layer without weights runs at random; accuracy falls to chance)."""
    missing, unexpected = sorted(info.get("missing_keys") or []), sorted(info.get("unexpected_keys") or [])
    mismatched = sorted(str(k[0]) if isinstance(k, tuple) else str(k) for k in info.get("mismatched_keys") or [])
    parts = [f"{len(keys)} {what} ({', '.join(keys[:6])}{', ...' if len(keys) > 6 else ''})"
             for what, keys in (("missing", missing), ("unexpected", unexpected), ("of another shape", mismatched))
             if keys]
    if parts:
        raise ConfigError(f"model.path={cfg.path}: the checkpoint does not match its config.json: tensors "
                          f"{'; '.join(parts)}; the checkpoint is incomplete or of another architecture")


def check_finite(cfg: ModelConfig, model: nn.Module) -> None:
    """Every weight is finite: one NaN in an expert scored 0.44 where the model scores 0.875, with
    exit code 0. One pass over each tensor, on its device."""
    bad = [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        raise ConfigError(f"model.path={cfg.path}: {len(bad)} weight tensor{'s' if len(bad) > 1 else ''} hold NaN or "
                          f"infinite values ({', '.join(bad[:6])}{', ...' if len(bad) > 6 else ''}): the checkpoint "
                          f"is damaged")


def byte_tokenizer():
    """A byte-level tokenizer built in code, for random-weight models that ship none."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for special in ("<pad>", "<eos>"):
        vocab[special] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", padding_side="left"
    )


def load_tokenizer(cfg: ModelConfig, root: Path):
    source = cfg.tokenizer or cfg.path
    if source == "bytes":
        return byte_tokenizer()
    tok = AutoTokenizer.from_pretrained(resolve_path(source, root), trust_remote_code=cfg.trust_remote_code)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok
