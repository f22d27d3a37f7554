#!/usr/bin/env bash
# Issue 41's held-out models (docs/preregistration_heldout.md), one CPU thread each:
#   bash experiments/heldout/train_models.sh olmoe64_s1 [more names]     -> outputs/models/<name>/
# Each trains on the corpus of data seed 0 (the prompt pools exclude it) for a fixed 1,500 steps.
set -euo pipefail
PY=${PY:-.venv/bin/python}
common=(--device cpu --hidden-size 128 --layers 4 --heads 4 --aux-coef 0.05 --experts-impl eager --batch-size 128
        --warmup-steps 100 --n-train 40000 --steps 1500 --data-seed 0 --eval-every-s 100000 --save-every-s 900
        --log-every 25)
for name in "$@"; do
  case "$name" in
    olmoe64_s1)  args=(--family olmoe --num-experts 64 --top-k 8 --expert-width 48 --seed 1) ;;
    olmoe64_s2)  args=(--family olmoe --num-experts 64 --top-k 8 --expert-width 48 --seed 2) ;;
    olmoe32_s1)  args=(--family olmoe --num-experts 32 --top-k 8 --expert-width 48 --seed 1) ;;
    olmoe128_s1) args=(--family olmoe --num-experts 128 --top-k 8 --expert-width 24 --seed 1) ;;
    qwen32_s1)   args=(--family qwen3_moe --num-experts 32 --top-k 4 --expert-width 48 --seed 1) ;;
    qwen64_s1)   args=(--family qwen3_moe --num-experts 64 --top-k 8 --expert-width 48 --seed 1) ;;
    qwen128_s1)  args=(--family qwen3_moe --num-experts 128 --top-k 8 --expert-width 24 --seed 1) ;;
    *) echo "error: unknown model $name; one of olmoe64_s1 olmoe64_s2 olmoe32_s1 olmoe128_s1 qwen32_s1 qwen64_s1 qwen128_s1" >&2; exit 2 ;;
  esac
  OMP_NUM_THREADS=1 $PY -m experiments.mini.train "${common[@]}" "${args[@]}" --out "outputs/models/$name"
done
