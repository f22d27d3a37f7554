"""Issue 41, item 1: why a rule that keeps more of the true removal cost per layer can answer worse
online. Exploratory (not the pre-registered family).

    python -m experiments.heldout.mechanism model=olmoe64_s1 budget=12 --out results/heldout/mechanism

1. The online decode of `method` (default base) at `budget` on the mini tasks through the
   continuous engine (16 slots, full occupancy), traced (base/method/trace.py): every selecting
   forward's routed batch and kept set.
2. The replay: each traced layer selected again by the reference; a mismatch is a defect of the
   online path (`replay.txt`).
3. Per token, on the states the online run met and on teacher-forced states of held-out
   calibration text (the last token of the diagnostic's 64 windows, 16 to a batch, as an offline
   check would take them), under each of
   `rules` (default base, router_sq, oracle): the share of the token's true removal cost
   (w^2 ||E_u(z)||^2, the true norms run here) and of its router weight that the kept set drops,
   and whether it loses its first choice. `tokens.csv.gz` (one row per token, layer, state and
   rule), `summary.csv` (mean, p90, p99 of each loss, the share of tokens losing their first choice
   or more than half their cost) and `summary.md`.

Hydra is read here only to build the run's typed config (as run.py does). Shapes: T rows, K top-k.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _config(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    import run

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["logger=none", "task=mini", *overrides])
    return run.build_config(cfg, ROOT / "outputs" / "heldout_mechanism" / "cfg")


def _prompts(tokenizer, per_domain: int) -> list[list[int]]:
    out = []
    for path in sorted((ROOT / "tasks" / "mini").glob("*.jsonl")):
        for line in path.read_text().splitlines()[:per_domain]:
            out.append(tokenizer(json.loads(line)["prompt"], add_special_tokens=False)["input_ids"])
    return out


def _losses(batch, norms_TK: torch.Tensor, keep_E: torch.Tensor) -> dict[str, np.ndarray]:
    """Per active token: the share of its cost and weight the kept set drops, first choice lost."""
    a = batch.active_T
    idx, w = batch.topk_idx_TK[a], batch.topk_w_TK[a].float()
    cost = w ** 2 * norms_TK[a] ** 2
    dropped = ~keep_E[idx]
    first = batch.probs_TE[a].gather(1, idx).argmax(1, keepdim=True)
    return {"cost_lost": ((cost * dropped).sum(1) / cost.sum(1).clamp_min(1e-30)).numpy(),
            "weight_lost": ((w * dropped).sum(1) / w.sum(1).clamp_min(1e-30)).numpy(),
            "first_lost": dropped.gather(1, first)[:, 0].numpy()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="run.py overrides (model=..., budget=...)")
    ap.add_argument("--method", default="base")
    ap.add_argument("--rules", default="base,router_sq,oracle")
    ap.add_argument("--per-domain", type=int, default=50, help="mini prompts per domain decoded online")
    ap.add_argument("--out", default="results/heldout/mechanism")
    args = ap.parse_args(argv)

    from base.hf.families import find_moe_layers
    from base.hf.loading import load_model, load_tokenizer
    from base.hf.moe_block import expert_norms_TK
    from base.method.backends import TorchSelection
    from base.method.routing import RoutedBatch
    from base.method.trace import Trace, replay
    from base.run.pipeline import make_budgeter
    from base.run.provenance import engine_settings, fingerprint
    from base.runtime.continuous import ContinuousEngine
    from base.runtime.scheduler import Request, serve

    cfg = _config([f"method={args.method}", *args.overrides])
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    torch.set_grad_enabled(False)
    model = load_model(cfg.model, cfg.root, seed=cfg.seed)
    tok = load_tokenizer(cfg.model, cfg.root)
    layers = find_moe_layers(model)
    make, _ = make_budgeter(cfg, model, tok, layers)
    rules = args.rules.split(",")
    policies = {}
    for rule in rules:
        mk, _ = make_budgeter(cfg, model, tok, layers, rule)
        b = mk(cfg.budget, False)
        policies[rule] = b.policy
        b.remove()

    # 1. the online decode, traced
    budget = make(cfg.budget, False)
    trace = Trace()
    requests = [Request(p, 24) for p in _prompts(tok, args.per_domain)]
    engine = ContinuousEngine(model, cfg.batch_size, 256, budget=budget, pad_id=tok.pad_token_id or 0)
    try:
        with trace.on(budget):
            serve(engine, requests, pad_id=tok.pad_token_id or 0, stop_at_eos=True, policy=cfg.scheduler)
    finally:
        engine.release()
        online_policy = budget.policy
        budget.remove()
    # 2. the replay
    mismatches = replay(trace, online_policy)
    (out / "replay.txt").write_text(f"{len(trace.records)} traced layer-forwards, {len(mismatches)} mismatches\n"
                                    + "\n".join(mismatches[:50]) + "\n")
    print(f"[mechanism] replay: {len(trace.records)} records, {len(mismatches)} mismatches", flush=True)

    # 3. per-token losses on the online states and on teacher-forced calibration states
    def states_online():
        for r in trace.records:
            if r.active_T.sum() > 1:
                yield "online", r.layer, r.batch()

    def states_teacher_forced():
        """The last position of the diagnostic's held-out calibration windows (base/run/diagnose.py),
        16 windows to a batch: the states an offline check on calibration text would score."""
        from base.hf.moe_block import StepInputs
        from base.run.diagnose import _run_prompts

        prompts = _run_prompts(cfg, tok, layers)
        captured: list = []

        def observe(layer, batch, decision=None):
            captured.append((layer, batch))

        for start in range(0, len(prompts) - 15, 16):
            ids_BL = torch.tensor(prompts[start:start + 16])
            B, L = ids_BL.shape
            captured.clear()
            probe = make(None, False)
            try:
                with probe.bound(StepInputs(torch.ones(B * L, dtype=torch.bool), select=False, recorder=None,
                                            decode=False, observe=observe)):
                    model(input_ids=ids_BL, use_cache=False)
            finally:
                probe.remove()
            last = slice(L - 1, None, L)  # each window's last token
            for layer, batch in captured:
                yield "teacher_forced", layer, RoutedBatch(batch.z_TH[last], batch.probs_TE[last],
                                                           batch.topk_idx_TK[last], batch.topk_w_TK[last],
                                                           torch.ones(B, dtype=torch.bool), layer)

    rows = []
    selections = {rule: {} for rule in rules}
    for source in (states_online, states_teacher_forced):
        for state, layer, batch in source():
            norms = expert_norms_TK(layers[layer].experts, batch.z_TH, batch.topk_idx_TK).float()
            batch.norms_TK = norms  # the oracle's true norms
            for rule in rules:
                sel = selections[rule].setdefault(layer, TorchSelection(policies[rule], layer, torch.device("cpu")))
                keep_E = sel.select(batch).keep_E.cpu()
                for k, v in _losses(batch, norms, keep_E).items():
                    rows.append(pd.DataFrame({"state": state, "layer": layer, "rule": rule, "metric": k,
                                              "value": v.astype(float)}))
    tokens = pd.concat(rows, ignore_index=True)
    tokens.to_csv(out / "tokens.csv.gz", index=False, compression={"method": "gzip", "mtime": 0})
    g = tokens.groupby(["state", "rule", "metric"])["value"]
    summary = pd.DataFrame({"tokens": g.size(), "mean": g.mean(), "p90": g.quantile(0.9), "p99": g.quantile(0.99),
                            "share_above_half": g.apply(lambda s: float((s > 0.5).mean()))}).reset_index()
    # which engine made each row's states: the continuous engine's decode, or a plain forward
    online = fingerprint(engine_settings(cfg, "cpu", "continuous"))
    summary["engine"] = summary["state"].map({"online": online, "teacher_forced": "none (teacher-forced forward)"})
    summary.to_csv(out / "summary.csv", index=False)
    (out / "summary.md").write_text(
        f"Made by `python -m experiments.heldout.mechanism {' '.join(argv or sys.argv[1:])}`.\n\n"
        f"Replay of the online selection: {len(trace.records)} traced layer-forwards, {len(mismatches)} mismatches.\n\n"
        + summary.to_markdown(index=False, floatfmt=".4f") + "\n")
    print(summary.to_string(index=False))


if __name__ == "__main__":
    main()
