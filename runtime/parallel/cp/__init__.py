"""Context parallelism on real ranks: torch 2.13 ring attention on gloo (run.py)."""
