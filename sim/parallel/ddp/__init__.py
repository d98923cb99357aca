"""DDP: gradient buckets as PyTorch's Reducer builds them, and the plan of one training step."""
