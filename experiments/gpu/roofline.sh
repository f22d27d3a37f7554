#!/usr/bin/env bash
# Issue 25 (the decode step near the roofline) on one H200, in one device call:
#   1. the GPU tests of what the issue changed (selection kernel, v3 experts, Triton backend, engine)
#   2. the kernel benchmark: v3 launch configs tuned, v3 against v2 expert FFN, the selection step
#      -> $OUT/kernels.tgz (benchmarks/kernels/NVIDIA_H200.json, configs, table)
#   2b. (PARTS steptune) the selection and decode-attention launches tuned (tools/tune_step_kernels.py; STEPTUNE_ARGS
#      e.g. "--kernels select --select-ts 64"), installed into this GPU's kernels/configs/<gpu>.json before the grid
#      -> $OUT/tune_step.csv, tune_step.log (its timestamps), installed_configs.json. STEPTUNE_S: its limit
#      (default 450 s: the selection's three buckets ran past 300 s on a fresh H100; each bucket is installed
#      when tuned, so a cut run keeps those it finished)
#   3. the end-to-end grid of one model and routing (conf/experiment/throughput.yaml, interleaved
#      repeats, the per-class profile with kernels per layer) -> $OUT/grid.tgz, $OUT/throughput.md
#   bash experiments/gpu/roofline.sh                       # all three, Qwen3-30B-A3B uniform
#   PARTS="grid" MODEL=olmoe ROUTING=skewed bash experiments/gpu/roofline.sh
#   PARTS=grid SPECS="qwen3_30b:uniform qwen3_30b:skewed:[16,64]" bash experiments/gpu/roofline.sh  # several runs
#   GRID_EXTRA='throughput.budgets=[16,8,32] throughput.repeats=3' ...   # a leaner grid
#   3b. (PARTS micro) kernel A/Bs: tools/bench_select.py (SELECT_BASELINE=<an older kernels/select.py>),
#      tools/bench_skinny.py and, with MICRO=attention, tools/bench_attention.py (ATTN_BASELINE=<an older
#      kernels/attention.py>), with MICRO=experts, tools/bench_experts.py (EXPERTS_BASELINE=<an older
#      kernels/experts.py>) -> $OUT/bench_select.*, bench_skinny.*, bench_attention*, bench_experts.*
#   2c. (PARTS exptune) the expert kernels' table, both paths, the kept bound, the reduce in down (tools/tune_kernels.py;
#      EXPTUNE_MODELS, EXPTUNE_TS), installed before the grid -> $OUT/tune_experts.log, installed_configs.json
#   4. (PARTS ab) an A/B of one key, order a b b a: AB_KEY=throughput.compile AB_VALUES="false true" (both needed)
#      -> $OUT/ab.tgz
# Device call: carry .whl (hydra-core, omegaconf: ../shared/device/wheels.sh).
# ROOFLINE_LOG: the folder the logs are written to before they are packed under $OUT (default /tmp/roofline).
set -uo pipefail
cd "$(dirname "$0")/../.."
PARTS=${PARTS:-"tests kernels grid"}
MODEL=${MODEL:-qwen3_30b}; ROUTING=${ROUTING:-uniform}
# a misspelt part, micro-benchmark, grid spec or limit would run nothing, or fail only after the parts
# before it spent the call: refused here, before anything is written (experiments/gpu/checks.sh)
source experiments/gpu/checks.sh
for p in $PARTS; do
  [[ " tests kernels steptune exptune micro grid ab " == *" $p "* ]] || refuse roofline "PARTS has '$p': the parts are tests kernels steptune exptune micro grid ab"
done
for p in ${MICRO:-select skinny}; do
  [[ " select skinny attention experts " == *" $p "* ]] || refuse roofline "MICRO has '$p': the micro-benchmarks are select skinny attention experts"
done
if [[ " $PARTS " == *" grid "* ]]; then
  for spec in ${SPECS:-$MODEL:$ROUTING}; do
    IFS=: read -r m r b <<< "$spec"
    check_model roofline "SPECS '$spec'" "$m"
    check_routing roofline "SPECS '$spec'" "$r"
    check_batches roofline "SPECS '$spec'" "$b"
  done
fi
for knob in TESTS_S KERNELS_S BENCH_S TUNE_S STEPTUNE_S EXPTUNE_S EXPTUNE_BUDGET_S SELECT_S SKINNY_S ATTN_S EXPERTS_S GRID_S AB_S; do
  check_seconds roofline "$knob" "${!knob:-}"
done
OUT=${OUT:-/tmp/out}; LOG=${ROOFLINE_LOG:-/tmp/roofline}; mkdir -p "$OUT" "$LOG"
source experiments/gpu/env.sh
t0=$(date +%s); stamp() { echo "[roofline $(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$LOG/gpu_state.csv" 2>&1
# the tuned table of this GPU (kernels/tuned.py: kernels/configs/<name with _ for spaces>.json), which the tuners install into
TABLE=kernels/configs/$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))" 2>/dev/null || echo NVIDIA_H200).json

