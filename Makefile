# base-moe. `make help` lists the targets.
SHELL := /bin/bash
PY := .venv/bin/python
OFFLINE := HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_SILENT=true
STAMP := .venv/.installed-$(shell md5sum pyproject.toml | cut -c1-8)

.PHONY: help install test test-slow test-gpu demo quality bench-kernels clean

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

clean:  ## remove outputs (keeps the venv)
	rm -rf outputs/*/ wandb
