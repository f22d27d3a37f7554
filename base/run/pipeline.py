"""The stages of a run, from a validated RunConfig to a finished run folder.

    calibrate   dense forward over calibration text; per-layer routing and expert-norm statistics
    fit         the per-layer linear predictor of log||E_u(z)||, with held-out R^2
    evaluate    lm-eval tasks over the budgeted model; metrics + selection statistics
    throughput  timed decode steps for the configured batch sizes and budgets
    describe    build the model (meta device is enough) and report its MoE shape
"""
from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from base.config import ConfigError, RunConfig
from base.files import atomic_write_text
from base.hf.budget import BudgetOptions, MoeBudget, install_budget
from base.hf.families import find_moe_layers
from base.hf.loading import load_model, load_tokenizer
from base.hf.placement import model_devices
from base.method.selectors import SELECTORS, build_selector
from base.run import dense_reuse, outputs, run_folder
from base.run.artifacts import ensure_calibration, ensure_predictor, selector_artifacts
from base.run.logger import Logger, run_identity
from base.run.preflight import preflight
from base.run.provenance import CONTINUOUS_VERSION, commit, provenance
from base.run.report import report_text
from base.run.sweep import host_info
from base.runtime.throughput import Variant, expert_bytes
from kernels.experts import ffn_waits_given_up


def make_budgeter(cfg: RunConfig, model, tokenizer, layers, name: str | None = None,
                  k0: int | None = None, shrink: float | str | None = None) -> tuple[Any, dict]:
    """A function (budget, record_stats) -> MoeBudget installed on the model for a method (the
    run's by default, with its method.shrink), and where its artifacts came from. shrink="auto":
    the value the diagnostic finds best at each budget (base/run/diagnose.py resolve_shrink)."""
    m = cfg.method
    if name is None:  # the run's own method
        name, k0, shrink = m.name, m.k0, m.shrink_value()
    if name == "dense":
        selector, info = None, {}
    else:
        cls = SELECTORS.get(name)
        arts, info = selector_artifacts(cfg, cls, model, tokenizer, layers)
        fixed = None if shrink == "auto" else shrink
        selector = build_selector(name, arts, k0=k0, coverage=m.coverage if name == m.name else None, shrink=fixed)

    split: dict[str, Any] = {}  # budget_split=sensitivity: the calibrated loss curves, once

    def layer_budgets(budget: int | None) -> dict[int, int] | None:
        if m.budget_split != "sensitivity" or budget is None or selector is None:
            return None
        from base.method.budget_split import loss_curves, split_budget

        if "curves" not in split:
            calib, _ = ensure_calibration(cfg, model, tokenizer, layers, recompute=False)
            split["curves"] = loss_curves(calib, cfg.batch_size)
        budgets = split_budget(split["curves"], budget, [lyr.index for lyr in layers])
        info.setdefault("layer_budgets", {})[str(budget)] = budgets
        return budgets

    def make(budget: int | None, record_stats: bool | None = None) -> MoeBudget:
        record = cfg.stats.enabled if record_stats is None else record_stats
        sel_here = selector
        if shrink == "auto" and selector is not None and budget is not None:
            from base.run.diagnose import resolve_shrink

            alpha, chosen = resolve_shrink(cfg, model, tokenizer, layers, name, k0, budget, make_budgeter)
            info.setdefault("shrink", {})[str(budget)] = {"alpha": alpha, "diagnostic": chosen}
            sel_here = build_selector(name, arts, k0=k0, shrink=alpha)
        fidelity = cfg.eval.fidelity and record and cfg.stage == "evaluate"
        opts = BudgetOptions(budget=budget, reassign=m.reassign, renormalize=m.renormalize,
                             apply_to=m.apply_to, record_stats=record,
                             energy=(cfg.stats.energy or fidelity) and record, fidelity=fidelity, backend=m.backend,
                             layer_budgets=layer_budgets(budget))
        # budget=None with a budgeted selector is the dense baseline of a throughput sweep.
        adaptive = sel_here is not None and (not sel_here.uses_budget or sel_here.coverage is not None)
        sel = sel_here if (budget is not None or adaptive) else None
        return install_budget(model, cfg.model.family, sel, opts)

    return make, info


