#!/usr/bin/env bash
# The README's throughput grid on a CUDA machine: conf/experiment/throughput.yaml for each model,
# uniform and skewed routing. With two GPUs, Qwen3-30B-A3B runs on GPU 0 and the three smaller
# models on GPU 1. Each run writes outputs/throughput/<run>/; then
#   python -m analysis.throughput outputs/throughput results/throughput
#   bash experiments/gpu/throughput_grid.sh [model ...]      (default: all four)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
models=("$@"); [ ${#models[@]} -eq 0 ] && models=(qwen3_30b qwen15_moe deepseek_v2_lite olmoe)
ngpu=$(nvidia-smi -L | wc -l)
run_models() {  # gpu, models...
  local gpu=$1; shift
  for m in "$@"; do for routing in uniform skewed; do
    CUDA_VISIBLE_DEVICES=$gpu python3 run.py experiment=throughput model=$m model.routing=$routing ${EXTRA:-} \
      > "$OUT/grid_${m}_${routing}.log" 2>&1 || echo "FAILED $m $routing" >> "$OUT/grid_failed.log"
  done; done
}
if [ "$ngpu" -ge 2 ] && [ ${#models[@]} -gt 1 ]; then
  run_models 0 "${models[0]}" & run_models 1 "${models[@]:1}"; wait
else
  run_models 0 "${models[@]}"
fi
tar czf "$OUT/throughput_runs.tgz" outputs/throughput
cat "$OUT"/grid_*.log | grep -E "^\[throughput\] batch|Error|error" | tail -40
python3 -m analysis.throughput outputs/throughput "$OUT/throughput" > /dev/null 2>&1 && tail -30 "$OUT/throughput.md"
