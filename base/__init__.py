"""base-moe: budget-aware expert selection for batched MoE decoding.

Packages by concern, each importing only the ones listed after it (tests/test_layout.py checks):
    run/      orchestration: a validated RunConfig -> a finished run folder (stages, artifacts,
              outputs, sweeps, loggers)
    eval/     lm-eval adapted to the engine: request batching, stop handling, fidelity
    runtime/  the decode engine (static KV cache, CUDA graphs, compiled regions), throughput
              measurement and profiling
    hf/       the transformers adapter: model families and loading, the owned MoE block,
              engine attention, placement over GPUs
    method/   the paper's idea on plain tensors: routing, selectors, budget rules, predictor,
              selection statistics, and the backends that run a selection (PyTorch or kernels/)
Modules beside them are shared by all: config.py (the typed run configuration), registry.py,
checks.py (ConfigError and the value checks), files.py (atomic writes, locks).
"""
