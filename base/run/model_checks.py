"""Preflight checks of the model a run names, from its config alone (no weights are read):

    check_names(cfg)              # family and experts implementations are registered names
    check_family(cfg, hf)         # a checkpoint is of the family model.family says
    check_tokenizer(cfg, tok, V)  # the tokenizer holds a vocabulary, and its ids fit the model's V
    check_device_memory(cfg, hf)  # the device can hold the weights (meta holds none), and beside
                                  # them the K/V cache of the largest decode batch the run builds
    check_stream_prompts(cfg)     # a request stream's prompts fit in this machine's memory
    check_prefill_buckets(cfg, hf)  # the largest prefill bucket's forward fits on the device

Each failure is a ConfigError that names the key or file and what is valid.
"""
from __future__ import annotations

from base.checks import check_choice
from base.config import CACHE_ROUND, ConfigError, RunConfig, cache_length
from base.hf.families import FAMILIES

PROBE = "The quick brown fox, 1234 + 5678 = 6912.\n"  # any tokenizer with a vocabulary splits this


def check_names(cfg: RunConfig) -> None:
    from base.hf.experts_impl import experts_implementations

    check_choice("model.family", cfg.model.family, tuple(FAMILIES.names()))
    impls = tuple(experts_implementations())
    if cfg.model.experts_impl is not None:
        check_choice("model.experts_impl", cfg.model.experts_impl, (*impls, "null"))
        check_runnable("model.experts_impl", cfg.model.experts_impl, cfg)
    if cfg.stage == "throughput" and cfg.throughput is not None:
        for spec, parsed in zip(cfg.throughput.methods or [], cfg.throughput.specs or []):
            if parsed["impl"] is not None and parsed["impl"] not in impls:
                raise ConfigError(f"throughput.methods[]={spec!r}: {parsed['impl']!r} is not an experts "
                                  f"implementation; choose one of: {', '.join(impls)}")
            if parsed["impl"] is not None:
                check_runnable(f"throughput.methods[]={spec!r}", parsed["impl"], cfg)


def check_runnable(key: str, impl: str, cfg: RunConfig) -> None:
    """An experts implementation that would fail at the first forward here is refused now (stage=describe
    runs none)."""
    import torch

    from base.hf.experts_impl import unavailable_reason

    if cfg.stage == "describe":
        return
    cuda = cfg.model.device not in ("cpu", "meta") and torch.cuda.is_available()
    why = unavailable_reason(impl, cfg.model.dtype, cuda)
    if why is not None:
        raise ConfigError(f"{key}: {why}")


def check_family(cfg: RunConfig, hf) -> None:
    """model.family decides how the MoE block is read and replaced; a checkpoint of another family
    would run under the wrong adapter (or fail deep inside it)."""
    want = FAMILIES.get(cfg.model.family).model_type
    have = getattr(hf, "model_type", None)
    if have != want:
        same = [n for n in FAMILIES.names() if FAMILIES.get(n).model_type == have]
        hint = f"set model.family={same[0]}" if same else f"its model_type is none of the families ({', '.join(FAMILIES.names())})"
        raise ConfigError(f"model.path={cfg.model.path} holds a checkpoint of model_type {have!r}, but model.family={cfg.model.family} "
                          f"expects {want!r}; {hint}")


