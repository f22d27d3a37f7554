# base-moe. `make help` lists the targets.
SHELL := /bin/bash
PY := .venv/bin/python
OFFLINE := HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_SILENT=true
STAMP := .venv/.installed-$(shell md5sum pyproject.toml | cut -c1-8)

.PHONY: help install test test-all gpu-test demo mini mini-olmoe mini128 replication-mini128 routing specialisation quality quality-seeds ablation admission rules replication bench-kernels report report-all clean

help:  ## list targets
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x .venv/bin/python || python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	# pip byte-compiles all 20,000 installed files on one core (43 s of a 77 s install on 2 cores);
	# here only what a run, the analysis and the tests import is compiled, by importing it (with
	# PYTHONDONTWRITEBYTECODE set, as it may be, every process would compile torch again)
	.venv/bin/pip install -q --no-compile -e '.[dev]'
	env -u PYTHONDONTWRITEBYTECODE $(OFFLINE) .venv/bin/python -c 'import lm_eval.evaluator, lm_eval.tasks, run, base.run.pipeline, analysis.report'
	# (the tests' imports too, by collecting them; a test module that cannot import is the test run's to report)
	env -u PYTHONDONTWRITEBYTECODE $(OFFLINE) .venv/bin/python -m pytest -q --collect-only -m 'slow or not slow' > /dev/null 2>&1 || true
	# an earlier install's transformers>=5.25 left Hugging Face's `kernels` behind: its name is ours (base/hf/compat.py)
	.venv/bin/pip uninstall -q -y kernels 2>/dev/null || true
	rm -f .venv/.installed-*; touch $(STAMP)

install: $(STAMP)  ## create .venv if missing and install the project (torch pinned to the CPU build)

$(PY):  # a first install, for targets that need the environment but not the latest install of it
	$(MAKE) install

# Tests run in TEST_JOBS worker processes (pytest-xdist), one thread each: on 2 cores, two workers
# with torch's default threads would oversubscribe them. worksteal: an idle worker takes queued tests
# from the other, so a few long tests near the end do not leave one core idle.
TEST_JOBS ?= 2
test: $(STAMP)  ## the fast tier: one representative of every group (CPU; slow and GPU tests left out; CI runs this)
	OMP_NUM_THREADS=1 $(OFFLINE) $(PY) -m pytest -q -n $(TEST_JOBS) --dist worksteal

test-all: $(STAMP)  ## every CPU test, the slow ones included (GPU tests skip without a GPU)
	OMP_NUM_THREADS=1 $(OFFLINE) $(PY) -m pytest -q -n $(TEST_JOBS) --dist worksteal -m "slow or not slow"

gpu-test:  ## every GPU test on a CUDA machine (< 8 min on an H200), JUnit XML + log -> outputs/gpu_tests/ (commit the log under results/gpu_tests/; GPU_TEST_JOBS=N: N pytest processes, default 4)
	$(OFFLINE) bash experiments/gpu/gpu_test.sh

demo: $(STAMP)  ## calibrate, fit, evaluate and time dense vs base on the default model; print a table
	$(OFFLINE) bash experiments/demo.sh

MINI_DEVICE ?= cpu
MINI_TIME ?= 600
MINI_OUT ?= outputs/mini_model
mini: $(STAMP)  ## train the mini model (MINI_DEVICE=cpu|cuda MINI_TIME=s MINI_OUT=dir; shipped: cuda, 220 s)
	$(PY) -m experiments.mini.train --device $(MINI_DEVICE) --time-budget-s $(MINI_TIME) --out $(MINI_OUT)

