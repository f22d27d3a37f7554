#!/usr/bin/env bash
# Issue 41's pre-registered grid for one held-out model (docs/preregistration_heldout.md), on the CPU:
#   bash experiments/heldout/train_models.sh <model>     # first: outputs/models/<model>
#   bash experiments/heldout/grid.sh <model>             # -> outputs/heldout_grid_<model>/
# Dense first; its union sets the three budgets (experiments/heldout/budgets.py); then base,
# router_sq, top1_union, calib_energy, oracle, base_anchor (k0=1) and the calibrated base
# (method.shrink=auto) at each. A finished run is skipped when the script runs again.
set -euo pipefail
PY=${PY:-.venv/bin/python}
m=${1:?usage: bash experiments/heldout/grid.sh <model>}
[ -d "outputs/models/$m" ] || { echo "error: outputs/models/$m is missing: bash experiments/heldout/train_models.sh $m" >&2; exit 2; }
# the trainer writes metrics.json when its 1,500 steps are done; before that the folder holds a checkpoint
[ -f "outputs/models/$m/metrics.json" ] || { echo "error: outputs/models/$m has no metrics.json: its training has not finished (or stopped); train it again" >&2; exit 2; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
$PY run.py -m experiment=heldout_grid model="$m" method=dense budget=null
b=$($PY -m experiments.heldout.budgets "outputs/heldout_grid_$m/budget=null,method=dense,model=$m")
echo "[heldout grid] $m: budgets $b"
$PY run.py -m experiment=heldout_grid model="$m" budget="$b" method=base,router_sq,top1_union,calib_energy,oracle
$PY run.py -m experiment=heldout_grid model="$m" budget="$b" method=base_anchor method.k0=1
$PY run.py -m experiment=heldout_grid model="$m" budget="$b" method=base method.shrink=auto
