#!/usr/bin/env bash
# Every GPU test (pytest -m gpu) on a CUDA machine, with a JUnit XML and the log: `make gpu-test`.
# Run it after every change to kernels/ or the decode path, before that change is called done, and
# commit the log under results/gpu_tests/ with its index, `python -m analysis.gpu_tests` (a kernel
# config that reaches kernels/configs/ without a GPU run of its tests is a defect). On a device call
# (no .venv there): carry .whl (hydra-core, omegaconf: ../shared/device/wheels.sh) and run
# `bash experiments/gpu/gpu_test.sh`.
#   GPU_TEST_OUT=dir       where gpu_tests.xml and gpu_tests.log go (default $OUT, else outputs/gpu_tests)
#   GPU_TEST_S=seconds     the whole run's limit (default 480: the 8 minutes the suite must fit); at the limit
#                          pytest is interrupted (SIGINT), so a cut run still writes the XML of the tests it finished
#   GPU_TEST_FILES=...     a subset (default: every test file)
#   GPU_TEST_JOBS=N        pytest processes sharing the one GPU (pytest-xdist, --dist worksteal; default 4, or 1
#                          where xdist is missing). The suite's time is mostly Triton's and Inductor's compiling
#                          on the host's CPUs, which processes do side by side (no GPU test times anything):
#                          on an H100, 4 processes ran the same 96 outcomes in 178 and 147 s against one
#                          process's 419-453 s (results/gpu_tests/README.md: 2026-12-07c and d against
#                          2026-12-06m, 07 and 07b; one run each, not interleaved)
#   BASE_COMMIT=sha        the commit the log names (default: git's HEAD where it runs)
set -uo pipefail
cd "$(dirname "$0")/../.."
jobs=${GPU_TEST_JOBS:-4}
if ! [[ "$jobs" =~ ^[1-9][0-9]*$ ]]; then
  echo "gpu-test: GPU_TEST_JOBS='$jobs': the number of pytest processes, a whole number >= 1" >&2; exit 2
fi
source experiments/gpu/env.sh
PY=python3; [ -x .venv/bin/python ] && PY=.venv/bin/python
parallel=()
if [ "$jobs" -gt 1 ]; then
  if ! "$PY" -c "import xdist" 2>/dev/null; then
    if [ -n "${GPU_TEST_JOBS:-}" ]; then
      echo "gpu-test: GPU_TEST_JOBS=$jobs needs pytest-xdist, which $PY cannot import; install it or use GPU_TEST_JOBS=1" >&2; exit 2
    fi
    # the default asked for no particular count: the same tests in one process, only slower
    echo "gpu-test: pytest-xdist is missing, so one pytest process (GPU_TEST_JOBS=1)" >&2; jobs=1
  fi
fi
if [ "$jobs" -gt 1 ]; then
  parallel=(-n "$jobs" --dist worksteal)
  # env.sh's thread cap is for one process; N of them share the host's cores
  export OMP_NUM_THREADS=$(( $(nproc) / jobs > 0 ? $(nproc) / jobs : 1 ))
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu-test: no CUDA device here (the GPU tests would all skip); run it on a CUDA machine" >&2; exit 2
fi
out=${GPU_TEST_OUT:-${OUT:-outputs/gpu_tests}}; mkdir -p "$out"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
  "$PY" -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  # a device call's copy of .git can be older than its working tree: BASE_COMMIT=<host's HEAD> names the tree
  echo "commit ${BASE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')}"
  # the tuned tables under test, by content: a table a tuner installed in this call has no commit yet, and
  # tests/test_tuned_tables_tested.py finds the committed table's run by this hash
  for f in kernels/configs/*.json; do echo "table $(basename "$f") $(sha256sum < "$f" | cut -c1-16)"; done
} > "$out/gpu_tests.log" 2>&1
echo "pytest processes $jobs" >> "$out/gpu_tests.log"
timeout --signal=INT --kill-after=30 "${GPU_TEST_S:-480}" "$PY" -m pytest -m gpu -v -p no:cacheprovider --durations=25 --junitxml="$out/gpu_tests.xml" \
  "${parallel[@]}" ${GPU_TEST_FILES:-tests} >> "$out/gpu_tests.log" 2>&1
rc=$?
echo "rc=$rc" >> "$out/gpu_tests.log"
tail -4 "$out/gpu_tests.log"
exit $rc
