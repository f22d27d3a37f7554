#!/usr/bin/env bash
# A model larger than one GPU, run across two (issue 12). On a two-GPU host:
#   1. the two-GPU tests (tests/test_multi_gpu.py: a model split over cuda:0/cuda:1 decodes exactly
#      as on one GPU, torch and Triton backends) and the one-GPU graph-replay tests (GPUs busy)
#   2. stage=describe of gpt-oss-120b in bf16 on the meta device (beside step 1, CPU only): weights,
#      KV cache and the GPUs of this host's size it needs
#   3. its decode throughput with model.device_map=auto over both GPUs: random bf16 weights built on
#      the GPUs, dense against router_sum and base at two budgets (the engine decodes eagerly
#      across GPUs and says so in the log)
#   bash experiments/gpu/multi_gpu.sh         (MODEL=gpt_oss_120b BATCHES=[1,16,64] RUN_LIMIT=300)
# Needs the wheels in .whl/ (hydra-core, omegaconf, antlr4, accelerate): pass .whl in the carry list.
# Writes at most 8 files to $OUT: summary.txt, tests.log, describe.log, describe.json,
# throughput.log, throughput.csv, throughput_report.json.
set -uo pipefail
MODEL=${MODEL:-gpt_oss_120b}
BATCHES=${BATCHES:-[1,16,64]}
source "$(dirname "$0")/checks.sh"  # a misspelt model, batch list or limit: refused before anything is written
check_model multi-gpu MODEL "$MODEL"; check_batches multi-gpu BATCHES "$BATCHES"
check_seconds multi-gpu RUN_LIMIT "${RUN_LIMIT:-}"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv > "$S"
ngpu=$(nvidia-smi -L | wc -l)
gpu_gb=$(( $(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1) * 1048576 / 1000000000 ))
echo "gpus=$ngpu gpu_gb=$gpu_gb model=$MODEL" >> "$S"
[ "$ngpu" -ge 2 ] || echo "WARNING: fewer than two GPUs: the two-GPU tests skip and the model may not fit" >> "$S"

(timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_multi_gpu.py \
  "tests/test_engine.py::test_gpu_graph_replay_equals_eager" > "$OUT/tests.log" 2>&1
 echo "tests rc=$?" >> "$OUT/tests.log") &
timeout 180 python3 run.py model="$MODEL" model.init=random model.device=meta stage=describe logger=none \
  exp_name=multi_gpu_describe describe.gpu_gb="$gpu_gb" batch_size=16 "throughput.batch_sizes=$BATCHES" \
  > "$OUT/describe.log" 2>&1
echo "describe rc=$?" >> "$OUT/describe.log"
wait
report=$(find outputs/multi_gpu_describe -name report.json | head -1)
[ -n "$report" ] && cp "$report" "$OUT/describe.json"

timeout "${RUN_LIMIT:-300}" python3 run.py experiment=throughput model="$MODEL" model.device_map=auto \
  exp_name=multi_gpu_throughput budget=16 "throughput.batch_sizes=$BATCHES" \
  "throughput.methods=[dense,router_sum,base]" "throughput.budgets=[16,32]" throughput.timed_steps=16 \
  throughput.stats_steps=4 throughput.warmup=1 throughput.profile_batch=null throughput.eager_reference=false \
  throughput.non_expert=false calibration.num_tokens=1024 ${EXTRA:-} > "$OUT/throughput.log" 2>&1
echo "throughput rc=$?" >> "$OUT/throughput.log"
run_dir=$(dirname "$(find outputs/multi_gpu_throughput -name report.json | head -1)")
[ -f "$run_dir/report.json" ] && cp "$run_dir/report.json" "$OUT/throughput_report.json" \
  && cp "$run_dir/throughput.csv" "$OUT/throughput.csv"

{
  echo "== tests"; tail -3 "$OUT/tests.log"
  echo "== describe"; grep -E "params_total|memory:|batch_size|gpus_needed|^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9]+$|rc=|rror" "$OUT/describe.log"
  echo "== throughput"; grep -E "^\[engine\]|^\[throughput\]|^\[base\]|rc=|rror" "$OUT/throughput.log" | tail -40
} >> "$S"
cat "$S"
