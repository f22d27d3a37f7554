"""Orchestration: from a validated RunConfig to a finished run folder under outputs/.

pipeline.py (the stages: calibrate, fit, evaluate, throughput, describe), preflight.py (every
input checked before anything is written), artifacts.py (calibration and predictors cached and
shared across a sweep), outputs.py (the run folder and its tables), sweep.py, gpu_pool.py,
logger.py and report.py. Only run.py and the experiment entry points read Hydra; this package
receives typed objects.
"""
