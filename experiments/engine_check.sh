#!/usr/bin/env bash
# Issue 40: are the committed static grids what the current code gives? One point of each (base at
# the grid's smallest budget, batching seed 0) runs again into outputs/engine_check/<grid>, and
# `analysis.records same` compares it prompt by prompt with the grid's committed records.
#   bash experiments/engine_check.sh [grid ...]      # default: every static grid with records
set -uo pipefail
PY=${PY:-.venv/bin/python}
grids=${*:-quality_seeds_mini quality_seeds_mini_olmoe ablation_mini ablation_mini_olmoe rules_mini rules_mini_olmoe quality_mini quality_mini_olmoe}
declare -A first=([quality_mini]=5 [quality_mini_olmoe]=6 [quality_seeds_mini]=6 [quality_seeds_mini_olmoe]=6
                  [ablation_mini]=6 [ablation_mini_olmoe]=6 [rules_mini]=6 [rules_mini_olmoe]=6)
status=0
for g in $grids; do
  OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    $PY run.py experiment=$g outputs_dir=outputs/engine_check method=base budget=${first[$g]} eval.seed=0 > "outputs/engine_check_$g.log" 2>&1 || { echo "$g: run failed (outputs/engine_check_$g.log)"; status=1; continue; }
  echo "== $g"
  $PY -m analysis.records same outputs/engine_check/$g results/records/$g || status=1
done
exit $status
