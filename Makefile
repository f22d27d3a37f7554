# base-moe. `make help` lists the targets.
SHELL := /bin/bash
PY := .venv/bin/python
OFFLINE := HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_SILENT=true
STAMP := .venv/.installed-$(shell md5sum pyproject.toml | cut -c1-8)

.PHONY: help install test test-slow test-gpu demo mini specialisation quality bench-kernels clean

help:  ## list targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x .venv/bin/python || python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -e '.[dev]'
	rm -f .venv/.installed-*; touch $(STAMP)

install: $(STAMP)  ## create .venv if missing and install the project (torch pinned to the CPU build)

test: $(STAMP)  ## run the test suite (CPU; GPU and slow tests are left out)
	$(OFFLINE) $(PY) -m pytest -q

test-slow: $(STAMP)  ## also run the slow tests
	$(OFFLINE) $(PY) -m pytest -q -m "slow or not slow"

test-gpu: $(STAMP)  ## GPU tests only (on a CUDA machine)
	$(OFFLINE) $(PY) -m pytest -q -m gpu

demo: $(STAMP)  ## calibrate, fit, evaluate and time dense vs base on the default model; print a table
	$(OFFLINE) bash experiments/demo.sh

MINI_DEVICE ?= cpu
MINI_TIME ?= 600
MINI_OUT ?= outputs/mini_model
mini: $(STAMP)  ## train the mini model (MINI_DEVICE=cpu|cuda MINI_TIME=s MINI_OUT=dir; shipped: cuda, 220 s)
	$(PY) -m experiments.mini.train --device $(MINI_DEVICE) --time-budget-s $(MINI_TIME) --out $(MINI_OUT)

specialisation: $(STAMP)  ## JS divergence between domains' routing; mixed vs single-domain union
	$(OFFLINE) $(PY) -m experiments.specialisation --model mini --out results/specialisation

quality: $(STAMP)  ## quality curves on the mini model (the sweep, then results/quality_mini.{csv,md})
	$(OFFLINE) $(PY) run.py -m experiment=quality_mini
	$(OFFLINE) $(PY) run.py -m experiment=quality_mini method=dense budget=null
	$(OFFLINE) $(PY) run.py -m experiment=quality_mini method=oea method.k0=1,2,3 budget=null
	$(OFFLINE) $(PY) run.py -m experiment=quality_mini method=base method.reassign=drop
	$(OFFLINE) $(PY) run.py exp_name=quality_mini stage=fit logger=none
	cp "outputs/quality_mini/stage=fit/predictor.csv" results/quality_mini_predictor_r2.csv
	$(PY) -m analysis.quality outputs/quality_mini results/quality_mini

bench-kernels:  ## on a CUDA machine: GPU tests, copy bandwidth, tuning, kernel timings -> benchmarks/kernels/
	python -m kernels.bench --out benchmarks/kernels
	python -m analysis.kernel_table benchmarks/kernels/$$(python -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))").json

clean:  ## remove outputs (keeps the venv)
	rm -rf outputs/*/ wandb
