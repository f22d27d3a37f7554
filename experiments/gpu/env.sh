# Sourced by the GPU scripts here: the device host lacks hydra-core/omegaconf (and may lack
# accelerate), so the wheels carried in .whl/ go to /tmp/site; offline hub, unbuffered logs, and a
# cap on torch's CPU threads (two runs share the host's cores; uncapped, the predictor fit of
# Qwen3's first base configuration took 403 s against 25 s capped).
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
# BASE_COMMIT=<sha>, set on the call's command line with the host's HEAD written out: the device's
# copy of .git can be older than the tree it runs (run.py's report.json and gpu_test.sh's log name it).
