#!/usr/bin/env bash
# Issue 27's replication grid on the held-out 128-expert model (docs/preregistration.md: its own
# Holm family of 18, not part of the primary family): train mini128 on the GPU (`make mini128`,
# 120 s), then the 22 points of conf/experiment/replication_mini128.yaml (5,600 prompts each,
# continuous batching) on the host's CPU cores, one point per core, through experiments/run_points.py.
#
#   bash experiments/gpu/replication_mini128.sh [WAIT_S]     # in a device call, with .whl carried
#
# As experiments/gpu/quality_grids_cpu.sh: the runner starts detached unless already running, each
# call waits up to WAIT_S seconds (default 540), then packs outputs/replication_mini128 and the
# trained model into $OUT. Unpack here, then
#   python -m analysis.replication outputs/replication_mini128 --out results/replication_mini128
# (or on a many-core host without the script: make replication REPL_EXP=replication_mini128 REPL_OUT=results/replication_mini128 REPL_JOBS=16)
set -u
WAIT_S=${1:-540}
t0=$(date +%s)
source experiments/gpu/env.sh
export HF_DATASETS_OFFLINE=1
OUT=${OUT:-outputs/packed}; mkdir -p "$OUT"

if [ ! -f outputs/mini128/config.json ]; then
  python3 -m experiments.mini.train --device cuda --num-experts 128 --top-k 8 --expert-width 24 --time-budget-s 120 \
    --eval-every-s 1000 --save-every-s 1000 --max-shard-size 12MB --save-tokenizer 1 --out outputs/mini128 \
    > outputs/mini128_train.log 2>&1
  tail -n 3 outputs/mini128_train.log
  echo "mini128 trained after $(( $(date +%s) - t0 )) s"
fi
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=
if ! pgrep -f "experiments.run_points" >/dev/null; then
  OMP_NUM_THREADS=8 python3 run.py experiment=replication_mini128 exp_name=prefit stage=fit logger=none \
    > outputs/prefit_mini128.log 2>&1
  setsid nohup python3 -m experiments.run_points --jobs "$(nproc --all)" replication_mini128 \
    --extra "method=base_anchor method.k0=2" --extra "method=dense budget=null" \
    > outputs/run_points.log 2>&1 < /dev/null &
  sleep 5
fi
EXPS=replication_mini128
source experiments/gpu/wait_runner.sh
# the checkpoint (23 MB) stays on the host: the returned files are capped at 16 MiB, and the analysis needs only the runs
tar czf "$OUT/mini128_logs.tgz" outputs/mini128/*.json outputs/mini128/train_log.csv outputs/mini128_train.log \
  outputs/run_points.log outputs/run_points_logs 2>/dev/null
ls -la "$OUT"
