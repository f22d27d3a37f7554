"""Generation requests decoded as concurrent serving would batch them.

    batches = DecodeBatches(model, tokenizer, budget, codec, 16, eval_cfg, seed=0, max_length=2048, device=dev)
    texts = batches.run(requests)              # one text per Request, in the requests' order
    batches.release()

lm-eval sorts generation requests by length, which groups similar requests and hides the union
growth BASE targets; with `order=mixed` the requests of all tasks of a run are shuffled with the
batching seed, each keeping its own stop strings and token limit. Then, by `eval.batching`:

    continuous  `batch_size` slots of the engine (base/runtime/continuous.py, scheduled by
                base/runtime/scheduler.py): a finished request's slot takes the next request in
                that order, so every step decodes as many requests as there are (a server's view)
    static      batches of `batch_size` in that order, each decoded until its longest request ends
                (finished rows stay, inactive), through the engine (CUDA graphs on a GPU, one graph
                for every batch) or transformers' generate (base/eval/generate.py); with
                `eval.fidelity` the dense continuation is then re-decoded teacher-forced in the
                same batch (base/eval/fidelity.py)

It keeps which requests shared a batch (static) or an admission round (continuous), each
request's decode steps and the steps' timing, which the run's tables report.

Shapes: B rows, P prompt positions, N new tokens.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from base.config import EvalConfig, SchedulerConfig, cache_length
from base.eval.fidelity import teacher_forced
from base.eval.generate import budgeted_generate, ended_token_ids
from base.eval.stops import RowStops
from base.hf.budget import MoeBudget
from base.progress import progress
from base.runtime.scheduler import ServeStats


@dataclass(frozen=True)
class Request:
    context: str
    until: list[str]  # stop strings
    max_new: int  # new-token limit
    task: str
    doc_id: int


class Codec(Protocol):
    """Tokenisation as lm-eval's HFLM does it (left padding, truncation, special tokens)."""

    def tok_batch_encode(self, strings: list[str], left_truncate_len: int | None = None) -> tuple[Tensor, Tensor]: ...
    def tok_encode(self, string: str) -> list[int]: ...
    def tok_decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str: ...


def _truncate(text: str, until: list[str]) -> str:
    for stop in until:
        if stop:
            text = text.split(stop)[0]
    return text


