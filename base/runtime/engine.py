"""Decode engine: prefill dense, then decode steps replayed from one CUDA graph per batch size.

    engine = DecodeEngine(model, batch_size=16, max_len=640, budget=budget, eos_ids=(2,), pad_id=0)
    result = engine.generate(ids_BP, mask_BP, max_new=384)       # tokens_BN, step times
    engine.release()                                            # free the graph and the cache

Everything a decode step touches is a static buffer updated in place, so the whole step (model
forward, selection, statistics, greedy or sampled next token, finished rows) is captured once and
replayed: the KV cache (base/hf/attention.py: each attention module's buffers, written at the step's
position by the engine's attention function), the input token, per-row positions, the
key-validity mask (no attention to empty or padded cache slots), finished rows, and the generated
tokens. On a GPU each layer's attention and norms are compiled once before capture
(base/runtime/regional.py) and its q/k/v projections are one GEMM (base/hf/fused_qkv.py), so the graph holds
a few fused kernels per layer instead of dozens. Each step hands the budgeted model's MoE blocks
their inputs explicitly (base/hf/budget.py: which rows are active, select, record); the selection
state is on the device from the time the model is budgeted and the statistics accumulate in
device tensors (base/method/recorder.py), so a step never syncs the host.
On a CPU (or with graph=False) the same step function runs eagerly, and so does a model spread
over several GPUs (model.device_map=auto): a CUDA graph records one device's stream, so the
engine says so once and decodes eagerly; each layer's cache lives on that layer's GPU.

A finished row keeps decoding a pad token, but it neither scores nor adds experts (inactive), as
with transformers' generate. Rows past the real batch (a short last batch) are finished from the
start, so one graph serves every batch of an evaluation.

Shapes: B batch (static), P prompt length, L cache length (static), N new tokens, V vocabulary.
"""
from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from base.hf.attention import StaticKV
from base.hf.budget import MoeBudget, model_device
from base.hf.fused_qkv import FusedQKV
from base.hf.placement import model_devices
from base.hf.skinny_proj import SkinnyProjections
from base.runtime.regional import RegionalCompile
from base.runtime.sampling import Sampling

_SAID: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        print(message, flush=True)


@dataclass
class GenerateResult:
    tokens_BN: Tensor  # generated tokens (pad after a row finished), on the CPU
    steps: int  # decode steps run (the prefill's token is step 0 and not counted)
    step_ms: list[float]  # per graph-replayed step (CUDA events); empty when eager or untimed
    eager_steps: int  # steps run eagerly (on CPU: all; on a GPU: the warm-up before capture)


def _has_logits_to_keep(model: nn.Module) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


