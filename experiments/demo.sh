#!/usr/bin/env bash
# make demo: on the default model, dense and base at M=8 on the eight offline tasks (base's first
# run calibrates and fits its predictor), then a CPU smoke of the decode engine; prints one table
# and the README's Quick start line (analysis/headline.py demo_line), read from <outputs>/demo/.
#   DEMO_OUTPUTS=dir bash experiments/demo.sh     # another outputs_dir (tests/test_demo.py)
set -euo pipefail
PY=${PY:-.venv/bin/python}
OUTS=${DEMO_OUTPUTS:-outputs}
common=(exp_name=demo logger=none "outputs_dir=$OUTS" "$@")
# dense and base evaluate at once, one thread each (2 cores): the same samples as one after the
# other at two threads, in about 60 % of the time (Hydra's joblib launcher, installed by make install)
OMP_NUM_THREADS=1 $PY run.py -m "${common[@]}" stage=evaluate method=dense,base hydra/launcher=joblib hydra.launcher.n_jobs=2
$PY run.py -m "${common[@]}" stage=throughput method=base "throughput.batch_sizes=[1,16]" throughput.prompt_len=32 throughput.gen_tokens=17 throughput.profile_batch=null
$PY -m analysis.compare "$OUTS/demo"
echo
echo "Quick start line: $($PY -m analysis.headline --demo "$OUTS/demo")"
