#!/usr/bin/env bash
# make demo: on the default model, calibrate -> fit -> evaluate (dense and base) -> CPU throughput
# smoke (dense and base), then print one comparison table read from outputs/demo/.
set -euo pipefail
PY=${PY:-.venv/bin/python}
common=(exp_name=demo logger=none "$@")
$PY run.py "${common[@]}" stage=calibrate
$PY run.py "${common[@]}" stage=fit
$PY run.py -m "${common[@]}" stage=evaluate method=dense,base
$PY run.py -m "${common[@]}" stage=throughput method=base
$PY -m analysis.compare outputs/demo
