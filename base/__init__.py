"""base-moe: budget-aware expert selection for batched MoE decoding."""
