"""Context parallelism plans: one training step of a decoder-only transformer with its sequence sharded over
mesh dimension ``cp`` and attention run as ring attention (sim/parallel/cp/ring.py), laid out as torchtitan does
(torchtitan/models/llama3/infra/parallelize.py and torchtitan/distributed/parallel_dims.py): the parameters are
not split by cp; FSDP2 ``fully_shard`` shards them over the flattened ``dp_shard_cp`` mesh (every rank of
dp_shard x cp), so CP adds ring attention inside each block and FSDP2 does the rest (sim/parallel/fsdp/plan.py).
``cp_plan`` is sim/parallel/parallelize.py with CP (and TP + SP when tp > 1) then FSDP2; what one cp rank runs
(its share of the sequence and the work, the block cut around the ring) is sim/parallel/cp/local.py.
"""
from __future__ import annotations

from distlab.sim.errors import ConfigError
from distlab.sim.parallel.cp.local import CPOptions, check_cp, cp_local_model  # noqa: F401 (re-exported)
from distlab.sim.parallel.fsdp.plan import FSDPOptions
from distlab.sim.mesh import Mesh
from distlab.sim.plan import Collective, Plan, Send
from distlab.sim.parallel.tp.plan import TPOptions

DIMS = ("dp_replicate", "dp_shard", "cp", "tp")


def cp_plan(model, mesh: Mesh, opts: CPOptions | None = None, fsdp: FSDPOptions | None = None,
            name: str | None = None, where: str = "cp", cluster=None, only: list[int] | None = None) -> Plan:
    """One step on ``mesh`` (dims in torchtitan's order dp_replicate, dp_shard, cp, tp; cp required): FSDP2
    over dp_shard x cp (HSDP with dp_replicate), ring attention over cp, TP (+ SP) inside each cp rank when the
    mesh has tp > 1 (sim/parallel/parallelize.py: TP, CP, then FSDP2). With ``cluster``, where the layout allows
    (sim/kernel/relabel.py fsdp_shifts), one rank per class is built and the others are its renamings; ``only``:
    just these ranks (not validated)."""
    from distlab.sim.parallel.parallelize import Parallelisms, parallelize
    opts = opts or CPOptions()
    names = tuple(mesh.names)
    if "cp" not in names or any(d not in DIMS for d in names) or list(names) != [d for d in DIMS if d in names]:
        raise ConfigError(f"the cp section needs mesh dimension cp, with dp_replicate, dp_shard and tp optional, in "
                          f"that order; this mesh has {', '.join(names)}; allowed: {', '.join(DIMS)}", f"{where}: mesh")
    tp = mesh.size("tp") if "tp" in mesh else 1
    par = Parallelisms(cp=opts, fsdp=fsdp or FSDPOptions(overlap=opts.overlap),
                       tp=TPOptions(sequence_parallel=True) if tp > 1 else None)
    plan = parallelize(model, mesh, par, cluster, only, where=where)
    if name:
        plan.name = name
    return plan


def collective_sequence(plan: Plan, mesh: Mesh, rank: int = 0) -> list[tuple]:
    """(kind, bytes, dtype, group, per-peer bytes) of each collective of ``rank`` in issue order, bytes as
    nccl-tests count them (all_gather: the output; all_to_all: all one rank sends). A cp permute (a Send and a
    Recv of one name) is one all_to_all over the cp group whose per-peer bytes (torch's input_split_sizes) are
    B for the next rank and 0 for the others; per-peer bytes are None for the other kinds."""
    out = []
    group = mesh.group_of(rank, "cp")
    for o in plan.ranks[rank]:
        if isinstance(o, Collective):
            out.append((o.op, o.bytes, o.dtype, plan.group_of(o), None))
        elif isinstance(o, Send):
            per = tuple(o.bytes if g == o.peer else 0 for g in group)
            out.append(("all_to_all", o.bytes, o.dtype, group, per))
    return out
