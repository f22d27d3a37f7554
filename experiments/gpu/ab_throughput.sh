#!/usr/bin/env bash
# Two checkouts' decode throughput on one GPU, interleaved: did a change move the measured speed?
#   ORDER="new old" bash experiments/gpu/ab_throughput.sh OLD_DIR [MODEL]      (run from the new checkout)
#   PATCH=experiments/gpu/ab.patch ORDER="old new new old" bash experiments/gpu/ab_throughput.sh - [MODEL]
#     (a branch not yet merged: `git diff main BRANCH > experiments/gpu/ab.patch`, untracked, travels with
#     the tree; "old" = the tree as sent, "new" = a copy of it with the patch applied)
# Runs, for each entry of ORDER (a checkout per run), the Qwen3-30B-A3B grid cells that
# results/throughput/ reports for the guard (uniform routing, batch 16 and 64, dense, router_sum,
# base and fixed at M=16 and 10; conf/experiment/throughput.yaml otherwise), or CELLS (throughput
# overrides in their place, e.g. CELLS='throughput.batch_sizes=[16] throughput.budgets=[16]
# throughput.methods=[dense,base]'), each in its own process; EXTRA is appended to either. Every run
# writes <i>_<label>/{throughput.csv,report.json,...} and <i>_<label>.log, packed into
# $OUT/ab_<TAG>.tgz (the device tool returns few files); TESTS=1 first runs the new checkout's GPU
# tests (TEST_FILES, default the engine's and kernels') into gpu_tests.log there, and no run starts
# if they fail. Then
#   python -m analysis.ab_throughput <unpacked folders ...> --out results/refactor_guard/h200
# compares the runs with each other and with results/throughput/ (or --reference).
set -uo pipefail
OLD=$1; MODEL=${2:-qwen3_30b}
OUT=${OUT:-/tmp/out}; AB=/tmp/ab_${TAG:-1}; mkdir -p "$OUT" "$AB"
source "$(dirname "$0")/env.sh"
NEW=$(pwd)
if [ -n "${PATCH:-}" ]; then
  OLD=$(pwd); NEW=/tmp/ab_new; rm -rf "$NEW"; cp -r . "$NEW"
  (cd "$NEW" && git apply "$OLD/$PATCH") || { echo "ab_throughput: $PATCH does not apply to this tree" >&2; exit 2; }
fi
if [ "${TESTS:-0}" = 1 ]; then
  (cd "$NEW" && python3 -m pytest -q -m gpu -p no:cacheprovider ${TEST_FILES:-tests/test_engine.py tests/test_attention.py \
    tests/test_kernels.py tests/test_budget_triton.py tests/test_multi_gpu.py}) > "$AB/gpu_tests.log" 2>&1
  rc=$?; echo "tests rc=$rc" >> "$AB/gpu_tests.log"; tail -3 "$AB/gpu_tests.log"
  tar czf "$OUT/ab_${TAG:-1}.tgz" -C "$(dirname "$AB")" "$(basename "$AB")"
  [ $rc -eq 0 ] || { echo "ab_throughput: the new checkout's GPU tests failed: no runs" >&2; exit 1; }
fi
# the guard's cells time only (no profile, no eager reference, no non-expert pass); CELLS given: the
# experiment's defaults otherwise (the profile included, which analysis.ab_throughput reads)
CELLS=${CELLS:-'throughput.methods=[dense,router_sum,base,fixed] throughput.budgets=[16,10] throughput.batch_sizes=[16,64]
  throughput.profile_batch=null throughput.eager_reference=false throughput.non_expert=false'}
i=${FIRST:-0}
for label in ${ORDER:-new old}; do
  dir=$NEW; [ "$label" = old ] && dir=$OLD
  i=$((i + 1))
  run="$AB/${i}_${label}"
  (cd "$dir" && PYTHONPATH="$dir:${PYTHONPATH:-}" timeout "${RUN_LIMIT:-400}" python3 run.py experiment=throughput \
    model="$MODEL" exp_name=ab outputs_dir="$AB" hydra.run.dir="$run" artifacts_dir=/tmp/ab_artifacts $CELLS ${EXTRA:-} \
    > "$run.log" 2>&1) || echo "FAILED $i $label" >> "$AB/failed.log"
  grep -E "^\[throughput\] batch" "$run.log" | sed "s/^/[$i $label] /"
  tar czf "$OUT/ab_${TAG:-1}.tgz" -C "$(dirname "$AB")" "$(basename "$AB")"  # after each run: a cut call keeps what ran
done
[ -f "$AB/failed.log" ] && cat "$AB/failed.log"
