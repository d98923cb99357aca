"""Real expert parallelism on torch.distributed ranks (run.py) and its comparison with the simulator (validate.py)."""
