#!/usr/bin/env bash
# Issue 20's four quality grids (quality_seeds_mini{,_olmoe}{,_continuous}: 124 points of 1,050
# prompts each) on the CPU cores of a GPU host, one point per core, through
# experiments/run_points.py. The GPU is hidden (CUDA_VISIBLE_DEVICES=): the runs take the CPU path
# that `make quality-seeds` takes on a laptop or in CI, only 16 at a time instead of one.
#
#   bash experiments/gpu/quality_grids_cpu.sh [WAIT_S]      # in a device call, with .whl carried
#
# The runner starts detached (setsid) unless it is already running, so a second call on the same
# warm machine waits for the same runner instead of starting another; each call waits up to
# WAIT_S seconds (default 540), then packs every grid folder into $OUT/<exp>.tgz (with the run
# logs) so that what finished comes back even if the machine is then given back. Unpack here with
#   for f in <files_at>/*.tgz; do tar xzf "$f"; done
# then `python -m analysis.ablation outputs/<exp> results/<exp>` for each grid.
set -u
WAIT_S=${1:-540}
t0=$(date +%s)
source experiments/gpu/env.sh
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 CUDA_VISIBLE_DEVICES= HF_DATASETS_OFFLINE=1
OUT=${OUT:-outputs/packed}; mkdir -p "$OUT"
EXPS=${EXPS:-"quality_seeds_mini quality_seeds_mini_olmoe quality_seeds_mini_continuous quality_seeds_mini_olmoe_continuous"}

if [ "${RESTART:-0}" = 1 ]; then pkill -f "m experiments[.]run_points"; sleep 1; fi
if ! pgrep -f "experiments.run_points" >/dev/null; then
  nproc --all; lscpu | grep -E "^Model name" ; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"
  # each model's calibration and predictor fit once, with all cores, before 16 points wait on its lock
  OMP_NUM_THREADS=8 python3 run.py experiment=quality_seeds_mini exp_name=prefit stage=fit logger=none > outputs/prefit_mini.log 2>&1 &
  OMP_NUM_THREADS=8 python3 run.py experiment=quality_seeds_mini_olmoe exp_name=prefit stage=fit logger=none > outputs/prefit_olmoe.log 2>&1 &
  wait
  tail -n 2 outputs/prefit_*.log
  echo "prefit done after $(( $(date +%s) - t0 )) s"
  setsid nohup python3 -m experiments.run_points --jobs "$(nproc --all)" $EXPS \
    --extra "method=dense budget=null" --extra "method=oea method.k0=1,2 budget=null" \
    > outputs/run_points.log 2>&1 < /dev/null &
  sleep 5
fi

source experiments/gpu/wait_runner.sh
tar czf "$OUT/logs.tgz" outputs/run_points.log outputs/run_points_logs outputs/prefit_*.log 2>/dev/null
ls -la "$OUT"
