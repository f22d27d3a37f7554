# Sourced by the GPU scripts here: the device host lacks hydra-core/omegaconf (and may lack
# accelerate), so the wheels carried in .whl/ go to /tmp/site; offline hub, unbuffered logs, and a
# cap on torch's CPU threads (two runs share the host's cores; uncapped, the predictor fit of
# Qwen3's first base configuration took 403 s against 25 s capped).
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
# BASE_COMMIT=<sha>: the device's copy of .git can be older than the tree it runs (run.py's report.json
# and gpu_test.sh's log name it). `device_tree.sh slim` writes the host's HEAD to
# experiments/gpu/base_commit.txt, which travels with the tree; a BASE_COMMIT set on the command line wins.
if [ -z "${BASE_COMMIT:-}" ] && [ -f experiments/gpu/base_commit.txt ]; then
  export BASE_COMMIT=$(cat experiments/gpu/base_commit.txt)
fi
