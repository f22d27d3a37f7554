"""The transformers adapter: everything that knows how a Hugging Face MoE model is built.

families.py (what differs between the six families), loading.py (checkpoints and random weights),
moe_block.py (BudgetedMoE, the owned block that routes, selects and runs the experts),
budget.py (installing the blocks and handing them each forward's inputs), attention.py (the
engine's static KV cache as a transformers attention function), fused_qkv.py, experts_impl.py
(base_triton as a transformers experts implementation), skew.py, placement.py (over GPUs) and
calibrate.py (running the dense model over calibration text).
"""
