"""Tensor and sequence parallelism: sharding rules, the per-rank plan, activation memory."""
