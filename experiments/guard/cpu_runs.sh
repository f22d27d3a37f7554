#!/usr/bin/env bash
# Did a change alter what the method does? The same 18 CPU runs on the embedded models from two
# checkouts; analysis/compare_runs.py then compares their per-request outputs (samples.jsonl) and
# selection statistics cell by cell. Each run: 200 mini prompts (25 per task), batch 16, batching
# seed 0, one thread; dense, base, router_sum, the anchored rules (fidelity on), oracle, top1_union,
# oea, similar re-routing, coverage, per-layer budgets, energy statistics, the engine on the CPU,
# mini_olmoe, and the Triton backend through the interpreter (mini_smoke). About 25 min a checkout.
#   git worktree add /tmp/before <old commit>; ln -s $PWD/.venv /tmp/before/.venv
#   bash experiments/guard/cpu_runs.sh /tmp/before /tmp/guard/before
#   bash experiments/guard/cpu_runs.sh $PWD /tmp/guard/after
#   python -m analysis.compare_runs /tmp/guard/before/guard /tmp/guard/after/guard results/refactor_guard/cpu/comparison
# Calibration and predictors are shared through /tmp/guard/artifacts (the first checkout computes them).
set -u
cd "$1"
export OMP_NUM_THREADS=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_SILENT=true
C=".venv/bin/python run.py exp_name=guard outputs_dir=$2 artifacts_dir=/tmp/guard/artifacts logger=none task.limit=25 eval.seed=0"
$C eval.fidelity=true method=base budget=8
$C eval.fidelity=true method=dense budget=null
$C eval.fidelity=true method=router_sum budget=8
$C eval.fidelity=true method=base_anchor budget=8
$C eval.fidelity=true method=xshare budget=8
$C method=oracle budget=8
$C method=top1_union budget=8
$C method=oea method.k0=1 budget=null
$C method=base budget=8 method.reassign=similar
$C method=base budget=null method.coverage=0.9
$C method=base budget=8 method.budget_split=sensitivity
$C method=count budget=6 stats.energy=true
$C method=base budget=8 eval.engine=on
$C method=router_sum budget=8 eval.engine=on
$C model=mini_olmoe method=base budget=6 eval.fidelity=true
$C model=mini_olmoe method=dense budget=null
$C method=base budget=4 method.backend=triton task=mini_smoke
$C method=router_sum budget=4 method.backend=triton task=mini_smoke eval.engine=on
echo ALLDONE
