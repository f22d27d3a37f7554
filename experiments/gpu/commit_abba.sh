#!/usr/bin/env bash
# The decode step at two commits on one machine, in the order a b b a: tells a change from a machine
# difference when two grids from different calls disagree by a few percent. Tree a is another commit's
# code (no results), packed on the host and carried; tree b is the working tree the call runs in.
#   git archive --format=tar.gz -o .abba/a.tgz <commit> .gitignore Makefile analysis base conf data \
#     experiments kernels pyproject.toml run.py tasks tools
#   echo '/.abba/' >> .git/info/exclude        # carried like .whl: carry [".whl", ".abba"]
#   ABBA_A_COMMIT=<commit> bash experiments/gpu/commit_abba.sh
#   (ABBA_A_COMMIT may be tree b's own commit when a tuner of this call changed tree b's kernels/configs:
#   then the A/B is of the tables alone, below)
#   ABBA_S=seconds     each run's limit (default 120; on a machine's first call each tree compiles its kernels
#                      once: batch [16,64] runs took 60-80 s warm and passed 105 s cold, grid_2026-12-06d)
#   ABBA_FIRST_S=s     the limit of each side's first run (default ABBA_S + 90): a side's first run on a
#                      machine (and tree a's after a change of its commit) also calibrates and fits the
#                      predictor (about 45 s for Qwen3-30B-A3B's shape); at ABBA_S=60 both a runs of
#                      branches_2026-12-06g's call 7 stopped before finishing a cell. Timed rounds are
#                      interleaved inside a run, so a longer first limit changes no comparison
#   ABBA_B_COMMIT=c    tree b is that commit's archive, .abba/b.tgz (packed as a.tgz above), not the working tree:
#                      the call's working tree can then run something else first (its GPU suite), and a branch
#                      is A/B'd against main without checking it out on the host
#   ABBA_MODEL=name    the model shape (default qwen3_30b)
#   ABBA_TREE_A=dir    where tree a is unpacked (default /tmp/abba_a; ABBA_TREE_B, /tmp/abba_b, tree b's archive);
#                      ABBA_RUNS=dir the runs (default /tmp/abba_runs)
#   ABBA_EXTRA='...'   overrides added to every run (default: Qwen3-30B-A3B, batch 16, M=16, dense and base,
#                      5 interleaved rounds)
# -> $OUT/abba.tgz (four run folders 1_a, 2_b, 3_b, 4_a and their logs); read them with
#    python -m analysis.abba <runs>/* --out <out> (the two commits' rounds, tested), and
#    python -m analysis.throughput <folder> <out> per run (its profile).
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/gpu/checks.sh  # a misspelt model or limit: refused before anything is written
[ -n "${ABBA_A_COMMIT:-}" ] || refuse commit_abba "ABBA_A_COMMIT is not set: the commit .abba/a.tgz holds (its report.json names it)"
[ -f .abba/a.tgz ] || refuse commit_abba ".abba/a.tgz missing (see this script's header)"
if [ -n "${ABBA_B_COMMIT:-}" ]; then
  [ -f .abba/b.tgz ] || refuse commit_abba "ABBA_B_COMMIT=$ABBA_B_COMMIT names tree b's archive, and .abba/b.tgz is missing"
fi
check_model commit_abba ABBA_MODEL "${ABBA_MODEL:-qwen3_30b}"
check_seconds commit_abba ABBA_S "${ABBA_S:-}"; check_seconds commit_abba ABBA_FIRST_S "${ABBA_FIRST_S:-}"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source experiments/gpu/env.sh
b_commit=${ABBA_B_COMMIT:-${BASE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}}
# run.py refuses a BASE_COMMIT that is not a commit: refuse here, before any run spends device time
for c in "$ABBA_A_COMMIT" "$b_commit"; do
  [[ $c =~ ^[0-9a-f]{7,40}$ ]] || refuse commit_abba "'$c' is not a commit (7 to 40 hex digits): set ABBA_A_COMMIT and BASE_COMMIT (or ABBA_B_COMMIT) to commits"