if [[ " $PARTS " == *" tests "* ]]; then
  stamp "GPU tests"
  timeout "${TESTS_S:-180}" python3 -m pytest -v -m gpu -p no:cacheprovider --durations=15 ${TEST_FILES:-tests/test_route_kernel.py \
    tests/test_kernels.py tests/test_budget_triton.py tests/test_engine.py} > "$LOG/gpu_tests.log" 2>&1
  echo "rc=$?" >> "$LOG/gpu_tests.log"; tail -3 "$LOG/gpu_tests.log"
fi
if [[ " $PARTS " == *" kernels "* ]]; then
  stamp "kernel benchmark"
  timeout "${KERNELS_S:-240}" python3 -m tools.bench_kernels --out "$LOG/kernels" --skip-tests --tune-paths v3 \
    --ts ${KERNEL_TS:-1 16 64} --impls base_triton_v3 base_triton grouped_mm --budget-s "${BENCH_S:-170}" \
    ${KERNEL_MODELS:+--models $KERNEL_MODELS} \
    --tune-s "${TUNE_S:-70}" > "$LOG/bench.log" 2>&1
  echo "rc=$?" >> "$LOG/bench.log"; tail -40 "$LOG/bench.log"
  cp "$TABLE" "$LOG/kernels/installed_configs.json" 2>/dev/null
  tar czf "$OUT/kernels.tgz" -C "$LOG" kernels bench.log
fi
if [[ " $PARTS " == *" steptune "* ]]; then
  stamp "step kernels tuned"
  timeout "${STEPTUNE_S:-450}" python3 -m tools.tune_step_kernels --csv "$LOG/tune_step.csv" ${STEPTUNE_ARGS:-} > "$LOG/tune_step.log" 2>&1
  echo "rc=$?" >> "$LOG/tune_step.log"; tail -30 "$LOG/tune_step.log"
  cp "$TABLE" "$LOG/installed_configs.json"
  cp "$LOG/tune_step.csv" "$LOG/tune_step.log" "$LOG/installed_configs.json" "$OUT/" 2>/dev/null
fi
if [[ " $PARTS " == *" exptune "* ]]; then
  # the expert kernels' table for this GPU: both paths (v2 with its reduce-in-down choice, v3) and the
  # kept bound up to which v3 wins (kernels/experts.py), installed into $TABLE. tools/tune_kernels
  # starts no token count after --budget-s and installs only at its end: the timeout leaves it room
  stamp "expert kernels tuned"
  timeout "${EXPTUNE_S:-420}" python3 -m tools.tune_kernels --models ${EXPTUNE_MODELS:-qwen3_30b_a3b} --ts ${EXPTUNE_TS:-1 16 64} \
    --budget-s "${EXPTUNE_BUDGET_S:-240}" > "$LOG/tune_experts.log" 2>&1
  echo "rc=$?" >> "$LOG/tune_experts.log"; tail -20 "$LOG/tune_experts.log"
  cp "$TABLE" "$LOG/installed_configs.json"
  cp "$LOG/tune_experts.log" "$LOG/installed_configs.json" "$OUT/" 2>/dev/null
