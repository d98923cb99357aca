"""PP x TP (checked against torch.distributed.pipelining with parallelize_module'd stages on a real 2 x 2 mesh:
runtime/parallel/tp/pipeline.py, tests/test_tp_runtime.py; TP collectives, p2p order and sizes, stage shards): mesh dimensions
pp (outer; optionally dp outside it) and tp (inner, the fastest-varying, so a TP group stays inside a node).

``pp_tp_plan`` is sim/parallel/parallelize.py with the pipeline then TP (sim/parallel/pipeline/stages.py).
The program is the pipeline's (sim/parallel/pipeline/plan.py on the model with TP-local shapes, so stage placement,
schedule, p2p order and the dp gradient all-reduces of TP-local stage gradients are the pipeline builder's),
with every forward (F) and backward (B) action's compute replaced by the TP segments of the stage's layers for
that micro-batch (sim/parallel/tp/plan.py ``Segments``: the TP collectives inside each layer, on the TP group of the
rank). Boundary tensors between stages: under sequence parallelism each TP rank holds Shard(1) of the
residual stream and sends b·s·h·e / tp; without it the stream is Replicate and each TP rank sends b·s·h·e
(torchtitan's pipeline stages exchange the TP-local tensors). Zero-bubble schedules (I and W actions) are
refused; the optimizer is not modelled (the pipeline plans have none); activation recomputation only in the
backward compute (as in the 1-D plan).
"""
from __future__ import annotations

from distlab.sim.errors import ConfigError
from distlab.sim.parallel.pipeline.plan import PipelineSpec
from distlab.sim.plan import Plan
from distlab.sim.parallel.tp.plan import TPOptions


def pp_tp_plan(model, mesh, spec: PipelineSpec, tp_opts: TPOptions | None = None, name: str | None = None,
               where: str = "tp", cluster=None, only: list[int] | None = None, overhead: float = 0.0) -> Plan:
    """The plan of one step on ``mesh`` (dims [dp,] pp, tp) under pipeline ``spec`` (see the module docstring):
    sim/parallel/parallelize.py with the pipeline, then TP (sim/parallel/pipeline/stages.py). With ``cluster``,
    where its layout allows, only one rank per class is built and the others are renamings of it
    (sim/kernel/relabel.py); ``only``: just these ranks (a plan of them, not validated). ``overhead``: seconds of
    the pipelining runtime's own work after each action (sim/parallel/pipeline/plan.py's "runtime" op: schedule
    bookkeeping, posting the sends and receives; measured by runtime/parallel/tp/pipeline.py ``RuntimeProbe``)."""
    from distlab.sim.parallel.parallelize import Parallelisms, parallelize
    tp_opts = tp_opts or TPOptions()
    for dim in ("pp", "tp"):
        if dim not in mesh:
            raise ConfigError(f"PP x TP needs mesh dimensions pp and tp; this mesh has {', '.join(mesh.names)}",
                              f"{where}: mesh")
    if mesh.names[-1] != "tp":
        raise ConfigError("tp must be the innermost mesh dimension (its group inside a node)", f"{where}: mesh")
    blocks, stages = model.config["layers"], spec.stages * spec.virtual_stages
    if spec.split is None and blocks % stages:
        what = "more than" if stages > blocks else "not a divisor of"
        allowed = ", ".join(str(d) for d in range(1, blocks + 1) if blocks % d == 0)
        raise ConfigError(f"pp {stages} is {what} the model's {blocks} transformer blocks (every stage holds the "
                          f"same number of blocks); allowed pp: {allowed}", "mesh.pp")
    plan = parallelize(model, mesh, Parallelisms(pipeline=spec, tp=tp_opts), cluster, only, overhead, where)
    if name:
        plan.name = name
    return plan
