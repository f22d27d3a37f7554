"""Shared test utilities: hand-built routed batches, tiny random MoE models, and `MoeProbe`, which
observes what the router decided and which expert weights the eager experts loop actually read.

Shapes: B sequences, T tokens, H hidden, E experts, K top-k, L MoE layers, M budget.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import yaml
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from base.config import ModelConfig
from base.hf.budget import BudgetOptions, MoeBudget, install_budget
from base.hf.families import MoeLayer, find_moe_layers
from base.method.routing import RoutedBatch
from base.method.selectors import Artifacts, Selector

ROOT = Path(__file__).resolve().parents[1]
PAD_ID = 0  # pad token of the tiny Qwen3 model built here
EOS_ID = 1

# Selectors that honour the budget, and everything registered (oea ignores the budget).
BUDGETED = ["router_sum", "router_sq", "count", "calib_freq", "calib_energy", "base", "oracle", "fixed",
            "top1_union"]


# ---- routed batches -----------------------------------------------------------------------------
def routed_batch(
    probs_TE: list | Tensor,
    topk_idx_TK: list | Tensor,
    topk_w_TK: list | Tensor,
    active_T: list | Tensor | None = None,
    z_TH: Tensor | None = None,
    norms_TK: list | Tensor | None = None,
    layer: int = 0,
) -> RoutedBatch:
    """A RoutedBatch from explicit (nested-list) router decisions."""
    probs_TE = torch.as_tensor(probs_TE, dtype=torch.float32)
    topk_idx_TK = torch.as_tensor(topk_idx_TK, dtype=torch.long)
    topk_w_TK = torch.as_tensor(topk_w_TK, dtype=torch.float32)
    T = topk_idx_TK.shape[0]
    active_T = torch.ones(T, dtype=torch.bool) if active_T is None else torch.as_tensor(active_T, dtype=torch.bool)
    z_TH = torch.zeros(T, 2) if z_TH is None else z_TH
    norms_TK = None if norms_TK is None else torch.as_tensor(norms_TK, dtype=torch.float32)
    return RoutedBatch(z_TH, probs_TE, topk_idx_TK, topk_w_TK, active_T, layer, norms_TK)


def model_like_batch(probs_TE: list | Tensor, k: int, renorm: bool = True, scale: float = 1.0,
                     active_T: list | Tensor | None = None) -> RoutedBatch:
    """Route as a model does: top-k of probs, weights p/sum(p) (renorm) or p*scale (DeepSeek-like)."""
    probs_TE = torch.as_tensor(probs_TE, dtype=torch.float32)
    p_TK, idx_TK = probs_TE.topk(k, dim=-1)
    w_TK = p_TK / p_TK.sum(-1, keepdim=True) if renorm else p_TK * scale
    return routed_batch(probs_TE, idx_TK, w_TK, active_T)


def random_batch(seed: int, T: int = 8, E: int = 8, K: int = 2, H: int = 4, renorm: bool = True,
                 p_inactive: float = 0.25, norms: bool = True, layer: int = 0) -> RoutedBatch:
    g = torch.Generator().manual_seed(seed)
    probs_TE = torch.softmax(torch.randn(T, E, generator=g) * 2.0, dim=-1)
    b = model_like_batch(probs_TE, K, renorm=renorm, active_T=torch.rand(T, generator=g) >= p_inactive)
    b.z_TH = torch.randn(T, H, generator=g)
    b.layer = layer
    if norms:
        b.norms_TK = torch.rand(T, K, generator=g) * 3.0 + 0.1
    return b


def random_artifacts(L: int, E: int, H: int, seed: int = 0) -> Artifacts:
    g = torch.Generator().manual_seed(seed)
    return Artifacts(
        freq_LE=torch.rand(L, E, generator=g),
        energy_LE=torch.rand(L, E, generator=g) * 2.0 + 0.1,
        pred_w_LHE=torch.randn(L, H, E, generator=g) * 0.3,
        pred_b_LE=torch.randn(L, E, generator=g) * 0.3,
    )


def model_artifacts(model: nn.Module, seed: int = 0) -> Artifacts:
    """Random artifacts shaped for `model` (calibration energies kept positive)."""
    layers = find_moe_layers(model)
    L, E, H = len(layers), layers[0].num_experts, model.config.hidden_size
    g = torch.Generator().manual_seed(seed)
    return Artifacts(freq_LE=torch.rand(L, E, generator=g), energy_LE=torch.rand(L, E, generator=g) + 0.1,
                     pred_w_LHE=0.3 * torch.randn(L, H, E, generator=g), pred_b_LE=torch.randn(L, E, generator=g))


def ids_of(mask_E: Tensor) -> set[int]:
    return set(torch.nonzero(mask_E).flatten().tolist())


def top_m_by_hand(score: dict[int, float], m: int) -> set[int]:
    """The spec's rule, written independently: top m by score, ties to the lower expert id."""
    return set(sorted(score, key=lambda u: (-score[u], u))[:m])


