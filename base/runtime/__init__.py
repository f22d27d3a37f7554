"""The runtime: decoding a budgeted model fast and measuring it.

engine.py (prefill, then decode steps replayed from one CUDA graph per batch size, over a static
KV cache; eager on a CPU, same code), sampling.py, regional.py (each decoder layer's attention and
norms compiled once), throughput.py (the timed grid), profile.py (where a step's time goes) and
memory.py (what a model and its cache need). Continuous batching: continuous.py (slots, packed
prefill, mixed steps, one CUDA graph per step shape via graphs.py), packing.py (a packed forward's
token stream), scheduler.py (who decodes when), stream.py and serving.py (request-stream benchmarks).
"""