def check_tokenizer(cfg: RunConfig, tokenizer, vocab_size: int | None) -> None:
    """transformers builds an empty tokenizer from a folder without tokenizer files (every text
    becomes zero tokens); a tokenizer of another model gives ids beyond this model's embeddings."""
    source = cfg.model.tokenizer or cfg.model.path
    ids = tokenizer(PROBE, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ConfigError(f"model {cfg.model.name}: the tokenizer from {source} turns text into no tokens (a folder "
                          f"without tokenizer.json / tokenizer.model / vocab.json?); set model.tokenizer to a tokenizer "
                          f"folder, or model.tokenizer=bytes for a random-weight model")
    top = max(max(ids), *(i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if isinstance(i, int)))
    if vocab_size is not None and top >= vocab_size:
        raise ConfigError(f"model {cfg.model.name}: the tokenizer from {source} gives token id {top}, beyond the "
                          f"model's {vocab_size} embeddings (vocab_size): a tokenizer of another model")


def meta_model(cfg: RunConfig, hf):
    """The model built on the meta device: its shape, no memory."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(hf, dtype=getattr(torch, cfg.model.dtype),
                                                    trust_remote_code=cfg.model.trust_remote_code)
    except (RuntimeError, TypeError, ValueError, OverflowError) as err:  # sizes transformers cannot build
        raise ConfigError(f"model {cfg.model.name}: its architecture (model.arch or config.json) cannot be built: "
                          f"{type(err).__name__}: {str(err).splitlines()[0][:200]}") from None


def _capacity(device) -> tuple[int | None, str]:
    """(bytes, what) the device holds: a GPU's total memory, or the host's available memory."""

    import torch

    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device.index or 0)
        return int(props.total_memory), f"GPU {device.index or 0} ({props.name})"
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024, "this machine's available memory"
    except (OSError, KeyError, ValueError):
        return None, "this machine"


def check_device_memory(cfg: RunConfig, hf) -> None:
    """model.device can hold the weights, and beside them the K/V cache of the largest decode batch
    the run builds (a lower bound: a refused run could not have run; without it a batch size of a
    billion failed halfway with the allocator's traceback). meta holds none: only stage=describe
    plans on it. model.device_map=auto is planned over the GPUs elsewhere (preflight's placement check)."""
    if cfg.model.device == "meta":
        if cfg.stage != "describe":
            raise ConfigError(f"model.device=meta builds the model without memory, so it has no weights to run: only "
                              f"stage=describe uses it; for stage={cfg.stage} choose model.device=auto, cpu or cuda")
        return
    if cfg.model.device_map is not None:
        return
    from base.hf.loading import pick_device

    device = pick_device(cfg.model.device)
    have, what = _capacity(device)
    if have is None:
        return
    need = sum(p.numel() for p in meta_model(cfg, hf).parameters()) * _dtype_bytes(cfg.model.dtype)
    if need > have:
        raise ConfigError(f"model {cfg.model.name} needs {need / 1e9:.1f} GB for its weights in {cfg.model.dtype}, more "
                          f"than {what} holds ({have / 1e9:.1f} GB): use a device with more memory, "
                          f"model.device_map=auto (several GPUs), or stage=describe model.device=meta to plan")
    state = decode_state(cfg)
    if state is None:
        return
    key, rows, slots = state
    per_row = slots * (kv_bytes_per_slot(hf, _dtype_bytes(cfg.model.dtype)) + 1)  # + its row of the slot mask
    if need + rows * per_row > have:
        fit = (have - need) // per_row
        raise ConfigError(f"{key}: {rows} rows of {slots} cache slots need {rows * per_row / 1e9:.1f} GB of K/V cache "
                          f"beside the weights' {need / 1e9:.1f} GB, more than {what} holds ({have / 1e9:.1f} GB): "
                          + (f"at most {fit} rows fit" if fit >= 1 else "not one row fits beside the weights"))


def kv_bytes_per_slot(hf, dtype_bytes: int) -> int:
    """K/V cache bytes of one row and one cache slot over every layer: base/hf/attention.py's StaticKV
    holds (rows, KV heads, slots, key size) and (..., value size) per layer; DeepSeek's MLA caches every
    head's key (no-position and rotary parts) and value."""
    heads = hf.num_attention_heads
    if getattr(hf, "qk_rope_head_dim", None) is not None:
        kv, key, value = heads, hf.qk_nope_head_dim + hf.qk_rope_head_dim, hf.v_head_dim
    else:
        kv = getattr(hf, "num_key_value_heads", None) or heads
        key = value = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    return hf.num_hidden_layers * kv * (key + value) * dtype_bytes


def check_stream_prompts(cfg: RunConfig) -> None:
    """A request stream's prompts (throughput.mode stream or serve) fit in this machine's memory: its
    requests times their least prompt length, 8 bytes a token (a lower bound; a billion requests
    spent minutes drawing prompts before the allocator failed)."""
    tp = cfg.throughput
    if cfg.stage != "throughput" or tp is None or tp.mode not in ("stream", "serve"):
        return
    import torch

    if tp.mode == "serve":
        key, n = "serve.requests", cfg.serve.requests
    else:  # the timed stream and the statistics pass's, each slots x requests per slot
        per_slot = max(("stream.requests_per_slot", cfg.stream.requests_per_slot),
                       ("stream.stats_requests_per_slot", cfg.stream.stats_requests_per_slot), key=lambda kv: kv[1])
        key, n = f"{per_slot[0]}={per_slot[1]} at {max(tp.batch_sizes)} slots", max(tp.batch_sizes) * per_slot[1]
    per_request = 8 * (1 if cfg.stream.lengths_from else cfg.stream.prompt_len[0])
    have, what = _capacity(torch.device("cpu"))
    if have is not None and n * per_request > have:
        raise ConfigError(f"{key}: a stream of {n} requests holds at least {n * per_request / 1e9:.1f} GB of prompt "
                          f"tokens, more than {what} holds ({have / 1e9:.1f} GB): at most {have // per_request} "
                          f"requests fit")


def check_prefill_buckets(cfg: RunConfig, hf) -> None:
    """The largest prefill bucket fits on the device: a continuous engine keeps a packed stream of that
    many tokens (4 int64 rows) and prefills it in its warm-up, holding a hidden state per token at the
    least (scheduler.buckets=[1e9] ended in the allocator's traceback after the run folder was made)."""
    tp = cfg.throughput
    continuous = (cfg.stage == "evaluate" and cfg.eval.batching == "continuous") or \
        (cfg.stage == "throughput" and tp is not None and tp.mode in ("stream", "serve"))
    if not continuous or cfg.model.device == "meta" or cfg.model.device_map is not None:
        return
    from base.hf.loading import pick_device

    have, what = _capacity(pick_device(cfg.model.device))
    per_token = 4 * 8 + hf.hidden_size * _dtype_bytes(cfg.model.dtype)
    largest = cfg.scheduler.buckets[-1]
    if have is not None and largest * per_token > have:
        raise ConfigError(f"scheduler.buckets: a packed prefill of {largest} tokens needs at least "
                          f"{largest * per_token / 1e9:.1f} GB (its token stream and one hidden state a token), more "
                          f"than {what} holds ({have / 1e9:.1f} GB): keep every bucket at most {have // per_token}")


def decode_state(cfg: RunConfig) -> tuple[str, int, int] | None:
    """(the key that sets the rows, rows, cache slots) of the largest decode engine the run builds, the
    slots at their least; None where the run builds none."""
    if cfg.stage == "evaluate":
        return "batch_size", cfg.batch_size, CACHE_ROUND
    tp = cfg.throughput
    if cfg.stage != "throughput" or tp is None:
        return None
    if tp.mode == "steps":
        slots = tp.prompt_len + tp.gen_tokens
    elif cfg.stream.lengths_from is None:
        slots = cache_length(cfg.stream.longest())
    else:
        slots = CACHE_ROUND
    return "throughput.batch_sizes", max(tp.batch_sizes), slots


def _dtype_bytes(dtype: str) -> int:
    import torch

    return torch.finfo(getattr(torch, dtype)).bits // 8