fi
if [[ " $PARTS " == *" micro "* ]]; then
  # the selection kernel rule by rule against another version of kernels/select.py (SELECT_BASELINE, a
  # file), and kernels/skinny.py's launches against cuBLAS: interleaved rounds, median and range
  # MICRO: which of the two (default both); SKINNY_ARGS e.g. --install (the winners into kernels/configs)
  if [[ " ${MICRO:-select skinny} " == *" select "* ]]; then
    stamp "selection kernel A/B"
    timeout "${SELECT_S:-150}" python3 -m tools.bench_select --csv "$LOG/bench_select.csv" --ts "${SELECT_TS:-1,16,64}" \
      ${SELECT_WARPS:+--warps "$SELECT_WARPS"} ${SELECT_FORMS:+--forms "$SELECT_FORMS"} \
      ${SELECT_BASELINE:+--baseline "$SELECT_BASELINE"} > "$LOG/bench_select.log" 2>&1
    echo "rc=$?" >> "$LOG/bench_select.log"; tail -30 "$LOG/bench_select.log"
  fi
  if [[ " ${MICRO:-select skinny} " == *" skinny "* ]]; then
    stamp "skinny GEMM against cuBLAS"
    timeout "${SKINNY_S:-120}" python3 -m tools.bench_skinny --csv "$LOG/bench_skinny.csv" ${SKINNY_ARGS:-} > "$LOG/bench_skinny.log" 2>&1
    echo "rc=$?" >> "$LOG/bench_skinny.log"; tail -45 "$LOG/bench_skinny.log"
    cp "$TABLE" "$LOG/installed_configs.json"
  fi
  if [[ " ${MICRO:-select skinny} " == *" attention "* ]]; then
    stamp "decode attention A/B"
    timeout "${ATTN_S:-240}" python3 -m tools.bench_attention --csv "$LOG/bench_attention.csv" \
      ${ATTN_BASELINE:+--baseline "$ATTN_BASELINE"} > "$LOG/bench_attention.log" 2>&1
    echo "rc=$?" >> "$LOG/bench_attention.log"; tail -32 "$LOG/bench_attention.log"
  fi
  if [[ " ${MICRO:-select skinny} " == *" experts "* ]]; then
    stamp "expert FFN A/B"
    timeout "${EXPERTS_S:-240}" python3 -m tools.bench_experts --csv "$LOG/bench_experts.csv" \
      ${EXPERTS_BASELINE:+--baseline "$EXPERTS_BASELINE"} > "$LOG/bench_experts.log" 2>&1
    echo "rc=$?" >> "$LOG/bench_experts.log"; tail -32 "$LOG/bench_experts.log"
  fi
  cp "$LOG"/bench_select.* "$LOG"/bench_skinny.* "$LOG"/bench_attention* "$LOG"/bench_experts.* "$LOG/installed_configs.json" \
    "$OUT/" 2>/dev/null
fi
if [[ " $PARTS " == *" grid "* ]]; then
  # SPECS: runs of one process each, "model:routing" or "model:routing:[batch,...]" (default MODEL:ROUTING)
  for spec in ${SPECS:-$MODEL:$ROUTING}; do
    IFS=: read -r m r b <<< "$spec"
    stamp "grid $m $r ${b:-}"
    # one log per spec (two specs of one model and routing at other batches keep both); a run found
    # finished is skipped, and its line (with the commit that made it, where not this one) is printed
    tag=$(tr -cd '0-9,' <<< "${b:-}" | tr ',' '_'); glog="$LOG/grid_${m}_${r}${tag:+_b$tag}.log"
    timeout "${GRID_S:-330}" python3 run.py experiment=throughput model="$m" model.routing="$r" \
      ${b:+"throughput.batch_sizes=$b"} ${GRID_EXTRA:-} > "$glog" 2>&1
    echo "rc=$?" >> "$glog"
    grep -E "^\[throughput\] batch|skipping|Error|error" "$glog" | tail -40
    tar czf "$OUT/grid.tgz" outputs/throughput -C "$(dirname "$LOG")" "$(basename "$LOG")"
  done
  python3 -m analysis.throughput outputs/throughput "$LOG/throughput" > /dev/null 2>&1 && cp "$LOG/throughput.md" "$OUT/"
  tar czf "$OUT/grid.tgz" outputs/throughput -C "$(dirname "$LOG")" "$(basename "$LOG")"
fi
if [[ " $PARTS " == *" ab "* ]]; then
  # an A/B of one throughput key on one machine: AB_KEY's two AB_VALUES in the order a b b a, each
  # a run of AB_METHODS at batch 16 (analysis: python -m analysis.throughput_ablation <runs> <out> <name>,
  # one of its ABLATIONS, e.g. compile for AB_KEY=throughput.compile);
  # AB_NAME: a subfolder of outputs/ab for this A/B, so two A/Bs of one call stay apart
  : "${AB_KEY:?PARTS=ab needs AB_KEY (a throughput key) and AB_VALUES (its two values)}" "${AB_VALUES:?}"
  read -r va vb <<< "$AB_VALUES"
  i=0
  for v in "$va" "$vb" "$vb" "$va"; do
    i=$((i + 1)); stamp "ab $i $AB_KEY=$v"
    timeout "${AB_S:-100}" python3 run.py experiment=throughput model="$MODEL" model.routing="$ROUTING" \
      throughput.batch_sizes=[16] "throughput.methods=${AB_METHODS:-[dense,base]}" throughput.budgets=[16] \
      "$AB_KEY=$v" outputs_dir="outputs/ab/${AB_NAME:+$AB_NAME/}${i}_$v" ${AB_EXTRA:-} > "$LOG/ab_${AB_NAME:-}${i}_$v.log" 2>&1
    echo "rc=$?" >> "$LOG/ab_${AB_NAME:-}${i}_$v.log"
    grep -E "^\[throughput\] batch|Error" "$LOG/ab_${AB_NAME:-}${i}_$v.log" | tail -4
  done
  tar czf "$OUT/ab.tgz" outputs/ab -C "$(dirname "$LOG")" "$(basename "$LOG")"
fi
cp "$LOG/gpu_tests.log" "$OUT/" 2>/dev/null
stamp "done"
