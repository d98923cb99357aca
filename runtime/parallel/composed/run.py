"""The real run of a composition (sim/parallel/parallelize.py) as torchtitan builds it: runtime/parallel/tp/run.py's ranks
(FSDP2 x TP, HSDP x TP), which hand pipelines to runtime/parallel/tp/pipeline.py (each stage parallelized on the tp
sub-mesh, ``fully_shard`` on its blocks and on the stage, torch.distributed.pipelining's schedule, AdamW), every
collective and send recorded per rank (runtime/parallel/tp/capture.py CollectiveCapture)."""
from __future__ import annotations


def run(variants: list[dict], world: int, **kwargs) -> list:
    """The real run of composed variants (runtime/parallel/tp/run.py, which hands pipelines to runtime/parallel/tp/pipeline.py)."""
    from distlab.runtime.parallel.tp.run import run as tp_run
    return tp_run(variants, world=world, **kwargs)