class DecodeBatches:
    """Decode batches of one evaluation (see the module doc) and what they did."""

    def __init__(self, model: nn.Module, tokenizer, budget: MoeBudget | None, codec: Codec, batch_size: int,
                 cfg: EvalConfig, seed: int, max_length: int, device: torch.device,
                 scheduler: SchedulerConfig | None = None) -> None:
        self.model, self.tok, self.budget, self.codec = model, tokenizer, budget, codec
        self.batch_size, self.cfg, self.seed, self.max_length, self.device = batch_size, cfg, seed, max_length, device
        self.scheduler = scheduler or SchedulerConfig()  # continuous batching: prefill and when
        self.use_engine = cfg.engine == "on" or (cfg.engine == "auto" and self.device.type == "cuda")
        self.ended = ended_token_ids(model, tokenizer)
        self._engine = None
        self.decode_batches = 0
        self.decode_steps = 0  # decode forwards over all batches
        self.decode_steps_by_task: dict[str, int] = {}  # row decode steps per task (the budget applies to these)
        self.fidelity_rows: list[dict[str, float]] = []  # eval.fidelity: one row per (decode batch, step)
        self.fidelity_of: dict[tuple[str, int], dict[str, float]] = {}  # eval.fidelity: (task, doc id) -> its sums
        self.batch_of: dict[tuple[str, int], int] = {}  # (task, doc id) -> its decode batch (admission round)
        self.lengths: dict[tuple[str, int], tuple[int, int]] = {}  # (task, doc id) -> (prompt, new) tokens
        self.serve_stats: ServeStats | None = None  # continuous batching: occupancy and step times
        self.stop_mode = "host"  # continuous batching: where stop strings end requests (device | host)
        self.compiled_prefill = False  # ... whether its packed prefills ran through compiled regions (a GPU)

    def order(self, requests: list[Request]) -> list[int]:
        """Request indices in decoding order: mixed (seeded shuffle) or lm-eval's longest first."""
        order = list(range(len(requests)))
        if self.cfg.order == "mixed":
            random.Random(self.seed).shuffle(order)
        else:
            order.sort(key=lambda i: -len(self.codec.tok_encode(requests[i].context)))
        return order

    def run(self, requests: list[Request], disable_tqdm: bool = False) -> list[str]:
        """One text per request; a progress bar of finished requests (base/progress.py)."""
        if self.cfg.batching == "continuous":
            return self._serve(requests, disable_tqdm)
        results: list[str | None] = [None] * len(requests)
        order = self.order(requests)
        bs = self.batch_size
        for start in progress(range(0, len(order), bs), desc="decode", unit="batch", disable=disable_tqdm):
            ids = order[start:start + bs]
            texts, row_steps, prompt_tokens = self._decode([requests[i] for i in ids])
            for i, text, n, p in zip(ids, texts, row_steps, prompt_tokens):
                r = requests[i]
                results[i] = text
                self.batch_of[(r.task, r.doc_id)] = self.decode_batches - 1
                self.lengths[(r.task, r.doc_id)] = (p, n + 1)
                self.decode_steps_by_task[r.task] = self.decode_steps_by_task.get(r.task, 0) + n
        return results  # type: ignore[return-value]

    def _serve(self, requests: list[Request], disable_tqdm: bool = False) -> list[str]:
        """Every request through the continuous-batching engine, admitted in `order`."""
        from base.runtime.continuous import ContinuousEngine
        from base.runtime.sampling import Sampling
        from base.runtime.scheduler import Request as EngineRequest
        from base.runtime.scheduler import serve

        order = self.order(requests)
        eos = {self.tok.eos_token_id} | ({self.tok.pad_token_id} - {None})
        table = self._stop_table([requests[i].until for i in order])
        jobs = []
        for i in order:
            r = requests[i]
            ids, _ = self.codec.tok_batch_encode([r.context], left_truncate_len=self.max_length - r.max_new)
            stop = RowStops(self.tok, 0, [r.until], [r.max_new], eos)  # the host's check, for stops off the device
            jobs.append(EngineRequest(ids[0].tolist(), r.max_new,
                                      done=lambda toks, s=stop: bool(s.done_rows(torch.tensor([toks]))[0]),
                                      stops=table.mask(r.until) if table is not None else 0))
        need = max(len(j.ids) + j.max_new for j in jobs)
        c = self.cfg
        sampling = Sampling(True, c.temperature, c.top_k, c.top_p) if c.do_sample else Sampling()
        engine = ContinuousEngine(self.model, self.batch_size, cache_length(need), budget=self.budget,
                                  eos_ids=tuple(sorted(eos)), pad_id=self.tok.pad_token_id, sampling=sampling,
                                  buckets=self.scheduler.buckets,
                                  stops=table)
        self.compiled_prefill = engine.regions is not None and self.scheduler.packing == "packed"
        bar = progress(total=len(jobs), desc="decode", unit="request", disable=disable_tqdm)
        try:
            done, self.serve_stats = serve(engine, jobs, self.tok.pad_token_id, pick=self._admission(jobs),
                                           policy=self.scheduler, progress=bar.update)
        finally:
            bar.close()
            engine.release()
        results: list[str | None] = [None] * len(requests)
        for i, job, d in zip(order, jobs, done):
            r = requests[i]
            results[i] = _truncate(self.codec.tok_decode(d.tokens[:r.max_new], skip_special_tokens=True), r.until)
            self.batch_of[(r.task, r.doc_id)] = d.round
            self.lengths[(r.task, r.doc_id)] = (len(job.ids), len(d.tokens))
            self.decode_steps_by_task[r.task] = self.decode_steps_by_task.get(r.task, 0) + d.decode_steps
        self.decode_batches = self.serve_stats.rounds
        self.decode_steps = self.serve_stats.steps
        return results  # type: ignore[return-value]

    def _stop_table(self, untils: list[list[str]]):
        """The requests' stop strings as the engine's device table (base/runtime/stops.py), and
        where they are matched: `stop_mode` is "device" when every stop string is in the table,
        else "host" (a tokenizer whose decode the table cannot follow, or more than 63 strings:
        those stops end their requests one step late, counted in late_rows)."""
        from base.runtime.stops import StopTable, token_pieces

        pieces = token_pieces(self.tok)
        vocab = self.model.get_output_embeddings().weight.shape[0]
        table = StopTable.build(pieces, untils, vocab, self.device) if pieces is not None else None
        strings = {s for u in untils for s in u if s}
        self.stop_mode = "device" if not strings or (table is not None and strings <= set(table.strings)) else "host"
        return table

    def _admission(self, jobs: list):
        """fifo: the mixed order; union: by predicted experts (one dense probe forward per prompt)."""
        from base.runtime.admission import UnionAdmission, fifo, prompt_experts

        if self.scheduler.admission == "fifo":
            return fifo
        per_layer = 2 * self.budget.layers[0].top_k
        predicted = [prompt_experts(self.model, self.budget, j.ids, per_layer) for j in jobs]
        return UnionAdmission(lambda i: predicted[i], self.scheduler.max_wait_rounds)

    def _decode(self, batch: list[Request]) -> tuple[list[str], list[int], list[int]]:
        """One decode batch: texts, each row's decode steps until it finished, its prompt tokens."""
        untils, max_new = [r.until for r in batch], [r.max_new for r in batch]
        enc, mask = self.codec.tok_batch_encode([r.context for r in batch],
                                                left_truncate_len=self.max_length - max(max_new))
        enc, mask = enc.to(self.device), mask.to(self.device)
        eos = {self.tok.eos_token_id} | ({self.tok.pad_token_id} - {None})
        stops = RowStops(self.tok, enc.shape[1], untils, max_new, eos)
        if self.use_engine:
            new = self._engine_for(enc.shape[1] + max(max_new), eos).generate(
                enc, mask, max(max_new), stop=stops.done_rows).tokens_BN
        else:
            out = budgeted_generate(self.model, self.budget, enc, mask, self.ended, stops, max_new_tokens=max(max_new),
                                    pad_token_id=self.tok.pad_token_id, use_cache=True, **self._sampling())
            new = out[:, enc.shape[1]:]
        if self.cfg.fidelity and self.budget is not None:
            dense_stops = RowStops(self.tok, enc.shape[1], untils, max_new, eos)
            steps, per_row = teacher_forced(self.model, self.budget, enc, mask, dense_stops, max(max_new),
                                            self.tok.pad_token_id, self.ended)
            self.fidelity_rows += [{"decode_batch": self.decode_batches, **row} for row in steps]
            self.fidelity_of.update({(r.task, r.doc_id): sums for r, sums in zip(batch, per_row)})
        self.decode_batches += 1
        self.decode_steps += max(0, new.shape[1] - 1)  # the first new token comes from the prefill
        row_steps = [max(0, stops.lengths.get(i, new.shape[1]) - 1) for i in range(len(batch))]
        texts = [_truncate(self.codec.tok_decode(row[:n], skip_special_tokens=True), until)
                 for row, until, n in zip(new.tolist(), untils, max_new)]
        return texts, row_steps, mask.sum(-1).tolist()

    def _sampling(self) -> dict[str, Any]:
        c = self.cfg
        if c.do_sample:
            return {"do_sample": True, "temperature": c.temperature, "top_p": c.top_p, "top_k": c.top_k}
        return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}

    def _engine_for(self, need: int, eos: set[int]):
        """One engine for the evaluation (one CUDA graph reused by every batch; a short last batch
        fills its spare rows with finished padding), rebuilt only for a longer cache. The host
        checks the stop strings after every step, so rows finish exactly when generate's would."""
        from base.runtime.engine import DecodeEngine
        from base.runtime.sampling import Sampling

        if self._engine is None or self._engine.L < need:
            if self._engine is not None:
                self._engine.release()
            c = self.cfg
            sampling = Sampling(True, c.temperature, c.top_k, c.top_p) if c.do_sample else Sampling()
            self._engine = DecodeEngine(self.model, self.batch_size, cache_length(need), budget=self.budget,
                                        eos_ids=tuple(sorted(eos)), pad_id=self.tok.pad_token_id, sampling=sampling)
        return self._engine

    def release(self) -> None:
        if self._engine is not None:
            self._engine.release()
            self._engine = None