# The second embedded model (models/mini_olmoe): OLMoE, 32 experts top-8, balance 0.05, on the CPU
# with one thread as shipped (1446 steps in 2100 s beside other work; then copy the run to models/).
MINI_OLMOE_TIME ?= 2100
MINI_OLMOE_OUT ?= outputs/mini_olmoe
mini-olmoe: $(STAMP)  ## train the OLMoE-shaped embedded model on the CPU (MINI_OLMOE_TIME=s MINI_OLMOE_OUT=dir)
	OMP_NUM_THREADS=1 $(PY) -m experiments.mini.train --device cpu --family olmoe --num-experts 32 --top-k 8 \
		--expert-width 48 --hidden-size 128 --layers 4 --heads 4 --aux-coef 0.05 --experts-impl eager \
		--batch-size 128 --warmup-steps 100 --n-train 40000 --time-budget-s $(MINI_OLMOE_TIME) \
		--eval-every-s 300 --save-every-s 600 --log-every 25 --out $(MINI_OLMOE_OUT)

# A held-out check model (issue 20): mini's shape with 128 experts, top-8, on a CUDA machine in 120 s.
# The one the results use is committed (models/mini128, conf/model/mini128.yaml): a time-budgeted
# training does not repeat itself. This target trains a new one into outputs/mini128 (run it with
# model.path=outputs/mini128). MINI128_DEVICE=cpu trains
# on one CPU thread (grouped_mm, about 9 s per step of 128 examples on a 2-core machine: far too slow to
# reach the GPU model's loss in MINI128_TIME; docs/preregistration.md has the measurement).
MINI128_DEVICE ?= cuda
MINI128_TIME ?= 120
MINI128_CPU := $(if $(filter cpu,$(MINI128_DEVICE)),OMP_NUM_THREADS=1)
MINI128_ARGS := $(if $(filter cpu,$(MINI128_DEVICE)),--experts-impl grouped_mm --batch-size 128 --log-every 5)
mini128: $(STAMP)  ## train the 128-expert held-out check model (MINI128_DEVICE=cuda|cpu MINI128_TIME=s) -> outputs/mini128
	$(MINI128_CPU) $(PY) -m experiments.mini.train --device $(MINI128_DEVICE) --num-experts 128 --top-k 8 --expert-width 24 \
		--time-budget-s $(MINI128_TIME) $(MINI128_ARGS) --eval-every-s 1000 --save-every-s 1000 --max-shard-size 12MB \
		--save-tokenizer 1 --out outputs/mini128

routing: $(STAMP)  ## routing statistics of both embedded models (first-choice share, entropy, union vs batch) -> results/routing/
	OMP_NUM_THREADS=1 $(OFFLINE) $(PY) -m experiments.routing_stats --model models/mini models/mini_olmoe --out results/routing

specialisation: $(STAMP)  ## JS divergence between domains' routing; mixed vs single-domain union
	$(OFFLINE) $(PY) -m experiments.specialisation --model mini --out results/specialisation

# Batching seeds (eval.seed: which requests share a decode batch), e.g. SEEDS=0,1,2: every point
# runs once per seed and the tables carry 95 % intervals over seeds. Empty: the run seed only.
# One thread per process, deliberately: on 2 shared cores torch's default oversubscribes them.
SEEDS ?=
SEED_ARG := $(if $(SEEDS),eval.seed=$(SEEDS))
RUNENV := OMP_NUM_THREADS=1 $(OFFLINE)
quality: $(STAMP)  ## quality curves on the mini model (SEEDS=0,1,2 for intervals over batchings) -> results/quality_mini.*
	$(RUNENV) $(PY) run.py -m experiment=quality_mini $(SEED_ARG)
	$(RUNENV) $(PY) run.py -m experiment=quality_mini method=dense budget=null $(SEED_ARG)
	$(RUNENV) $(PY) run.py -m experiment=quality_mini method=oea method.k0=1,2,3 budget=null $(SEED_ARG)
	$(RUNENV) $(PY) run.py -m experiment=quality_mini method=base method.reassign=drop $(SEED_ARG)
	$(RUNENV) $(PY) run.py exp_name=quality_mini stage=fit logger=none
	cp "outputs/quality_mini/stage=fit/predictor.csv" results/quality_mini_predictor_r2.csv
	$(PY) -m analysis.engines stamp results/quality_mini_predictor_r2.csv  # its engine column: none (fit)
	$(PY) -m analysis.quality outputs/quality_mini results/quality_mini

