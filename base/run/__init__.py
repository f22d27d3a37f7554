"""Orchestration: from a validated RunConfig to a finished run folder under outputs/.

pipeline.py (the stages: calibrate, fit, evaluate, throughput, describe), preflight.py (every
input checked before anything is written), artifacts.py (calibration and predictors cached and
shared across a sweep), outputs.py (the run's files and tables), run_folder.py (where a run
folder may go, whose it is, and how a result replaces the old one whole), sweep.py, gpu_pool.py,
logger.py and report.py. Only run.py and the experiment entry points read Hydra; this package
receives typed objects.
"""
