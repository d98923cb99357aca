"""FSDP2 x TP on one 2-D mesh (dp_shard, tp), in torchtitan's order: ``parallelize_module`` on the tp
sub-mesh first, then ``fully_shard`` on every block and on the root over dp_shard. FSDP2 then shards each
parameter's TP-local shard (dim 0, padded to a multiple of dp_shard), so its all-gathers and reduce-scatters
carry the TP-local units; the TP collectives run inside each layer as in the 1-D plan.

The program is FSDP2's (sim/parallel/fsdp/plan.py, on the model with TP-local shapes) with each layer's compute replaced
by that layer's TP segment (sim/parallel/tp/plan.py ``Segments``). Sequence-parallel norms: FSDP2's post-backward
all-reduces each Partial(sum) gradient over tp once, just before the unit's reduce-scatter (so the optimizer
reads Replicate gradients and issues nothing). As seen with torch 2.13 on gloo (tests/test_tp_runtime.py).

HSDP x TP (3-D mesh dp_replicate, dp_shard, tp): ``fully_shard`` on the 2-D (dp_replicate, dp_shard) sub-mesh;
after each unit's reduce-scatter FSDP2 all-reduces the shard over dp_replicate (sim/parallel/fsdp/plan.py). torch issues
that all-reduce whenever the dp mesh is 2-D, even over a replicate group of one rank
(torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py ``foreach_reduce``: ``if all_reduce_group is not
None``), so with dp_replicate 1 the plan has it too (a 1-rank group: no time).
"""
from __future__ import annotations

from dataclasses import replace

from distlab.sim.errors import ConfigError
from distlab.sim.parallel.fsdp.plan import FSDPOptions, fsdp_plan, units_of
from distlab.sim.models import Layer, Model, Param
from distlab.sim.plan import Collective, Compute, Plan
from distlab.sim.parallel.tp.plan import ADAMW_DTENSOR_OPS, PHASES, Segments, TPOptions, _Program
from distlab.sim.parallel.tp.rules import check_divides, local_shape, partial_grad_params


def tp_local_model(model, tp: int, opts: TPOptions | None = None) -> Model:
    """``model`` with every parameter at its TP-local shape and compute divided by tp (what FSDP2 shards), and
    the activations one rank keeps (sim/models/activations.py) under ``opts``' sequence and loss parallelism
    and recompute (without ``opts``: plain TP, the model's own recompute)."""
    from distlab.sim.models.activations import local_layers
    layers = [Layer(L.name, [Param(q.name, local_shape(q, tp), q.dtype) for q in L.params],
                    fwd_flops=L.fwd_flops / tp, bwd_flops=L.bwd_flops / tp, ready=L.ready) for L in model.layers]
    if (model.config or {}).get("kind") in ("gpt", "moe"):
        layers = local_layers(model, layers, tp=tp, sequence_parallel=bool(opts and opts.sequence_parallel),
                              loss_parallel=bool(opts and opts.loss_parallel),
                              recompute=opts.recompute if opts else None)
    return Model(model.name, layers, dict(model.config))


def fsdp_tp_plan(model, mesh, fsdp_opts: FSDPOptions | None = None, tp_opts: TPOptions | None = None,
                 name: str | None = None, where: str = "tp", cluster=None, only: list[int] | None = None) -> Plan:
    """The plan of one step on ``mesh`` with dimensions dp_shard (FSDP2, ZeRO-3) and tp. With ``cluster``, where
    the layout allows (sim/kernel/relabel.py fsdp_shifts), only one rank per class is built and the others are its
    renamings; ``only``: just these ranks (a plan of them, not validated)."""
    fsdp_opts, tp_opts = fsdp_opts or FSDPOptions(), tp_opts or TPOptions()
    for dim in ("dp_shard", "tp"):
        if dim not in mesh:
            raise ConfigError(f"FSDP2 x TP needs mesh dimensions dp_shard and tp; this mesh has "
                              f"{', '.join(mesh.names)}", f"{where}: mesh")
    if fsdp_opts.zero != 3:
        raise ConfigError(f"FSDP2 x TP is built for ZeRO-3 (fully_shard) only; got zero {fsdp_opts.zero}",
                          f"{where}: zero")
    tp = mesh.size("tp")
    check_divides(model, tp, "mesh.tp", tp_opts.sequence_parallel)
    if cluster is not None and only is None:
        from distlab.sim.kernel.relabel import fsdp_shifts, relabelled
        shifts = fsdp_shifts(mesh, cluster, fsdp_opts.reshard_after_forward)
        if shifts is not None:
            return relabelled(lambda reps: fsdp_tp_plan(model, mesh, fsdp_opts, tp_opts, name, where, only=reps),
                              shifts)
    local = tp_local_model(model, tp, tp_opts)
    base = fsdp_plan(local, mesh, fsdp_opts, where=where, only=only)
    partial = {q.name for q in partial_grad_params(model, tp_opts.sequence_parallel)}
    units = {u.name: [q.name for q in u.params if q.name in partial] for u in units_of(local)}
    replicate_of_one = "dp_replicate" in mesh and mesh.size("dp_replicate") == 1
    ranks = []
    for r, ops in zip(range(mesh.world_size) if only is None else only, base.ranks):
        p = _Program(mesh.group_of(r, "tp"), model.config["dtype"])
        seg = Segments(model, tp_opts, p)
        for op in ops:
            kind, _, rest = getattr(op, "name", "").partition(" ")
            if isinstance(op, Compute) and kind == "fwd":
                seg.forward(rest)
            elif isinstance(op, Compute) and kind == "bwd":
                seg.backward(rest)
            elif isinstance(op, Compute) and op.name == "optimizer":   # AdamW on DTensor shards: every one
                p.ops.append(replace(op, launches=ADAMW_DTENSOR_OPS * len(model.params)))     # a DTensor
            else:
                if isinstance(op, Compute) and op.name.startswith("copy-in grads "):
                    seg.partial_grads(units[op.name.removeprefix("copy-in grads ")], 1, "backward")
                p.ops.append(op)
                if replicate_of_one and isinstance(op, Collective) and op.op == "reduce_scatter":
                    unit = op.name.removeprefix("reduce_scatter ")
                    p.ops.append(Collective("all_reduce", op.bytes // len(op.group), op.dtype, (r,),
                                            name=f"all_reduce {unit} backward", stream=op.stream))
        ranks.append(p.ops)
    meta = {**base.meta, "builder": "fsdp_tp", "tp": tp, "sequence_parallel": tp_opts.sequence_parallel}
    plan = Plan(ranks, name=name or f"fsdp{mesh.size('dp_shard')}-tp{tp}-{model.name}", meta=meta)
    return plan.validate() if only is None else plan


def collective_sequence(plan: Plan, rank: int = 0) -> list[tuple]:
    """(kind, bytes, dtype, group, phase) in issue order; FSDP2's all-gathers carry their phase in the name,
    its reduce-scatters run in backward."""
    out = []
    for o in plan.ranks[rank]:
        if isinstance(o, Collective):
            last = o.name.rsplit(" ", 1)[-1]
            phase = PHASES.get(last, "forward" if last == "forward" else "backward")
            out.append((o.op, o.bytes, o.dtype, plan.group_of(o), phase))
    return out
