#!/usr/bin/env bash
# make demo: on the default model, calibrate -> fit -> evaluate (dense and base) -> CPU throughput
# smoke (dense and base), then print one comparison table read from outputs/demo/.
set -euo pipefail
PY=${PY:-.venv/bin/python}
common=(exp_name=demo logger=none "$@")
$PY run.py "${common[@]}" stage=calibrate
$PY run.py "${common[@]}" stage=fit
$PY run.py -m "${common[@]}" stage=evaluate method=dense,base
$PY run.py -m "${common[@]}" stage=throughput method=base "throughput.batch_sizes=[1,16]" throughput.prompt_len=32 throughput.gen_tokens=17 throughput.profile_batch=null
$PY -m analysis.compare outputs/demo
