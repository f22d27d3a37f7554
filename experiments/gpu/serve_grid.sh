#!/usr/bin/env bash
# The serving benchmark of results/serve/ (issue 26) on one H200, in about 10 minutes (one routing per device call):
# conf/experiment/serve.yaml (Qwen3-30B-A3B's shape with random bf16 weights, 16 slots; dense, base and
# base_anchor (k0=1) at M=16 and M=10; 12 requests per stream, prompts 128-512 and outputs 16-64 tokens;
# the closed burst and Poisson arrivals at 4 and 16 requests/s; 5 repeats, the variants' order
# rotated; the run's scheduler.* defaults: packed prefill, the host one step behind) for uniform, then
# skewed routing, one process each. Everything lands in $OUT:
#   serve.tgz                 the run folders (serve.csv, requests.jsonl, report.json, config) and logs
#   serve_summary.md          analysis/serving.py over both routings (a first look; commit the host's;
#                             its .csv and TPOT plot are in serve.tgz: a call returns at most 8 files)
# On the host afterwards:
#   mkdir -p results/serve/runs && tar xzf serve.tgz -C results/serve/runs --strip-components=1
#   python -m analysis.serving results/serve/runs results/serve/summary
#
# Time, estimated (not measured for this script) from results/stream/'s runs on an H200:
#   wheels, Python and the model built               ~30 s per routing
#   calibration and predictor fit (base, base_anchor) ~20 s per routing
#   prefill-shape warm-up: compiles, every token bucket's graphs, each prompt once
#                                                    ~30-60 s per routing (the second routing reuses
#                                                    inductor's on-disk cache)
#   25 engine visits (5 repeats x 5 variants)        ~8.5 s each: engine and its graphs ~2 s, the burst
#                                                    ~1.5 s, 4 req/s ~3.8 s (12 arrivals over 3 s, then
#                                                    the last request's decode), 16 req/s ~1.6 s  -> ~215 s
#   => ~4.8 min per routing: one routing per device call (ROUTINGS=uniform, then ROUTINGS=skewed).
# To fit the device's time, each routing runs under a limit: uniform UNIFORM_LIMIT s (default 330),
# skewed what is left of DEADLINE s (default 540) since the start. Every stream's records are written
# as it ends, so a run stopped at its limit keeps the streams it finished (in its .partial-* folder;
# analysis/serving.py reads those too). Cut further with EXTRA, e.g.
# EXTRA='serve.rates=[null,8.0]' (fewer rates) or ROUTINGS=uniform; EXTRA='scheduler.chunked=true' serves
# with chunked prefill (mixed steps).
set -uo pipefail
source "$(dirname "$0")/checks.sh"  # a misspelt routing or limit: refused before anything is written
for r in ${ROUTINGS:-uniform skewed}; do check_routing serve-grid "ROUTINGS" "$r"; done
check_seconds serve-grid UNIFORM_LIMIT "${UNIFORM_LIMIT:-}"; check_seconds serve-grid DEADLINE "${DEADLINE:-}"
OUT=${OUT:-/tmp/out}; W=${W:-/tmp/serve_runs}; mkdir -p "$OUT" "$W"  # W: the run folders (one per routing)
T0=$(date +%s)
source "$(dirname "$0")/env.sh"
for r in ${ROUTINGS:-uniform skewed}; do
  elapsed=$(( $(date +%s) - T0 ))
  if [ "$r" = uniform ]; then limit=${UNIFORM_LIMIT:-330}; else limit=$(( ${DEADLINE:-540} - elapsed )); fi
  if [ "$limit" -lt 60 ]; then echo "[serve-grid] $r skipped: ${limit} s left" | tee -a "$W/failed.log"; continue; fi
  echo "[serve-grid] $r: start at ${elapsed} s, limit ${limit} s"
  timeout -k 10 "$limit" python3 run.py experiment=serve model.routing=$r outputs_dir="$W" hydra.run.dir="$W/$r" \
    artifacts_dir=/tmp/serve_artifacts ${EXTRA:-} > "$W/$r.log" 2>&1 || echo "FAILED or stopped: $r (rc $?)" >> "$W/failed.log"
  grep -E "^\[serve\]" "$W/$r.log" | sed "s/^/[$r] /"
  echo "[serve-grid] $r: done at $(( $(date +%s) - T0 )) s"
  tar czf "$OUT/serve.tgz" -C "$(dirname "$W")" "$(basename "$W")"
done
# the summary goes inside the tarball, only its .md beside it: a device call returns at most 8 files,
# so two bursts (OUT=$OUT/a, OUT=$OUT/b) and a grid fit one call
python3 -m analysis.serving "$W" "$W/serve_summary" > "$W/analysis.log" 2>&1 || tail -5 "$W/analysis.log"
cp "$W/serve_summary.md" "$OUT/" 2>/dev/null
tar czf "$OUT/serve.tgz" -C "$(dirname "$W")" "$(basename "$W")"
[ -f "$W/failed.log" ] && cat "$W/failed.log"
echo "[serve-grid] all done at $(( $(date +%s) - T0 )) s"