def token_routing(idx_K: Tensor, w_K: Tensor) -> dict[int, float]:
    """expert -> total weight a token gives it, zero-weight (empty) slots left out."""
    out: dict[int, float] = {}
    for u, w in zip(idx_K.tolist(), w_K.tolist()):
        if w != 0.0:
            out[u] = out.get(u, 0.0) + w
    return out


# ---- tiny models -------------------------------------------------------------------------------
def tiny_qwen3(seed: int = 0, num_experts: int = 8, top_k: int = 2, norm_topk_prob: bool = True,
               layers: int = 2) -> nn.Module:
    """A tiny random fp32 Qwen3-MoE with the eager experts loop (the loop MoeProbe observes)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(
        "qwen3_moe", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, moe_intermediate_size=16,
        num_experts=num_experts, num_experts_per_tok=top_k, norm_topk_prob=norm_topk_prob,
        decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=128,
        tie_word_embeddings=False, pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=2,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, experts_implementation="eager", dtype=torch.float32)
    return model.eval()


def tiny_model_config(name: str, **arch_overrides) -> ModelConfig:
    """conf/model/tiny_<name>.yaml as a ModelConfig, with optional architecture overrides."""
    raw = yaml.safe_load((ROOT / "conf" / "model" / f"tiny_{name}.yaml").read_text())
    raw["arch"] = {**raw["arch"], **arch_overrides}
    return ModelConfig(**raw)


def left_padded(lengths: list[int], vocab: int, pad_id: int, seed: int = 0, low: int = 3) -> tuple[Tensor, Tensor]:
    """(input_ids_BS, attention_mask_BS): random prompts of the given lengths, left-padded."""
    g = torch.Generator().manual_seed(seed)
    S = max(lengths)
    ids = torch.full((len(lengths), S), pad_id, dtype=torch.long)
    mask = torch.zeros(len(lengths), S, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, S - n:] = torch.randint(low, vocab, (n,), generator=g)
        mask[b, S - n:] = 1
    return ids, mask


def base_step_on_the_kernels(name: str) -> tuple[nn.Module, MoeBudget, Tensor, object]:
    """conf/model/<name>.yaml on `base_triton` experts with `base` at M=3 on the Triton backend, 4 x 5
    token ids and a selecting step's inputs: (model, moe, ids_BS, step). `moe.remove()` after."""
    from base.hf.loading import load_model
    from base.hf.moe_block import StepInputs
    from base.method.selectors import build_selector

    cfg = ModelConfig(**yaml.safe_load((ROOT / "conf" / "model" / f"{name}.yaml").read_text()))
    model = load_model(cfg, ROOT, seed=0, experts_impl="base_triton")
    moe = install_budget(model, cfg.family, build_selector("base", model_artifacts(model)),
                         BudgetOptions(budget=3, backend="triton"))
    ids_BS = torch.randint(3, 250, (4, 5), generator=torch.Generator().manual_seed(4))
    step = StepInputs(active_T=torch.ones(ids_BS.numel(), dtype=torch.bool), select=True, recorder=None)
    return model, moe, ids_BS, step


@contextmanager
def layers_as_halves(model: nn.Module) -> Iterator[int]:
    """Inside the block every pre-norm decoder layer of `model` runs base/runtime/regional.py's
    half_layer_forward (attention half, then the MoE block with the residual stream), eagerly: the
    compiled step's layer without the compile. Yields how many layers qualified."""
    from base.runtime.regional import _half_layers, half_layer_forward

    layers = _half_layers(model)
    for layer in layers:
        layer.forward = lambda hidden_states, _l=layer, **kw: half_layer_forward(_l, hidden_states, kw)
    try:
        yield len(layers)
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Tiny models run fastest on one thread, and a busy 2-core box thrashes with more."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---- module fixtures: a test module takes one as `model = pytest.fixture(scope="module")(loaded_tiny_qwen3)`
def one_thread() -> Iterator[None]:
    """The module's tests on one thread (torch_threads); `autouse=True` for every test of it."""
    with torch_threads(1):
        yield


def loaded_tiny_qwen3() -> Iterator[nn.Module]:
    """conf/model/tiny_qwen3.yaml loaded as a run loads it (seed 0); the module's tests on one thread."""
    from base.hf.loading import load_model

    with torch_threads(1):
        yield load_model(tiny_model_config("qwen3"), ROOT, seed=0)


