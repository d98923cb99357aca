"""PP x TP (checked against torch.distributed.pipelining with parallelize_module'd stages on a real 2 x 2 mesh:
runtime/tp/pipeline.py, tests/test_tp_runtime.py; TP collectives, p2p order and sizes, stage shards): mesh dimensions
pp (outer; optionally dp outside it) and tp (inner, the fastest-varying, so a TP group stays inside a node).

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
from distlab.sim.parallel.pipeline.plan import PipelineSpec, boundary_bytes, pipeline_plan, stage_ranges
from distlab.sim.parallel.pipeline.schedules import Action
from distlab.sim.plan import Compute, Plan
from distlab.sim.parallel.tp.compose import tp_local_model
from distlab.sim.parallel.tp.plan import Segments, TPOptions, _Program
from distlab.sim.parallel.tp.rules import check_divides


def pp_tp_plan(model, mesh, spec: PipelineSpec, tp_opts: TPOptions | None = None, name: str | None = None,
               where: str = "tp", cluster=None, only: list[int] | None = None, overhead: float = 0.0) -> Plan:
    """The plan of one step on ``mesh`` (dims [dp,] pp, tp) under pipeline ``spec`` (see the module docstring).
    With ``cluster``, where its layout allows, only one rank per class is built and the others are renamings
    of it (sim/kernel/relabel.py); ``only``: just these ranks (a plan of them, not validated). ``overhead``: seconds of
    the pipelining runtime's own work after each action (sim/parallel/pipeline/plan.py's "runtime" op: schedule
    bookkeeping, posting the sends and receives; measured by runtime/tp/pipeline.py ``RuntimeProbe``)."""
    tp_opts = tp_opts or TPOptions()
    for dim in ("pp", "tp"):
        if dim not in mesh:
            raise ConfigError(f"PP x TP needs mesh dimensions pp and tp; this mesh has {', '.join(mesh.names)}",
                              f"{where}: mesh")
    if mesh.names[-1] != "tp":
        raise ConfigError("tp must be the innermost mesh dimension (its group inside a node)", f"{where}: mesh")
    tp = mesh.size("tp")
    check_divides(model, tp, "mesh.tp", tp_opts.sequence_parallel)
    blocks, stages = model.config["layers"], spec.stages * spec.virtual_stages
    if spec.split is None and blocks % stages:
        what = "more than" if stages > blocks else "not a divisor of"
        allowed = ", ".join(str(d) for d in range(1, blocks + 1) if blocks % d == 0)
        raise ConfigError(f"pp {stages} is {what} the model's {blocks} transformer blocks (every stage holds the "
                          f"same number of blocks); allowed pp: {allowed}", "mesh.pp")
    local = tp_local_model(model, tp, tp_opts)
    per_rank = boundary_bytes(model, 0) // (tp if tp_opts.sequence_parallel else 1)
    if cluster is not None and only is None:
        from distlab.sim.kernel.relabel import pp_tp_shifts, relabelled
        shifts = pp_tp_shifts(mesh, cluster)
        if shifts is not None:
            return relabelled(lambda reps: pp_tp_plan(model, mesh, spec, tp_opts, name, where, only=reps,
                                                      overhead=overhead), shifts)
    base = pipeline_plan(local, mesh, spec, p2p_bytes=per_rank, only=only, overhead=overhead)
    ranges = stage_ranges(model, spec.stages * spec.virtual_stages, spec.split)
    names = [L.name for L in model.layers]
    ranks = []
    for g, ops in zip(range(mesh.world_size) if only is None else only, base.ranks):
        p = _Program(mesh.group_of(g, "tp"), model.config["dtype"])
        seg = Segments(model, tp_opts, p)
        for op in ops:
            a = Action.parse(op.name) if isinstance(op, Compute) else None
            if a is None:
                p.ops.append(op)
            elif a.kind == "F":
                for i in ranges[a.stage]:
                    seg.forward(names[i])
            elif a.kind == "B":
                for i in reversed(ranges[a.stage]):
                    seg.backward(names[i])
            else:
                raise ConfigError(f"PP x TP runs schedules of forward and full backward actions only; "
                                  f"{spec.schedule!r} splits the backward ({a.kind}); allowed: gpipe, 1f1b, "
                                  "interleaved-1f1b", f"{where}: schedule")
        ranks.append(p.ops)
    meta = {**base.meta, "builder": "pp_tp", "tp": tp, "sequence_parallel": tp_opts.sequence_parallel}
    mode = "tp-sp" if tp_opts.sequence_parallel else "tp"
    plan = Plan(ranks, name=name or f"pp{spec.stages}-{mode}{tp}-{model.name}", meta=meta)
    return plan if only is not None else plan.validate()