ABLATION_SEEDS ?= 0
# ABLATION_EXP=ablation_mini_olmoe: the same ablation on the second embedded model (its own budgets).
ABLATION_EXP ?= ablation_mini
ablation: $(STAMP)  ## selection-rule ablation on mini (ABLATION_EXP=ablation_mini_olmoe: the other model) -> results/ablation_mini*.*
	$(RUNENV) $(PY) run.py -m experiment=$(ABLATION_EXP) method=dense budget=null eval.seed=$(ABLATION_SEEDS)
	$(RUNENV) $(PY) run.py -m experiment=$(ABLATION_EXP) eval.seed=$(ABLATION_SEEDS)
	$(PY) -m analysis.ablation outputs/$(ABLATION_EXP) results/$(ABLATION_EXP)
	$(PY) -m analysis.records write outputs/$(ABLATION_EXP) results/records/$(ABLATION_EXP)
	$(PY) -m analysis.cross_grid

# Every selector at every budget with the fidelity metrics on the quality pool (1,050 prompts per run):
# QS_EXP=quality_seeds_mini_olmoe for the second embedded model, *_continuous for continuous batching.
# On a many-core host, python -m experiments.run_points --jobs N runs the same points in parallel.
QS_EXP ?= quality_seeds_mini
QS_EXTRA ?=  # more overrides (the archived continuous grids, results/archive/, were made with scheduler.overlap=false)
quality-seeds: $(STAMP)  ## all selectors x budgets on the quality pool, paired tests (QS_EXP=quality_seeds_mini_olmoe; QS_EXTRA: more overrides) -> results/$(QS_EXP).*
	$(RUNENV) $(PY) run.py -m experiment=$(QS_EXP) method=dense budget=null $(QS_EXTRA)
	$(RUNENV) $(PY) run.py -m experiment=$(QS_EXP) method=oea method.k0=1,2 budget=null $(QS_EXTRA)
	$(RUNENV) $(PY) run.py -m experiment=$(QS_EXP) $(QS_EXTRA)
	$(PY) -m analysis.ablation outputs/$(QS_EXP) results/$(QS_EXP)
	$(PY) -m analysis.records write outputs/$(QS_EXP) results/records/$(QS_EXP)
	$(PY) -m analysis.cross_grid

# Union-aware admission against FIFO under continuous batching (ADM_EXP=admission_mini_olmoe: the other model).
ADM_EXP ?= admission_mini
ADM_EXTRA ?=  # more overrides (the archived admission grids, results/archive/, were made with scheduler.overlap=false)
admission: $(STAMP)  ## union-aware admission vs FIFO, continuous batching, 3 seeds (ADM_EXP=admission_mini_olmoe; ADM_EXTRA: more overrides) -> results/$(ADM_EXP).*
	$(RUNENV) $(PY) run.py -m experiment=$(ADM_EXP) $(ADM_EXTRA)
	$(RUNENV) $(PY) run.py -m experiment=$(ADM_EXP) method=dense budget=null $(ADM_EXTRA)
	$(PY) -m analysis.admission outputs/$(ADM_EXP) results/$(ADM_EXP)
	$(PY) -m analysis.records write outputs/$(ADM_EXP) results/records/$(ADM_EXP)
	$(PY) -m analysis.cross_grid

# RULES_EXP=rules_mini_olmoe: the same comparison on the second embedded model.
RULES_EXP ?= rules_mini
RULES_EXTRA ?=  # more overrides (the archived continuous rules grids, results/archive/, used scheduler.overlap=false)
rules: $(STAMP)  ## issue 10's rules (anchored, peers, re-routing, per-layer and adaptive budgets) vs base (RULES_EXTRA: more overrides) -> results/$(RULES_EXP).*
	$(RUNENV) $(PY) run.py -m experiment=$(RULES_EXP) $(RULES_EXTRA)
	$(RUNENV) $(PY) run.py -m experiment=$(RULES_EXP) method=base method.reassign=similar,drop $(RULES_EXTRA)
	$(RUNENV) $(PY) run.py -m experiment=$(RULES_EXP) method=base method.budget_split=sensitivity $(RULES_EXTRA)
	$(RUNENV) $(PY) run.py -m experiment=$(RULES_EXP) method=base method.coverage=0.9,0.95 budget=null $(RULES_EXTRA)
	$(PY) -m analysis.ablation outputs/$(RULES_EXP) results/$(RULES_EXP)
	$(PY) -m analysis.records write outputs/$(RULES_EXP) results/records/$(RULES_EXP)
	$(PY) -m analysis.cross_grid