@contextmanager
def budgeted(model: nn.Module, family: str, selector: Selector | None, options: BudgetOptions) -> Iterator[MoeBudget]:
    budget = install_budget(model, family, selector, options)
    try:
        yield budget
    finally:
        budget.remove()


def generate(model: nn.Module, budget: MoeBudget | None, ids: Tensor, mask: Tensor, new: int, **kwargs):
    """Greedy `generate` of `new` tokens through the budget (base/eval/generate.py), with logits;
    a row fed the pad token has ended."""
    from base.eval.generate import budgeted_generate

    return budgeted_generate(model, budget, ids, mask, (PAD_ID,), max_new_tokens=new, do_sample=False,
                             pad_token_id=PAD_ID, return_dict_in_generate=True, output_logits=True, **kwargs)


# ---- observing a model -------------------------------------------------------------------------
class MoeProbe(TorchFunctionMode):
    """Records, per model forward f and MoE layer l:

    - routed[f, l]: the router's own output (idx_TK, w_TK, probs_TE, z_TH), captured by router hooks
      installed *before* the budget, so they see what the model decided;
    - applied[f, l]: (idx_TK, w_TK) the experts module was called with (after selection);
    - executed[f, l]: the expert ids whose weights the eager loop indexed (`gate_up_proj[u]`,
      `down_proj[u]`), i.e. the experts that actually ran.
    - seq_len[f]: new positions of forward f (1 in a decode step).

    Experts calls made to measure norms (oracle, energy statistics) are ignored inside `paused()`.
    Create it before `install_budget`, use it as a context manager around the forwards, then `remove()`.
    """

    def __init__(self, model: nn.Module, layers: list[MoeLayer] | None = None) -> None:
        super().__init__()
        self.layers = layers or find_moe_layers(model)
        self.forward = -1
        self.seq_len: list[int] = []
        self.routed: dict[tuple[int, int], tuple[Tensor, Tensor, Tensor, Tensor]] = {}
        self.applied: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}
        self.executed: dict[tuple[int, int], set[int]] = {}
        self._pause = 0
        self._param_layer: dict[int, int] = {}
        self._handles = [model.register_forward_pre_hook(self._on_model, with_kwargs=True)]
        for layer in self.layers:
            for pname in ("gate_up_proj", "down_proj"):
                self._param_layer[id(getattr(layer.experts, pname))] = layer.index
            self._handles.append(layer.router.register_forward_hook(
                lambda m, a, o, i=layer.index: self._on_router(i, a, o)))
            self._handles.append(layer.experts.register_forward_pre_hook(
                lambda m, a, kw, i=layer.index: self._on_experts(i, a, kw), with_kwargs=True))

    def _on_model(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        x = kwargs.get("input_ids", args[0] if args else None)
        x = x if x is not None else kwargs["inputs_embeds"]
        self.forward += 1
        self.seq_len.append(int(x.shape[1]))

    def _on_router(self, i: int, args: tuple, output: tuple) -> None:
        logits, w_TK, idx_TK = output
        z_TH = args[0].reshape(-1, args[0].shape[-1])
        probs_TE = torch.softmax(logits.reshape(z_TH.shape[0], -1).float(), dim=-1)
        self.routed[self.forward, i] = (idx_TK.clone(), w_TK.detach().clone(), probs_TE, z_TH.detach().clone())

    def _on_experts(self, i: int, args: tuple, kwargs: dict) -> None:
        if self._pause:
            return
        vals = list(args) + list(kwargs.values())
        self.applied[self.forward, i] = (vals[1].clone(), vals[2].detach().clone())
        self.executed.setdefault((self.forward, i), set())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is Tensor.__getitem__ and not self._pause:
            layer = self._param_layer.get(id(args[0]))
            if layer is not None:
                self.executed.setdefault((self.forward, layer), set()).add(int(args[1]))
        return func(*args, **(kwargs or {}))

    @contextmanager
    def paused(self) -> Iterator[None]:
        self._pause += 1
        try:
            yield
        finally:
            self._pause -= 1

    def decode_forwards(self) -> list[int]:
        return [f for f, s in enumerate(self.seq_len) if s == 1 and f > 0]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def ignore_norm_runs(monkeypatch, probe: MoeProbe) -> None:
    """Experts runs made only to measure ||E_u(z_t)|| (oracle, energy stats) are not decode work."""
    import base.hf.moe_block

    real = base.hf.moe_block.expert_norms_TK

    def wrapped(*args, **kwargs):
        with probe.paused():
            return real(*args, **kwargs)

    monkeypatch.setattr(base.hf.moe_block, "expert_norms_TK", wrapped)

