"""DDP for real: run.py runs torch's DistributedDataParallel and times every bucket, validate.py predicts the same
step on a calibrated cluster and compares (`distlab validate --scenario`), buckets.py reports real DDP's bucket
assignment for tests/test_ddp_buckets.py. The simulated counterpart is sim/parallel/ddp/; registered in runtime/parallel/registry.py."""
