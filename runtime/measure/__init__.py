"""Measuring this machine and judging a measurement: the numbers the simulator is calibrated on, and whether
they can be trusted.

- sweep.py times collectives over sizes nccl-tests style inside the ranks; compute_probe.py times GEMMs,
  copies and the interference of a collective in flight; calibration.py launches both and writes a cluster.
- fit.py fits the ring model (α, B) to the times; robust.py holds the robust estimators every fit uses
  (median of medians, bisquare IRLS).
- load.py reads the machine's load (other processes' CPU, cores); trust.py judges whether a measurement taken
  under that load, with that spread, is trustworthy.
- validation.py predicts held-out cases on the calibrated cluster and compares them with real runs;
  validate_output.py prints that comparison.
- selfcheck.py sends known inputs through every collective; mesh_probe.py returns torch's DeviceMesh groups for
  comparison with sim/mesh.py; gpu_check.py times on a GPU what its preset's compute model predicts.
"""
