#!/usr/bin/env bash
# The request-stream grid of results/stream/ on a CUDA machine: conf/experiment/stream.yaml for each
# routing given (default: uniform skewed), one process each; TESTS=1 first runs the continuous-batching
# GPU tests; EXTRA adds overrides to every run. Run folders and logs are packed into $OUT/stream_<TAG>.tgz.
#   TESTS=1 TAG=uniform bash experiments/gpu/stream_grid.sh uniform
#   python -m analysis.stream <unpacked run folders...> results/stream/summary
set -uo pipefail
source "$(dirname "$0")/checks.sh"  # a misspelt routing or limit: refused before anything is written
for r in ${@:-uniform skewed}; do check_routing stream-grid "the routings" "$r"; done
check_seconds stream-grid RUN_LIMIT "${RUN_LIMIT:-}"
OUT=${OUT:-/tmp/out}; W=/tmp/stream_${TAG:-1}; mkdir -p "$OUT" "$W"
source "$(dirname "$0")/env.sh"
if [ "${TESTS:-0}" = 1 ]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_continuous.py tests/test_engine.py > "$W/gpu_tests.log" 2>&1
  echo "tests rc=$?" >> "$W/gpu_tests.log"; tail -3 "$W/gpu_tests.log"
fi
for routing in "${@:-uniform skewed}"; do
  for r in $routing; do
    timeout "${RUN_LIMIT:-480}" python3 run.py experiment=stream model.routing=$r outputs_dir="$W" hydra.run.dir="$W/$r" \
      artifacts_dir=/tmp/stream_artifacts ${EXTRA:-} > "$W/$r.log" 2>&1 || echo "FAILED $r" >> "$W/failed.log"
    grep -E "^\[stream\]" "$W/$r.log" | sed "s/^/[$r] /"
    tar czf "$OUT/stream_${TAG:-1}.tgz" -C "$(dirname "$W")" "$(basename "$W")"
  done
done
[ -f "$W/failed.log" ] && cat "$W/failed.log"
