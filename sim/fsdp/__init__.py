"""FSDP2 / ZeRO: plans (plan.py), per-GPU memory and its curve over a simulated step (memory.py), and the
scenario entry for `distlab simulate` (scenario.py). The real counterpart is runtime/fsdp.py."""