class DecodeEngine:
    """Static-shape prefill + decode for one batch size and cache length (see the module doc)."""

    def __init__(self, model: nn.Module, batch_size: int, max_len: int, budget: MoeBudget | None = None,
                 eos_ids: tuple[int, ...] = (), pad_id: int = 0, graph: bool | None = None,
                 sampling: Sampling | None = None, compile: bool | None = None) -> None:
        self.model, self.budget, self.B, self.L = model, budget, batch_size, max_len
        self.device = model_device(model)
        self.dtype = next(model.parameters()).dtype
        # transformers' `eager` experts loop branches on tensor values (nonzero): not capturable
        capturable = getattr(model.config, "_experts_implementation", None) != "eager"
        self.devices = model_devices(model)
        if len(self.devices) > 1:  # model.device_map=auto over several GPUs
            if graph:
                raise ValueError(f"a CUDA graph captures one device's stream; the model spans "
                                 f"{', '.join(map(str, self.devices))}: use graph=None or False")
            graph = compile = False
            _say_once(f"[engine] the model spans {', '.join(map(str, self.devices))}: a CUDA graph is captured on "
                      f"one GPU, so decode steps run eagerly there (same results, more launch overhead per step)")
        self.graph_enabled = (self.device.type == "cuda" and capturable) if graph is None else graph
        self.sampling = sampling or Sampling()
        self.pad_id = pad_id
        self._has_keep = _has_logits_to_keep(model)
        # compile the attention/norm regions where the step is replayed as a CUDA graph (None: auto)
        if compile is None:
            compile = self.graph_enabled and self.device.type == "cuda"
        self.regions = RegionalCompile(model) if compile else None
        # with the compiled regions, q/k/v in one GEMM per layer (base/hf/fused_qkv.py)
        self.fused_qkv = FusedQKV(model) if compile else None
        # and the projections on kernels/skinny.py where the tuned table says it beat cuBLAS
        # (base/hf/skinny_proj.py; F.linear for every shape without such an entry)
        self.skinny = SkinnyProjections(model) if compile else None
        dev, B, L = self.device, batch_size, max_len
        self.eos_D = torch.tensor(list(eos_ids) or [-1], dtype=torch.long, device=dev)
        self.cache = StaticKV(L, dev)
        self.tok_B1 = torch.zeros(B, 1, dtype=torch.long, device=dev)  # the token fed this step
        self.rowpos_B1 = torch.zeros(B, 1, dtype=torch.long, device=dev)  # its position in its row
        self.pos_1 = torch.zeros(1, dtype=torch.long, device=dev)  # its cache slot (same for all rows)
        self.valid_BL = torch.zeros(B, L, dtype=torch.bool, device=dev)  # cache slots a row may attend to
        self.finished_B = torch.zeros(B, dtype=torch.bool, device=dev)
        self.stop_at_eos = torch.ones((), dtype=torch.bool, device=dev)
        self.gen_i = torch.zeros(1, dtype=torch.long, device=dev)  # index of the next generated token
        self.out_BN = torch.zeros(B, 1, dtype=torch.long, device=dev)
        self._graph: torch.cuda.CUDAGraph | None = None
        self._graph_version = -1  # the recorder buffers the graph writes into (StatsRecorder.version)

    # ---- the step ----------------------------------------------------------------------------
    def _forward(self, ids: Tensor, allowed_B1QL: Tensor, pos: Tensor, decode: bool, active_T: Tensor):
        """The model without a transformers cache: attention reads and writes self.cache; the MoE
        blocks get this forward's inputs."""
        kw = {"logits_to_keep": 1} if self._has_keep else {}
        moe = self.budget.bound(self.budget.inputs(decode, active_T)) if self.budget is not None else nullcontext()
        with self.cache.active(self.model), moe:
            return self.model(input_ids=ids, attention_mask=allowed_B1QL, position_ids=pos, use_cache=False, **kw)

    def _step(self) -> None:
        """One decode step on the static buffers; no host sync (captured as is)."""
        self.cache.sync()  # the write position on a spread model's other GPUs (no-op on one)
        self.valid_BL.index_fill_(1, self.pos_1, True)
        with self.regions.enabled() if self.regions is not None else nullcontext():
            out = self._forward(self.tok_B1, self.valid_BL[:, None, None, :], self.rowpos_B1, True, ~self.finished_B)
        nxt_B = self.sampling.next_token(out.logits[:, -1])
        self._emit(nxt_B)
        self.pos_1 += 1
        self.rowpos_B1 += 1

    def _emit(self, nxt_B: Tensor) -> None:
        """Record the next token of every row; a finished row gets the pad token."""
        nxt_B = torch.where(self.finished_B, self.pad_id, nxt_B)
        self.finished_B |= self.stop_at_eos & torch.isin(nxt_B, self.eos_D)
        self.tok_B1.copy_(nxt_B[:, None])
        self.out_BN.index_copy_(1, self.gen_i.clamp(max=self.out_BN.shape[1] - 1), nxt_B[:, None])
        self.gen_i += 1

    # ---- prefill -----------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, ids_BP: Tensor, mask_BP: Tensor, max_new: int, stop_at_eos: bool = True) -> None:
        """Dense forward over the (left-padded) prompts; fills the cache and the first new token.
        Rows beyond ids_BP's batch are padding rows, finished from the start."""
        b, P = ids_BP.shape
        if b > self.B or P + max_new > self.L:
            raise ValueError(f"batch {b} x {P}+{max_new} tokens exceed the engine's {self.B} x {self.L}")
        dev, B = self.device, self.B
        ids = torch.full((B, P), self.pad_id, dtype=torch.long, device=dev)
        mask = torch.zeros(B, P, dtype=torch.long, device=dev)
        ids[:b], mask[:b] = ids_BP.to(dev), mask_BP.to(dev)
        mask[b:, -1] = 1  # padding rows: one token, so no row attends to nothing
        if not self.cache.owns(self.model):  # first prefill, or another engine used the model since
            self.cache.claim(self.model)
            self._graph = None
        self.cache.zero_()
        self.valid_BL.zero_()
        self.valid_BL[:, :P] = mask.bool()
        # positions as transformers' generate computes them for left padding
        pos_BP = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        causal_PP = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
        mask_B1PL = torch.zeros(B, 1, P, self.L, dtype=torch.bool, device=dev)
        mask_B1PL[:, 0, :, :P] = causal_PP & mask.bool()[:, None, :]
        mask_B1PL[:, 0, :, :P] |= torch.eye(P, dtype=torch.bool, device=dev)  # pad queries: themselves
        self.cache.set_write_pos(torch.arange(P, device=dev))
        out = self._forward(ids, mask_B1PL, pos_BP, False, mask.reshape(-1).bool())
        self.cache.set_write_pos(self.pos_1)  # decode steps write at pos_1 (the graph reads this tensor)
        self.cache.host_len = P
        if self.out_BN.shape[1] < max_new:
            self.out_BN = torch.zeros(B, max_new, dtype=torch.long, device=dev)
            self._graph = None  # it wrote into the old buffer
        self.finished_B.zero_()
        self.finished_B[b:] = True
        self.stop_at_eos.fill_(stop_at_eos)
        self.gen_i.zero_()
        self.pos_1.fill_(P)
        self.rowpos_B1.copy_(pos_BP[:, -1:] + 1)
        self._emit(self.sampling.next_token(out.logits[:, -1]))

    # ---- decoding ----------------------------------------------------------------------------
    def _capture(self) -> None:
        """Capture `_step` after one eager warm-up step on a side stream (compiles kernels, fills
        lazy state); that warm-up is a real decode step."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self._step()
        except RuntimeError as err:
            impl = getattr(self.model.config, "_experts_implementation", None)
            raise RuntimeError(
                f"the decode step cannot be captured in a CUDA graph ({err}); experts implementation "
                f"{impl!r}, dtype {self.dtype}. Use model.experts_impl=base_triton (or grouped_mm in bf16), "
                f"or decode eagerly (eval.engine=off)") from err
        self._graph = graph
        self._graph_version = self.budget.recorder.version if self.budget is not None else -1

    def _graph_stale(self) -> bool:
        """A graph writes statistics into the recorder buffers it was captured with; once the
        recorder has grown (a long evaluation), the step is captured again."""
        return self.budget is not None and self.budget.recorder.version != self._graph_version

    @torch.no_grad()
    def decode(self, steps: int, timed: bool = False,
               after_step: Callable[[int], None] | None = None) -> tuple[list[float], int]:
        """Run `steps` decode steps after a prefill. Returns (per-step ms of timed graph replays,
        steps run eagerly). `after_step(i)` runs on the host after step i (it may sync)."""
        if self.budget is not None:
            self.budget.recorder.reserve(steps + 1)
        eager, events = 0, []
        for i in range(steps):
            if not self.graph_enabled:
                self._step()
                eager += 1
            elif self._graph is None or self._graph_stale():
                self._capture()  # runs step i eagerly
                eager += 1
            else:
                if timed:
                    events.append(torch.cuda.Event(enable_timing=True))
                    events[-1].record()
                self._graph.replay()
            if after_step is not None:
                after_step(i)
        if timed and events:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            events.append(end)
            torch.cuda.synchronize()
            ms = [a.elapsed_time(b) for a, b in itertools.pairwise(events)]
        else:
            ms = []
        if self.budget is not None:
            self.budget.recorder.advance_host(steps - eager)
        self.cache.host_len += steps
        return ms, eager

    @torch.no_grad()
    def generate(self, ids_BP: Tensor, mask_BP: Tensor, max_new: int, stop_at_eos: bool = True,
                 stop: Callable[[Tensor], Tensor] | None = None, timed: bool = False) -> GenerateResult:
        """Prefill, then decode until max_new tokens or every row is finished.

        `stop(tokens_bN) -> finished_b` (host, bool per real row) is asked after every step with
        the tokens so far: a row it marks stops scoring and adding experts from the next step on.
        Without `stop` the loop never syncs the host until the end."""
        b = ids_BP.shape[0]
        self.prefill(ids_BP, mask_BP, max_new, stop_at_eos)
        state = {"done": False}

        def check(i: int) -> None:
            toks = self.out_BN[:b, : i + 2].cpu()
            done_b = stop(toks) | self.finished_B[:b].cpu()
            self.finished_B[:b] = done_b.to(self.device)
            state["done"] = bool(done_b.all())

        if stop is not None:
            check(-1)  # the prefill's token may already end a row
        ms, eager, steps = [], 0, 0
        # Decode in chunks so a host stop check can end the loop early (per step when stop is set).
        while steps < max_new - 1 and not state["done"]:
            chunk = 1 if stop is not None else max_new - 1 - steps
            m, e = self.decode(chunk, timed=timed,
                               after_step=(lambda i, s=steps: check(s + i)) if stop is not None else None)
            ms += m
            eager += e
            steps += chunk
        return GenerateResult(self.out_BN[:b, : steps + 1].cpu(), steps, ms, eager)

    def release(self) -> None:
        """Free the graph and the cache (another budget or batch size needs its own) and restore
        the model's own forwards."""
        self._graph = None
        self.cache.release(self.model)
        self.cache = StaticKV(self.L, self.device)
        if self.regions is not None:
            self.regions.remove()
            self.regions = None
        if self.skinny is not None:  # before the fused q/k/v, whose module it changed
            self.skinny.remove()
            self.skinny = None
        if self.fused_qkv is not None:
            self.fused_qkv.remove()
            self.fused_qkv = None
