"""Executing a plan for real: each rank's ops as torch.distributed calls and local work, timed on one clock.

- executor.py runs one rank's ops of a plan (``plan_task``) and times each: streams are threads on CPU;
  cuda_exec.py is its GPU path (CUDA streams and events); issue_order.py keeps Gloo's per-group issue order
  across those threads.
- collectives.py turns a plan's Collective into a torch.distributed call on buffers of the planned bytes;
  compute.py turns a Compute op into real matmuls (planned FLOPs, or seconds).
- clock.py puts every rank on rank 0's timeline (NTP-style offsets between nodes); wire.py moves values
  between ranks as JSON in tensors, never pickles.
- run_summary.py is what `distlab run` reports about a measured trace.
"""