def cpu_timing_note(cfg: RunConfig, model) -> str | None:
    """What a throughput run's times are where they are not a GPU's (None on a GPU): said at start
    and kept in report.json (`timing_note`), which analysis.throughput prints above its tables."""
    if next(model.parameters()).device.type == "cuda":
        return None
    note = "on a CPU the times are a smoke test of the pipeline, not a speed measurement"
    if cfg.method.backend == "triton" or getattr(model.config, "_experts_implementation", None) == "base_triton":
        note += ("; the Triton kernels (method.backend=triton, model.experts_impl=base_triton: experiment=throughput's "
                 "settings) run in Triton's interpreter, hundreds of times slower than PyTorch here, so their times and "
                 "speed-ups say nothing about the method (a CPU smoke test: stage=throughput without the experiment)")
    return note


def throughput_variants(cfg: RunConfig) -> list[Variant]:
    """The configurations of a throughput run: dense first, then each method at each budget."""
    tp = cfg.throughput
    specs = tp.specs or [{"method": "dense", "k0": None, "impl": None},
                         {"method": cfg.method.name, "k0": cfg.method.k0, "impl": None}]
    budgets = tp.budgets or ([cfg.budget] if cfg.budget is not None else [])
    out: list[Variant] = []
    for spec in specs:
        name = spec["method"]
        if name == "dense" or not SELECTORS.get(name).uses_budget:
            out.append(Variant(name, None, spec["k0"], spec["impl"]))
        else:
            out += [Variant(name, b, spec["k0"], spec["impl"]) for b in budgets]
    out = list(dict.fromkeys(out))
    # the dense reference first
    out.sort(key=lambda v: v.method != "dense" or v.experts_impl is not None)
    return out


def describe(cfg: RunConfig, model, layers) -> dict[str, Any]:
    """The MoE shape, and the memory the model needs: weights and the decode engine's KV cache at
    the throughput shapes (prompt_len + gen_tokens per sequence, each batch size), and the GPUs of
    describe.gpu_gb it takes (base/runtime/memory.py)."""
    from base.runtime.memory import memory_estimate

    c = model.config
    experts = layers[0].experts
    expert_params = sum(p.numel() for p in experts.parameters()) // layers[0].num_experts
    total = sum(p.numel() for p in model.parameters())
    k = layers[0].top_k
    tp = cfg.throughput
    memory = memory_estimate(model, c, getattr(torch, cfg.model.dtype), [*tp.batch_sizes, cfg.batch_size],
                             tp.prompt_len + tp.gen_tokens, cfg.describe.gpu_gb)
    return {
        "model": cfg.model.name, "family": cfg.model.family, "hf_model_type": c.model_type,
        "num_hidden_layers": c.num_hidden_layers, "moe_layers": len(layers),
        "num_experts": layers[0].num_experts, "top_k": k, "hidden_size": c.hidden_size,
        "params_total": total,
        "params_active_per_token": total - len(layers) * (layers[0].num_experts - k) * expert_params,
        "expert_params": expert_params,
        "expert_bytes": expert_bytes(layers[0]),
        "device": str(next(model.parameters()).device),
        "devices": [str(d) for d in model_devices(model)],
        "memory": memory,
    }


