"""Workloads (parallelisms) for `distlab simulate`: one record each (base.py), registered in registry.py."""
