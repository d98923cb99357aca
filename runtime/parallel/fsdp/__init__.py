"""FSDP2 for real: run.py runs ``fully_shard`` and records every collective it issues, validate.py calibrates,
predicts the step and compares (`distlab validate --scenario`). The simulated counterpart is sim/parallel/fsdp/; registered
in runtime/parallel/registry.py."""
