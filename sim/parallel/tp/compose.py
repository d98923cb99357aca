"""FSDP2 x TP on one 2-D mesh (dp_shard, tp), in torchtitan's order: ``parallelize_module`` on the tp
sub-mesh first, then ``fully_shard`` on every block and on the root over dp_shard. FSDP2 then shards each
parameter's TP-local shard (dim 0, padded to a multiple of dp_shard), so its all-gathers and reduce-scatters
carry the TP-local units; the TP collectives run inside each layer as in the 1-D plan.

The program is FSDP2's (sim/parallel/fsdp/plan.py, on the model with TP-local shapes) with each layer's compute replaced
by that layer's TP segment (sim/parallel/tp/plan.py ``Segments``): ``fsdp_tp_plan`` is sim/parallel/parallelize.py
with TP then FSDP2 (sim/parallel/fsdp/step.py). Sequence-parallel norms: FSDP2's post-backward
all-reduces each Partial(sum) gradient over tp once, just before the unit's reduce-scatter (so the optimizer
reads Replicate gradients and issues nothing). As seen with torch 2.13 on gloo (tests/test_tp_runtime.py).

HSDP x TP (3-D mesh dp_replicate, dp_shard, tp): ``fully_shard`` on the 2-D (dp_replicate, dp_shard) sub-mesh;
after each unit's reduce-scatter FSDP2 all-reduces the shard over dp_replicate (sim/parallel/fsdp/plan.py). torch issues
that all-reduce whenever the dp mesh is 2-D, even over a replicate group of one rank
(torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py ``foreach_reduce``: ``if all_reduce_group is not
None``), so with dp_replicate 1 the plan has it too (a 1-rank group: no time).
"""
from __future__ import annotations

from distlab.sim.errors import ConfigError
from distlab.sim.parallel.fsdp.plan import FSDPOptions
from distlab.sim.plan import Collective, Plan
from distlab.sim.parallel.tp.plan import PHASES, TPOptions
from distlab.sim.parallel.tp.rules import tp_local_model  # noqa: F401 (re-exported)


def fsdp_tp_plan(model, mesh, fsdp_opts: FSDPOptions | None = None, tp_opts: TPOptions | None = None,
                 name: str | None = None, where: str = "tp", cluster=None, only: list[int] | None = None) -> Plan:
    """The plan of one step on ``mesh`` with dimensions dp_shard (FSDP2, ZeRO-3) and tp: sim/parallel/parallelize.py
    with TP then FSDP2. With ``cluster``, where the layout allows (sim/kernel/relabel.py fsdp_shifts), only one
    rank per class is built and the others are its renamings; ``only``: just these ranks (not validated)."""
    from distlab.sim.parallel.parallelize import Parallelisms, parallelize
    fsdp_opts, tp_opts = fsdp_opts or FSDPOptions(), tp_opts or TPOptions()
    for dim in ("dp_shard", "tp"):
        if dim not in mesh:
            raise ConfigError(f"FSDP2 x TP needs mesh dimensions dp_shard and tp; this mesh has "
                              f"{', '.join(mesh.names)}", f"{where}: mesh")
    if fsdp_opts.zero != 3:
        raise ConfigError(f"FSDP2 x TP is built for ZeRO-3 (fully_shard) only; got zero {fsdp_opts.zero}",
                          f"{where}: zero")
    plan = parallelize(model, mesh, Parallelisms(tp=tp_opts, fsdp=fsdp_opts), cluster, only, where=where)
    if name:
        plan.name = name
    return plan


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
