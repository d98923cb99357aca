"""Pipeline parallelism for real: run.py runs sim.pipeline's schedules with torch.distributed.pipelining and times
every action, validate.py calibrates, predicts and compares action by action (`distlab validate --scenario`). The
simulated counterpart is sim/parallel/pipeline/; registered in runtime/parallel/registry.py."""
