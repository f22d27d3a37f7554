#!/usr/bin/env bash
# A/B of a code change (a branch) against this tree on one GPU, in one device call, interleaved
# by process: rounds of "a b" (tree as sent, tree with the patch applied in a copy), each one
# throughput run of the same overrides, so clocks and thermal drift hit both sides alike.
#   git diff main my-branch > experiments/gpu/ab.patch     # untracked files travel with the tree
#   PATCH=experiments/gpu/ab.patch PATCH_TESTS=tests/test_kernels.py ROUNDS=3 \
#     RUN_ARGS='model=gpt_oss_20b throughput.batch_sizes=[16] throughput.budgets=[16] throughput.methods=[dense,base]' \
#     bash experiments/gpu/ab_patch.sh
#   -> $OUT/ab_patch.tgz (per round and side: run log, report.json), $OUT/ab_patch.log
#   (the patched tree's GPU tests run first; no rounds run if they fail)
# Read it with: grep "ms/step" ab_patch.log  (side, round, method, median ms of the run's repeats)
# ROUND_S caps one run; rounds stop starting once AB_S seconds have passed.
set -uo pipefail
OUT=${OUT:-/tmp/out}; LOG=/tmp/ab_patch; rm -rf "$LOG"; mkdir -p "$OUT" "$LOG"
source "$(dirname "$0")/env.sh"
: "${PATCH:?PATCH=<git diff file> is required}"; : "${RUN_ARGS:?RUN_ARGS=<throughput overrides> is required}"
B=/tmp/ab_patch_b; rm -rf "$B"; cp -r . "$B"
(cd "$B" && git apply "$OLDPWD/$PATCH") || { echo "ab_patch: $PATCH does not apply" | tee "$LOG/ab_patch.log"; exit 2; }
t0=$(date +%s); say() { echo "[ab_patch $(( $(date +%s) - t0 ))s] $*" | tee -a "$LOG/ab_patch.log"; }
if [ -n "${PATCH_TESTS:-}" ]; then
  say "GPU tests of the patched tree: $PATCH_TESTS"
  (cd "$B" && timeout "${TESTS_S:-150}" python3 -m pytest -q -m gpu -p no:cacheprovider $PATCH_TESTS) > "$LOG/tests_b.log" 2>&1
  rc=$?; tail -2 "$LOG/tests_b.log" | tee -a "$LOG/ab_patch.log"
  [ $rc -eq 0 ] || { say "patched tree's GPU tests failed (rc=$rc): no rounds"; tar czf "$OUT/ab_patch.tgz" -C /tmp ab_patch; cp "$LOG/ab_patch.log" "$OUT/"; exit 1; }
fi
for r in $(seq 1 "${ROUNDS:-3}"); do
  for side in a b; do
    [ $(( $(date +%s) - t0 )) -lt "${AB_S:-450}" ] || { say "time up before round $r $side"; break 2; }
    dir=$PWD; [ $side = b ] && dir=$B
    (cd "$dir" && rm -rf outputs/throughput && timeout "${ROUND_S:-150}" python3 run.py experiment=throughput $RUN_ARGS) \
      > "$LOG/${side}_r$r.log" 2>&1
    say "round $r $side rc=$?"
    grep -E "^\[throughput\] batch" "$LOG/${side}_r$r.log" | sed "s/^/$side r$r /" | tee -a "$LOG/ab_patch.log"
    find "$dir/outputs/throughput" -name report.json -exec cp {} "$LOG/${side}_r${r}_report.json" \; 2>/dev/null
  done
done
tar czf "$OUT/ab_patch.tgz" -C /tmp ab_patch; cp "$LOG/ab_patch.log" "$OUT/"
