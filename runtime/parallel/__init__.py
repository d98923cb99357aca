"""Each parallelism run for real, one folder per parallelism as in sim/parallel/ (its simulated counterpart).

- ddp/, fsdp/, tp/, cp/, ep/, pipeline/: ``run.py`` runs it on torch.distributed ranks and records what
  happened; ``validate.py`` calibrates, simulates the same step and compares (`distlab validate --scenario`).
- composed/ runs the compositions (pp x FSDP2/HSDP x tp) as torchtitan builds them.
- registry.py lists them (``WORKLOADS``): the only place a workload is named besides its folder.
"""
