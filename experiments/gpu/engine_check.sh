#!/usr/bin/env bash
# On a CUDA machine (the device tool): the GPU tests on the last GPU while a Qwen3-30B-A3B
# throughput probe (experiment=throughput, fewer methods and budgets) and the evaluation-speed
# comparison (generate vs engine, experiments/eval_speed.py) run on GPU 0 (on a one-GPU machine,
# one after the other). Writes logs, CSVs and JSON to $OUT.
#   bash experiments/gpu/engine_check.sh            (EXTRA="throughput.compile=false" etc. for the probe)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source "$(dirname "$0")/env.sh"
ngpu=$(nvidia-smi -L | wc -l)
last=$((ngpu - 1))
tests() {
  CUDA_VISIBLE_DEVICES=$last python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_engine.py \
    tests/test_attention.py tests/test_kernels.py tests/test_budget_triton.py > "$OUT/gpu_tests.log" 2>&1
  echo "tests rc=$?" >> "$OUT/gpu_tests.log"
}
if [ "$ngpu" -ge 2 ]; then tests & else tests; fi
CUDA_VISIBLE_DEVICES=0 python3 run.py experiment=throughput exp_name=probe \
  "throughput.methods=[dense,router_sum,base,fixed]" "throughput.budgets=[16,10]" ${EXTRA:-} \
  > "$OUT/probe.log" 2>&1
echo "probe rc=$?" >> "$OUT/probe.log"
CUDA_VISIBLE_DEVICES=0 python3 -m experiments.eval_speed --model mini --method router_sum --budget 8 \
  --out "$OUT/eval_speed.json" > "$OUT/eval_speed.log" 2>&1
wait
tar czf "$OUT/probe_runs.tgz" outputs/probe 2>/dev/null
tail -3 "$OUT/gpu_tests.log"; grep -E "^\[throughput\]|Error" "$OUT/probe.log" | tail -30
python3 -m analysis.throughput outputs/probe "$OUT/probe" > /dev/null 2>&1 && cat "$OUT/probe.md"
tail -5 "$OUT/eval_speed.log"
