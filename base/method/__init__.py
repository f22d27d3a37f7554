"""The method, on plain tensors: what BASE and its baselines decide for one MoE layer and step.

routing.py (the union, top-M, reassignment; the PyTorch reference the kernels are tested
against), selectors.py (every rule, declared once), policy.py (what a run keeps), backends.py (the
reference or the fused kernels, per layer), recorder.py (statistics on the device), calibration.py,
predictor.py, budget_split.py and similarity.py (what the rules learn from calibration text).
Nothing here knows transformers; it imports only kernels/ and the shared modules.
"""
