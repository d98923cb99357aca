"""FSDP2 / ZeRO: plans (plan.py), per-GPU memory and its curve over a simulated step (memory.py), and the
report and figure for `distlab simulate` (report.py). The real counterpart is runtime/parallel/fsdp.py."""