def run(cfg: RunConfig, resolved_config: str, extra_files: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The run into cfg.out_dir. Its files are written beside it and swapped in when complete, so a
    finished result there stays whole until its replacement is (base/run/run_folder.py: publish); a
    folder that is not this run's own is refused, and two runs of one folder take turns (its lock).
    extra_files (relative path -> text) are written into the run folder with its results."""
    out = cfg.out_dir
    chash = outputs.config_hash(resolved_config)
    run_folder.check_target(out, cfg.run_key)
    if _put_back_kept_run(cfg, resolved_config):
        return None
    if _finished_before(cfg, resolved_config, chash):
        return None
    preflight(cfg)  # every bad input fails here, before anything is written or loaded
    with run_folder.run_lock(out):
        run_folder.recover(out)
        run_folder.check_target(out, cfg.run_key)  # as it is now, after any run that held the lock
        if _put_back_locked(cfg, resolved_config):  # another run moved it aside while this one waited
            return None
        if _finished_before(cfg, resolved_config, chash, say=False):  # another run finished it while this one waited
            print(f"[base] {out} was finished by another run meanwhile (same config); skipping.")
            return None
        keep = _kept_name(cfg, resolved_config)
        if (sibling := dense_reuse.dense_sibling(cfg, resolved_config, lambda p: _older_engine(cfg, p))) is not None:
            stage = run_folder.staging_dir(out)
            try:
                report = dense_reuse.copy_run(sibling, stage, cfg, resolved_config, chash, extra_files or {})
                with open(stage / "run.log", "a") as log:
                    log.write("\n" + report_text(report, out))
            except OSError:  # the sibling changed under the copy (a rerun of it swapped its folder): decode
                shutil.rmtree(stage, ignore_errors=True)
            else:
                run_folder.publish(stage, out, keep)
                return report
        stage = run_folder.staging_dir(out, RESUMABLE, resolved_config)
        try:
            report = _run_into(dataclasses.replace(cfg, out_dir=stage), resolved_config, chash, extra_files or {})
        except ConfigError:  # a bad input found after preflight: the run leaves nothing
            shutil.rmtree(stage, ignore_errors=True)
            raise
        with open(stage / "run.log", "a") as log:  # the log ends with what the run prints at its end
            log.write("\n" + report_text(report, out))
        run_folder.publish(stage, out, keep)
        if keep is not None:
            print(f"[base] the earlier run in {out} is kept as {keep}")
    return report


def _finished_before(cfg: RunConfig, resolved_config: str, chash: str, say: bool = True) -> bool:
    """Is out_dir a finished, intact run of this config (skipped unless force)? Says what it found.
    A finished run of another config (a task file or a default changed since), or of an older
    engine, is not replaced: it is kept beside the new one (`_kept_name`)."""
    out = cfg.out_dir
    done = outputs.finished_hash(out)
    note = print if say else (lambda *a, **k: None)
    if outputs.same_config(resolved_config, done) and not cfg.force and _older_engine(cfg):
        note(f"[base] {out} is finished, but its continuous-batching decode ran on an older engine "
             f"(base/run/provenance.py: version {_older_engine(cfg)}, now {CONTINUOUS_VERSION}); running it again "
             f"(the earlier run is kept beside it)")
        return False
    if outputs.same_config(resolved_config, done) and not cfg.force:
        damage = outputs.damaged(out)
        if damage:
            note(f"[base] {out} is finished but damaged ({'; '.join(damage)}); replacing it")
            return False
        note(f"[base] {out} is finished (report.json exists, same config){_made_elsewhere(cfg)}; skipping. "
             f"force=true reruns it; `python -m base.run.log_run {out}` logs it to wandb as it is.")
        return True
    if done is not None and not outputs.same_config(resolved_config, done):
        note(f"[base] {out} holds a finished run of another config (hash {done or 'none'} -> {chash}); running this "
             f"one (the earlier run is kept beside it)")
    return False


def _made_elsewhere(cfg: RunConfig) -> str:
    """", made at commit X, not this checkout's Y" where the finished run's report names another commit
    than this checkout's (a code change no config shows: the skip keeps the earlier code's result);
    else "". Said, not acted on: a finished run of the same config is skipped whatever made it."""
    made = ((outputs.read_report(cfg.out_dir) or {}).get("provenance") or {}).get("commit")
    now = commit(cfg.root).get("commit") if made else None
    return f", made at commit {made}, not this checkout's {now}" if made and now and made != now else ""


def _put_back_kept_run(cfg: RunConfig, resolved_config: str) -> bool:
    """Is a finished, intact run of this config kept beside out_dir (`<run>~<hash>`: moved aside
    when a run of another config took the folder, e.g. a default changed and changed back)? Then
    it is put back instead of run again, and the run it replaces goes aside in its turn. Not with
    force=true, nor where out_dir holds anything but a finished run of another config or Hydra's
    files of this start (a stopped run's files stay where a resume finds them)."""
    out = cfg.out_dir
    if not out.parent.is_dir() or not any(p.name.startswith(f"{out.name}~") for p in out.parent.iterdir()):
        return False  # nothing kept beside it: no lock taken
    with run_folder.run_lock(out):
        run_folder.recover(out)
        return _put_back_locked(cfg, resolved_config)


def _put_back_locked(cfg: RunConfig, resolved_config: str) -> bool:
    """_put_back_kept_run's work, with out_dir's lock held."""
    out = cfg.out_dir
    if cfg.force or outputs.same_config(resolved_config, outputs.finished_hash(out)):
        return False
    kept = next((p for p in sorted(out.parent.iterdir()) if p.name.startswith(f"{out.name}~") and p.is_dir()
                 and ((held := run_folder.marker_run(p)) is None or run_folder.same_run(held, cfg.run_key))
                 and outputs.same_config(resolved_config, outputs.finished_hash(p)) and not outputs.damaged(p)
                 and not _older_engine(cfg, p)), None)
    if kept is None:
        return False
    done = outputs.finished_hash(out)
    if done is not None:  # a finished run of another config: kept in its turn
        aside = _kept_name(cfg, resolved_config)
        out.rename(aside)
    elif out.exists() and {p.name for p in out.iterdir()} - set(run_folder.HYDRA_FILES):
        return False  # a stopped run's files: where its resume finds them
    else:
        aside = None
        shutil.rmtree(out, ignore_errors=True)  # at most Hydra's files of this start
    kept.rename(out)
    print(f"[base] {out}: the finished run of this config kept as {kept.name} is put back instead of run again"
          + (f"; the run of another config that was there is kept as {aside.name}" if aside else ""), flush=True)
    return True


def _kept_name(cfg: RunConfig, resolved_config: str) -> Path | None:
    """Where the finished run in out_dir goes when this run replaces it without being the same
    measurement (another config, an older engine): `<run>~<its config hash or engine>`, a run folder
    of its own. None: nothing to keep (no finished run, a damaged one, or force=true on the same config)."""
    out = cfg.out_dir
    done = outputs.finished_hash(out)
    if done is None:
        return None
    if not outputs.same_config(resolved_config, done):
        tag = done or "old"
    elif _older_engine(cfg) and not cfg.force:
        tag = f"engine{_older_engine(cfg)}"
    else:
        return None
    name = f"{out.name}~{tag}"
    n = 1
    while (out.parent / name).exists():
        n += 1
        name = f"{out.name}~{tag}.{n}"
    return out.parent / name


def _older_engine(cfg: RunConfig, folder: Path | None = None) -> int | None:
    """The engine version of a finished continuous-batching evaluation in `folder` (out_dir) when
    older than this code's (a report without provenance: 1, or 2 when its config has a scheduler section)."""
    folder = cfg.out_dir if folder is None else folder
    if cfg.stage != "evaluate" or cfg.eval.batching != "continuous":
        return None
    report = outputs.read_report(folder)
    if report is None:
        return None
    version = ((report.get("provenance") or {}).get("engine") or {}).get("version")
    if version is None:
        recorded = folder / "config.yaml"
        version = 2 if recorded.exists() and "scheduler" in outputs.load_config(recorded.read_text()) else 1
    return version if version < CONTINUOUS_VERSION else None


def _check_expert_waits(before: int) -> None:
    """Fail the run, before its report is written, if a wait of the one-launch expert FFN gave up
    during it (kernels/experts.py, `ffn_waits_given_up`): its down items then read activations not
    yet written, so the run's outputs are wrong, not just slow."""
    given_up = ffn_waits_given_up() - before
    if given_up:
        raise RuntimeError(
            f"{given_up} wait(s) of the one-launch expert FFN (_ffn_kernel) gave up during this run, so some "
            "MoE outputs read activations not yet written and the run's results are wrong; no report was written. "
            "A wait gives up when a program it needs is not resident for seconds: another process's kernels on "
            "this GPU (MPS, a shared device) or a wrong occupancy count. Rerun on a GPU of its own.")


def _run_into(cfg: RunConfig, resolved_config: str, chash: str, extra_files: dict[str, str]) -> dict[str, Any]:
    out = cfg.out_dir
    run_folder.write_marker(out, cfg.run_key, chash)
    atomic_write_text(out / "config.yaml", resolved_config)
    for name, text in extra_files.items():
        atomic_write_text(out / name, text)
    identity = run_identity(cfg.experiment, cfg.model.name, cfg.method.name, cfg.budget, cfg.stage, cfg.overrides)
    logger = Logger(cfg.logger, identity, outputs.load_config(resolved_config))
    log_file = _log_to(out / "run.log")
    ok = False
    try:
        t0 = time.perf_counter()
        torch.manual_seed(cfg.seed)
        model = load_model(cfg.model, cfg.root, seed=cfg.seed, experts_impl=cfg.model.experts_impl)
        layers = find_moe_layers(model)
        report: dict[str, Any] = {
            "stage": cfg.stage, "model": cfg.model.name, "method": cfg.method.name, "budget": cfg.budget,
            "batch_size": cfg.batch_size, "seed": cfg.seed, "num_experts": layers[0].num_experts,
            "moe_layers": len(layers), "top_k": layers[0].top_k, "overrides": cfg.overrides, "config_hash": chash,
            "routing": cfg.model.routing, "skew": getattr(model, "base_skew_report", None),
            "host": host_info(),
        }
        given_up = ffn_waits_given_up()
        if cfg.stage == "describe":
            report["describe"] = describe(cfg, model, layers)
        else:
            _run_stage(cfg, model, layers, report, logger)
        _check_expert_waits(given_up)
        report.setdefault("provenance", commit(cfg.root))  # stages that decode nothing: the code only
        report["wall_s"] = time.perf_counter() - t0
        report["files"] = outputs.line_counts(out)  # a rerun checks them before skipping the run as finished
        logger.metrics({k: v for k, v in report.get("summary", {}).items() if isinstance(v, (int, float))})
        if logger.offline():
            report["wandb"] = logger.offline()  # its folder and `wandb sync` command, shown at the run's end
        outputs.write_report(out, report, outputs.PENDING_REPORT)  # last: publish makes it report.json
        ok = True
    finally:
        logger.finish(ok)  # a failed run is marked failed in wandb, not finished
        logging.getLogger().removeHandler(log_file)
        log_file.close()
    return report


# Files a stopped attempt of a run wrote as it went, carried into the rerun's folder to resume from
# (base/run/run_folder.py staging_dir): a serve run's finished streams and step probes.
RESUMABLE = ("requests.jsonl", "serve_streams.jsonl", "step_probe.jsonl", "stream_rows.jsonl",
             "throughput_rows.jsonl", "profile_rows.jsonl", "kernel_rows.jsonl")


def _serve_stage(cfg: RunConfig, model, make_variant, report: dict[str, Any], logger: Logger) -> None:
    """throughput.mode=serve: requests.jsonl (one record per request) and serve.csv (one row per
    stream), rewritten after every stream so that a run stopped midway keeps what it served; the
    same command then resumes from it (base/runtime/serving.py: only what is missing is served)."""
    from base.runtime.serving import Earlier, measure_serving

    out = cfg.out_dir
    tag = {"model": cfg.model.name, "routing": cfg.model.routing}
    earlier = Earlier(*(outputs.read_jsonl(out / name) for name in ("requests.jsonl", "serve_streams.jsonl",
                                                                     "step_probe.jsonl")))
    if earlier.streams:
        print(f"[base] resuming: {len(earlier.streams)} streams served by a stopped attempt of this run are kept",
              flush=True)

    def emit(requests: list[dict], streams: list[dict], probes: list[dict]) -> None:
        outputs.write_jsonl(out / "requests.jsonl", [{**tag, **r} for r in requests])
        outputs.write_jsonl(out / "serve_streams.jsonl", [{**tag, **r} for r in streams])  # exact, for a resume
        outputs.write_table(out / "serve.csv", [{**tag, **r} for r in streams])
        outputs.write_jsonl(out / "step_probe.jsonl", probes)

    _, streams, info = measure_serving(model, make_variant, throughput_variants(cfg), cfg.throughput, cfg.stream,
                                       cfg.serve, cfg.seed, cfg.stream.task_lengths(cfg.root), emit, cfg.scheduler,
                                       earlier)
    logger.table("serve", streams)
    outputs.write_table(out / "step_probe.csv", [{**tag, **{k: v for k, v in r.items() if k != "kernels"}}
                                                 for r in info["step_probe"]])
    names = [{**tag, "variant": r["variant"], "budget": r["budget"], **k} for r in info["step_probe"] for k in r["kernels"]]
    if names:  # GPU runs: the probed step's kernels by name
        outputs.write_table(out / "step_probe_kernels.csv", names)
    report["serve"] = streams
    report["serve_info"] = info
    report["serve_config"] = vars(cfg.serve)
    report["stream_config"] = vars(cfg.stream)


def _log_to(path: Path) -> logging.Handler:
    """The run's log records (lm-eval's, transformers') into its folder as well, as Hydra's job log
    did before the run folder became the run's own."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    logging.getLogger().addHandler(handler)
    return handler


def _record_hardware(model, report: dict[str, Any], cfg: RunConfig | None = None) -> None:
    """The device (figure captions name it), and for a timing run its provenance (`cfg` given)."""
    report["device"] = str(next(model.parameters()).device)
    report["devices"] = [str(d) for d in model_devices(model)]  # several: model.device_map=auto
    if torch.cuda.is_available() and report["device"].startswith("cuda"):
        report["gpu"] = torch.cuda.get_device_name()
    if cfg is not None:
        report["provenance"] = provenance(cfg, report["device"], "throughput")


def _run_stage(cfg: RunConfig, model, layers, report: dict[str, Any], logger: Logger) -> None:
    out = cfg.out_dir
    tokenizer = load_tokenizer(cfg.model, cfg.root)
    if cfg.stage == "calibrate":
        calib, directory = ensure_calibration(cfg, model, tokenizer, layers, recompute=cfg.force)
        report["calibration"] = {"dir": str(directory), **calib.meta}
        freq = calib.freq_LE
        rows = [{"layer": li, "expert": u, "freq": float(freq[li, u]), "energy": float(calib.energy_LE[li, u])}
                for li in range(freq.shape[0]) for u in range(freq.shape[1])]
        outputs.write_table(out / "calibration.csv", rows)
        return
    if cfg.stage == "fit":
        pred, path = ensure_predictor(cfg, model, tokenizer, layers, refit=cfg.force)
        rows = [{"layer": li, "r2": r, "r2_within": rw}
                for li, (r, rw) in enumerate(zip(pred.meta["r2"], pred.meta["r2_within"]))]
        outputs.write_table(out / "predictor.csv", rows)
        logger.table("predictor_r2", rows)
        report["predictor"] = {"path": str(path), **pred.meta}
        report["summary"] = {"r2_mean": sum(pred.meta["r2"]) / len(rows),
                             "r2_within_mean": sum(pred.meta["r2_within"]) / len(rows)}
        return
    report["method_config"] = vars(cfg.method)
    if cfg.stage == "throughput":
        from base.runtime.throughput import copy_gbps, measure

        budgeters: dict[tuple, Any] = {}
        note = cpu_timing_note(cfg, model)
        if note:
            print(f"[throughput] note: {note}", flush=True)
            report["timing_note"] = note

        def make_variant(v: Variant, record: bool) -> MoeBudget:
            key = (v.method, v.k0)
            if key not in budgeters:
                budgeters[key], report.setdefault("artifacts_by_method", {})[v.label] = make_budgeter(
                    cfg, model, tokenizer, layers, v.method, v.k0)
            return budgeters[key](v.budget, record)

        if cfg.throughput.mode == "stream":
            from base.runtime.stream import measure_stream

            def emit(rows: list[dict]) -> None:  # after every variant: a stopped run resumes from them
                outputs.write_jsonl(out / "stream_rows.jsonl", rows)
                outputs.write_table(out / "stream.csv", rows)

            earlier = outputs.read_jsonl(out / "stream_rows.jsonl")
            if earlier:
                print(f"[base] resuming: {len(earlier)} variants served by a stopped attempt of this run are kept",
                      flush=True)
            rows = measure_stream(model, make_variant, throughput_variants(cfg), cfg.throughput, cfg.stream, cfg.seed,
                                  cfg.stream.task_lengths(cfg.root), cfg.scheduler, earlier, emit)
            outputs.write_table(out / "stream.csv", rows)
            logger.table("stream", rows)
            report["stream"] = rows
            report["stream_config"] = vars(cfg.stream)
            _record_hardware(model, report, cfg)
            return
        if cfg.throughput.mode == "serve":
            _serve_stage(cfg, model, make_variant, report, logger)
            _record_hardware(model, report, cfg)
            return
        def emit_steps(rows: list[dict], profile: list[dict], kernels: list[dict]) -> None:  # after each batch size
            for name, table in (("throughput_rows", rows), ("profile_rows", profile), ("kernel_rows", kernels)):
                outputs.write_jsonl(out / f"{name}.jsonl", table)

        earlier = tuple(outputs.read_jsonl(out / f"{n}.jsonl") for n in ("throughput_rows", "profile_rows", "kernel_rows"))
        if earlier[0]:
            print(f"[base] resuming: batch sizes {sorted({r['batch_size'] for r in earlier[0]})} measured by a stopped "
                  f"attempt of this run are kept", flush=True)
        rows, profile, kernels = measure(model, make_variant, throughput_variants(cfg), cfg.throughput, cfg.seed,
                                         earlier if earlier[0] else None, emit_steps)
        outputs.write_table(out / "throughput.csv", rows)
        outputs.write_table(out / "profile.csv", profile)
        if kernels:  # GPU runs: the kernels of each class by name
            outputs.write_table(out / "profile_kernels.csv", kernels)
        report["profile"] = profile
        logger.table("throughput", rows)
        report["throughput"] = rows
        # what the expert FFN's bandwidth is read against (analysis/throughput.py's profile rows)
        report["expert_bytes"] = expert_bytes(layers[0])
        if next(model.parameters()).device.type == "cuda":
            report["copy_gbps"] = copy_gbps(next(model.parameters()).device)
        _record_hardware(model, report, cfg)
        return
    # evaluate
    from base.run.diagnose import run_diagnostic

    report["diagnostic"] = run_diagnostic(cfg, model, tokenizer, layers, make_budgeter)  # before anything is scored
    make_budget, info = make_budgeter(cfg, model, tokenizer, layers)
    report["artifacts"] = info
    from base.eval.evaluate import evaluate

    budget = make_budget(cfg.budget)
    try:
        t0 = time.perf_counter()
        result = evaluate(model, tokenizer, cfg.task, cfg.eval, cfg.batch_size, cfg.seed, budget, cfg.root,
                          cfg.scheduler)
        eval_s = time.perf_counter() - t0
        step_rows = budget.stats_rows()
        selects = budget.selector is not None
    finally:
        budget.remove()
    idle = sorted(t for t, n in result.decode_steps_by_task.items() if n == 0)
    if selects and idle:
        raise ConfigError(f"task(s) {', '.join(idle)} ran no decode step: method={cfg.method.name} changes decode "
                          f"steps only, so their scores equal dense; give them tokens to generate (eval.gen_tokens)")
    summary_rows = outputs.selection_summary(step_rows)
    outputs.write_table(out / "metrics.csv", result.metrics)
    outputs.write_jsonl(out / "samples.jsonl", result.samples)
    outputs.write_table(out / "selection.csv", summary_rows)
    outputs.write_table(out / "selection_steps.csv", step_rows)
    if cfg.eval.fidelity:
        from base.eval.fidelity import summarize

        if result.fidelity:  # the teacher-forced pass (static batching)
            outputs.write_table(out / "fidelity_steps.csv", result.fidelity)
    logger.table("metrics", result.metrics)
    logger.table("selection", summary_rows)
    logger.lm_eval(result.raw)
    continuous = cfg.eval.batching == "continuous"
    report["eval"] = {"order": cfg.eval.order, "batch_seed": cfg.seed if cfg.eval.seed is None else cfg.eval.seed,
                      "batching": cfg.eval.batching, "admission": cfg.scheduler.admission,
                      # continuous batching has no fixed batch to teacher-force the dense continuation in:
                      # its fidelity is the per-layer error and retained energy, no KL / dll
                      "fidelity": ("layer metrics only" if continuous else True) if cfg.eval.fidelity else False,
                      "do_sample": cfg.eval.do_sample, "tasks": cfg.task.tasks,
                      "limit": cfg.task.limit, "decode_batches": result.decode_batches, "seconds": eval_s, "engine": result.engine,
                      "decode_steps": result.decode_steps, "decode_steps_by_task": result.decode_steps_by_task,
                      "generation": {k: getattr(cfg.eval, k) for k in ("do_sample", "temperature", "top_p", "top_k",
                                                                        "gen_tokens", "max_gen_tokens")},
                      "decode_steps_per_s": result.decode_steps / eval_s if eval_s > 0 else None,
                      **(result.serving or {})}
    _record_hardware(model, report)  # figure captions name the hardware (analysis/figures.py)
    path = "continuous" if continuous else ("engine" if result.engine else "generate")
    serving = result.serving or {}
    report["provenance"] = provenance(cfg, report["device"], path, serving.get("stop_mode"),
                                      serving.get("compiled_prefill", False))
    report["metrics"] = result.metrics
    report["lm_eval"] = {"results": result.raw.get("results"), "groups": result.raw.get("groups")}
    report["selection"] = summary_rows
    accuracy, used = outputs.summary_accuracy(result.metrics, list(cfg.task.tasks))
    report["summary_tasks"] = used  # what entered the summary accuracy
    report["summary"] = {"accuracy": accuracy, **outputs.overall(summary_rows)}
    if cfg.eval.fidelity:
        report["summary"].update(summarize(result.fidelity))
