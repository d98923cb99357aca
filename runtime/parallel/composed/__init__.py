"""Real runs of compositions (sim/parallel/parallelize.py): torchtitan's layout on gloo ranks, checked and timed."""
