#!/usr/bin/env bash
# On a CUDA machine (the device tool): GPU tests on GPU 0 while a quick Qwen3-30B-A3B throughput
# probe and the evaluation-speed comparison (generate vs engine, experiments/eval_speed.py) run on
# GPU 1 (or after the tests on a one-GPU machine). Writes logs, CSVs and JSON to $OUT.
#   bash experiments/gpu/engine_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ngpu=$(nvidia-smi -L | wc -l)
(CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_engine.py tests/test_kernels.py \
   tests/test_patch_triton.py > "$OUT/gpu_tests.log" 2>&1; echo "tests rc=$?" >> "$OUT/gpu_tests.log") &
tests=$!
[ "$ngpu" -lt 2 ] && CUDA_VISIBLE_DEVICES=$dev python3 -m experiments.eval_speed --model mini --method router_sum --budget 8 \
  --out "$OUT/eval_speed.json" > "$OUT/eval_speed.log" 2>&1
wait $tests
dev=$([ "$ngpu" -ge 2 ] && echo 1 || echo 0)
CUDA_VISIBLE_DEVICES=$dev python3 run.py model=qwen3_30b model.init=random model.device=cuda model.tokenizer=bytes \
  model.experts_impl=base_triton method=base method.backend=triton stage=throughput logger=none exp_name=probe \
  calibration.num_tokens=2048 "throughput.methods=[dense,dense:grouped_mm,router_sum,base]" \
  "throughput.budgets=[16]" "throughput.batch_sizes=[16]" throughput.gen_tokens=64 ${EXTRA:-} \
  > "$OUT/probe.log" 2>&1
echo "probe rc=$?" >> "$OUT/probe.log"
CUDA_VISIBLE_DEVICES=$dev python3 -m experiments.eval_speed --model mini --method router_sum --budget 8 \
  --out "$OUT/eval_speed.json" > "$OUT/eval_speed.log" 2>&1
wait $tests
find outputs/probe -name throughput.csv -exec cp {} "$OUT/probe_throughput.csv" \;
tail -3 "$OUT/gpu_tests.log"; tail -25 "$OUT/probe.log"
cat "$OUT/probe_throughput.csv" 2>/dev/null