done
# tree a is unpacked afresh; on a warm machine its calibration and predictor fits (outputs/artifacts, keyed
# by config) are kept from the last call when that call unpacked the same commit: its first run skips them
tree_a=${ABBA_TREE_A:-/tmp/abba_a}; kept=$tree_a.artifacts
rm -rf "$kept"
if [ "$(cat "$tree_a/.abba_commit" 2>/dev/null)" = "$ABBA_A_COMMIT" ] && [ -d "$tree_a/outputs/artifacts" ]; then
  mv "$tree_a/outputs/artifacts" "$kept"
fi
rm -rf "$tree_a"; mkdir -p "$tree_a"
tar xzf .abba/a.tgz -C "$tree_a" || refuse commit_abba ".abba/a.tgz does not unpack"
if [ -d "$kept" ]; then
  mkdir -p "$tree_a/outputs" && mv "$kept" "$tree_a/outputs/artifacts"
  echo "[abba] tree a: the artifacts of the last call's tree a ($ABBA_A_COMMIT) kept"
fi
echo "$ABBA_A_COMMIT" > "$tree_a/.abba_commit"
tree_b=$PWD
if [ -n "${ABBA_B_COMMIT:-}" ]; then  # unpacked afresh: its first run calibrates (ABBA_FIRST_S)
  tree_b=${ABBA_TREE_B:-/tmp/abba_b}; rm -rf "$tree_b"; mkdir -p "$tree_b"
  tar xzf .abba/b.tgz -C "$tree_b" || refuse commit_abba ".abba/b.tgz does not unpack"
  echo "[abba] tree b: .abba/b.tgz ($ABBA_B_COMMIT)"
fi
# one commit on both sides is an A/B of the tuned tables alone: a table this call's tuner installed into
# tree b (roofline.sh's steptune, exptune or micro with --install) against the commit's own, with no
# commit and no cold start between the tune and its A/B; each run's report.json names its table's hash
# (provenance.kernel_table), and the table to commit is the tuner's installed_configs.json
if [ "$ABBA_A_COMMIT" = "$b_commit" ]; then
  if diff -rq "$tree_a/kernels/configs" "$tree_b/kernels/configs" > /dev/null; then
    refuse commit_abba "both sides are commit $b_commit with the same kernels/configs: nothing to compare"
  fi
  echo "[abba] both sides commit $b_commit; b's tuned tables differ from a's:"
  diff -rq "$tree_a/kernels/configs" "$tree_b/kernels/configs" | sed 's/^/[abba]   /'
fi
runs=${ABBA_RUNS:-/tmp/abba_runs}; rm -rf "$runs"; mkdir -p "$runs"
t0=$(date +%s)
i=0
for side in a b b a; do
  i=$((i + 1))
  if [ "$side" = a ]; then tree=$tree_a; commit=$ABBA_A_COMMIT; else tree=$tree_b; commit=$b_commit; fi
  echo "[abba $(( $(date +%s) - t0 ))s] run $i: $side ($commit)"
  limit=${ABBA_S:-120}; [ "$i" -le 2 ] && limit=${ABBA_FIRST_S:-$(( ${ABBA_S:-120} + 90 ))}
  (cd "$tree" && BASE_COMMIT=$commit timeout "$limit" python3 run.py experiment=throughput model="${ABBA_MODEL:-qwen3_30b}" \
    model.routing=uniform throughput.batch_sizes=[16] throughput.budgets=[16] throughput.repeats=5 \
    "throughput.methods=[dense,base]" ${ABBA_EXTRA:-} outputs_dir="$runs/${i}_$side" > "$runs/${i}_$side.log" 2>&1)
  echo "rc=$?" >> "$runs/${i}_$side.log"
  grep -E "^\[throughput\] batch|Error" "$runs/${i}_$side.log" | tail -4
done
tar czf "$OUT/abba.tgz" -C "$(dirname "$runs")" "$(basename "$runs")"
echo "[abba $(( $(date +%s) - t0 ))s] done"
