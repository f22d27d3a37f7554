#!/usr/bin/env bash
# The throughput grid of results/README.md on a CUDA machine: conf/experiment/throughput.yaml for each model,
# uniform and skewed routing. With two GPUs, Qwen3-30B-A3B runs on GPU 0 and the three smaller
# models on GPU 1. Each run writes outputs/throughput/<run>/; then
#   python -m analysis.throughput outputs/throughput results/throughput
#   bash experiments/gpu/throughput_grid.sh [model ...]      (default: all four)
# To split the grid over calls of a 10-minute limit, name the runs of each GPU (model:routing):
#   GPU0="qwen3_30b:uniform" GPU1="qwen3_30b:skewed" bash experiments/gpu/throughput_grid.sh
# TESTS=1 runs the GPU tests first on the last GPU; PARTS=1 then experiments/gpu/step_parts.py there;
# EVAL=1 runs experiments/eval_speed.py (generate vs engine on mini) on GPU 0 after its runs.
# Each run is cut at RUN_LIMIT seconds (default 540) so the outputs come back within a call.
# The device tool returns at most 8 files: logs go to $LOG and everything is packed into
# $OUT/grid.tgz (outputs/throughput and the logs), with the summary tables in $OUT/throughput.md.
set -uo pipefail
source "$(dirname "$0")/checks.sh"  # a misspelt model, routing or limit: refused before anything is written
for m in "$@"; do check_model throughput-grid "the models" "$m"; done
for spec in ${GPU0:-} ${GPU1:-}; do
  check_model throughput-grid "GPU0/GPU1 '$spec'" "${spec%%:*}"
  [[ "$spec" == *:* ]] || refuse throughput-grid "GPU0/GPU1 '$spec': a run is model:routing"
  check_routing throughput-grid "GPU0/GPU1 '$spec'" "${spec##*:}"
done
check_seconds throughput-grid RUN_LIMIT "${RUN_LIMIT:-}"
OUT=${OUT:-/tmp/out}; LOG=${LOG:-/tmp/gridlogs}; mkdir -p "$OUT" "$LOG"
source "$(dirname "$0")/env.sh"
ngpu=$(nvidia-smi -L | wc -l)
last=$((ngpu - 1))
run_on() {  # gpu, model:routing ...
  local gpu=$1; shift
  if [ "${TESTS:-0}" = 1 ] && [ "$gpu" = "$last" ]; then
    CUDA_VISIBLE_DEVICES=$gpu python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_engine.py \
      tests/test_attention.py tests/test_kernels.py tests/test_budget_triton.py > "$LOG/gpu_tests.log" 2>&1
    echo "tests rc=$?" >> "$LOG/gpu_tests.log"
  fi
  if [ "${PARTS:-0}" = 1 ] && [ "$gpu" = "$last" ]; then
    CUDA_VISIBLE_DEVICES=$gpu python3 -m experiments.gpu.step_parts --out "$LOG/step_parts.json" > "$LOG/step_parts.log" 2>&1
  fi
  for spec in "$@"; do
    local m=${spec%%:*} routing=${spec##*:}
    CUDA_VISIBLE_DEVICES=$gpu timeout "${RUN_LIMIT:-540}" python3 run.py experiment=throughput model=$m \
      model.routing=$routing ${EXTRA:-} > "$LOG/grid_${m}_${routing}.log" 2>&1 \
      || echo "FAILED $m $routing" >> "$LOG/grid_failed.log"
  done
  if [ "${EVAL:-0}" = 1 ] && [ "$gpu" = 0 ]; then
    CUDA_VISIBLE_DEVICES=0 python3 -m experiments.eval_speed --model mini --method router_sum --budget 8 \
      --out "$LOG/eval_speed.json" > "$LOG/eval_speed.log" 2>&1
  fi
}
if [ -n "${GPU0:-}" ]; then
  run_on 0 $GPU0 & { [ "$ngpu" -ge 2 ] && run_on 1 ${GPU1:-}; }; wait
else
  models=("$@"); [ ${#models[@]} -eq 0 ] && models=(qwen3_30b qwen15_moe deepseek_v2_lite olmoe)
  specs=(); for m in "${models[@]}"; do specs+=("$m:uniform" "$m:skewed"); done
  if [ "$ngpu" -ge 2 ] && [ ${#specs[@]} -gt 2 ]; then
    run_on 0 "${specs[@]:0:2}" & run_on 1 "${specs[@]:2}"; wait
  else
    run_on 0 "${specs[@]}"
  fi
fi
[ -f "$LOG/gpu_tests.log" ] && tail -4 "$LOG/gpu_tests.log"
cat "$LOG"/grid_*.log | grep -E "^\[throughput\] batch|Error|error" | tail -40
python3 -m analysis.throughput outputs/throughput "$LOG/throughput" > /dev/null 2>&1 && cp "$LOG/throughput.md" "$OUT/"
tar czf "$OUT/grid.tgz" outputs/throughput -C "$(dirname "$LOG")" "$(basename "$LOG")"
[ -f "$OUT/throughput.md" ] && tail -30 "$OUT/throughput.md"