# Issue 27's pre-registered replication grid (docs/preregistration.md): both embedded models on the
# replication pool, continuous batching, one one-thread process at a time (REPL_JOBS=N on a many-core
# host); then the per-prompt records (results/records/) and the pre-registered calls.
# `make replication-mini128`: the same on the committed 128-expert model, its own family of calls.
REPL_EXP ?= replication_mini replication_mini_olmoe
REPL_JOBS ?= 1
REPL_OUT ?= results/replication
replication: $(STAMP)  ## the pre-registered replication grid and its calls (REPL_EXP=..., REPL_JOBS=N, REPL_OUT=...) -> results/replication*
	$(RUNENV) $(PY) -m experiments.run_points --jobs $(REPL_JOBS) $(REPL_EXP) \
		--extra "method=base_anchor method.k0=2" --extra "method=dense budget=null"
	for e in $(REPL_EXP); do $(PY) -m analysis.records write outputs/$$e results/records/$$e || exit 1; done
	$(PY) -m analysis.replication $(addprefix outputs/,$(REPL_EXP)) --out $(REPL_OUT)
	$(PY) -m analysis.cross_grid  # the cross-grid columns of every comparison table, the replication's included

replication-mini128:  ## the replication on the held-out 128-expert model (models/mini128; REPL_JOBS=N) -> results/replication_mini128*
	$(RUNENV) $(PY) run.py experiment=replication_mini128 exp_name=replication_mini128_fit stage=fit logger=none
	cp "outputs/replication_mini128_fit/stage=fit/predictor.csv" results/replication_mini128_predictor_r2.csv
	$(MAKE) replication REPL_EXP=replication_mini128 REPL_OUT=results/replication_mini128

# Figures and report.md from results/ (the committed grids) and outputs/ (your runs, their own
# section "Your runs"); no model runs. `make report`: a one-page summary (at most 8 figures);
# `make report-all`: every figure of every grid with its table.
# REFRESH=1: every figure from results/ alone into results/figures/ (the committed figures the READMEs show).
# LOG=wandb: also one wandb summary run with the figures (offline unless WANDB_MODE=online).
# EXP=name: only that sweep's quality figures.
REPORT_ARGS := $(if $(REFRESH),--results-only --all --out results/figures,--out outputs/report) \
	$(if $(LOG),--log $(LOG)) $(if $(EXP),--exp $(EXP))
# Analysis reads files only: an existing .venv is enough (no reinstall when pyproject.toml changed).
report: | $(PY)  ## one-page summary, <= 8 figures + report.md -> outputs/report/ (REFRESH=1: every committed figure -> results/figures/; LOG=wandb; EXP=sweep)
	OMP_NUM_THREADS=1 WANDB_SILENT=true $(PY) -m analysis.report $(REPORT_ARGS)

report-all: | $(PY)  ## every figure of every grid with its table -> outputs/report/ (same options as report)
	OMP_NUM_THREADS=1 WANDB_SILENT=true $(PY) -m analysis.report --all $(REPORT_ARGS)

bench-kernels:  ## on a CUDA machine: GPU tests, copy bandwidth, tuning, kernel timings -> benchmarks/kernels/
	python -m tools.bench_kernels --out benchmarks/kernels
	python -m analysis.kernel_table benchmarks/kernels/$$(python -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))").json

clean:  ## remove outputs (keeps the venv)
	rm -rf outputs/*/ wandb
