"""What `distlab simulate` reports of a composed scenario (sim/workloads/composed.py): the collectives per mesh
dimension and phase on rank 0, the pipeline's bubble, and the memory of the fullest rank.

Memory per GPU: sim/parallel/memory.py ``memory_per_gpu``, the one model of every command
(sim/parallel/memory.py ``memory_section``).
"""
from __future__ import annotations

from distlab.sim.plan import Collective, Recv, Send

PHASE_WORDS = {"fwd": "forward", "forward": "forward", "bwd": "backward", "backward": "backward",
               "optimizer": "optimizer", "update": "optimizer"}


def dim_of(mesh, group: tuple, rank: int = 0) -> str:
    """The mesh dimension (or flattened dimensions) whose group of ``rank`` is ``group``."""
    for d in mesh.names:
        if mesh.group_of(rank, d) == group:
            return d
    if "dp_shard" in mesh and "cp" in mesh and mesh.group_of(rank, ("dp_shard", "cp")) == group:
        return "dp_shard x cp"
    return "dp_replicate" if len(group) == 1 else "?"


def sequence_by_dim(plan, mesh, rank: int) -> dict:
    """Rank ``rank``'s collectives and point-to-point ops in issue order, per mesh dimension (:func:`dim_of`; sends
    and receives: pp, or cp for the ring's): collectives as (kind, bytes, dtype, group, phase), p2p as (send or
    recv, bytes, peer): what a real run's capture (runtime/parallel/tp/capture.py CollectiveCapture) is compared with."""
    out: dict = {}
    dims: dict = {}
    for o in plan.ranks[rank]:
        if isinstance(o, Collective):
            g = plan.group_of(o)
            if g not in dims:
                dims[g] = dim_of(mesh, g, rank)
            last = o.name.rsplit(" ", 1)[-1]
            phase = PHASE_WORDS.get(last, "backward" if o.op == "reduce_scatter" or "grad" in o.name else "forward")
            out.setdefault(dims[g], []).append((o.op, o.bytes, o.dtype, g, phase))
        elif isinstance(o, (Send, Recv)):
            out.setdefault("cp" if o.name.startswith("cp ") else "pp", []).append(
                ("send" if isinstance(o, Send) else "recv", o.bytes, o.peer))
    return out


def collectives(result) -> dict:
    """(mesh dim, op, phase) -> (count, bytes) on rank 0, p2p included (pp: the stage boundaries; cp: the ring's
    permutes)."""
    plan, mesh = result.plan, result.mesh
    out: dict = {}
    dims: dict = {}
    for o in plan.ranks[0]:
        if isinstance(o, Collective):
            g = plan.group_of(o)
            if g not in dims:
                dims[g] = dim_of(mesh, g)
            dim, op = dims[g], o.op
        elif isinstance(o, (Send, Recv)):
            dim = "cp" if o.name.startswith("cp ") else "pp"
            op = "send" if isinstance(o, Send) else "recv"
        else:
            continue
        last = o.name.rsplit(" ", 1)[-1]
        phase = PHASE_WORDS.get(last, "backward" if op == "reduce_scatter" or "grad" in o.name else "forward")
        n, b = out.get((dim, op, phase), (0, 0))
        out[dim, op, phase] = (n + 1, b + o.bytes)
    return out


def memory(result) -> dict:
    """Bytes per GPU of the fullest pipeline rank (sim/parallel/memory.py, the one model of every command)."""
    return memory_of(result.model, result.mesh, result.options)


def memory_of(model, mesh, par) -> dict:
    """{"pipeline_rank", "breakdown_bytes", "host_bytes"} of ``model`` on ``mesh`` with ``par`` (a
    Parallelisms), without building the plan: sim/parallel/memory.py ``memory_per_gpu``."""
    from distlab.sim.parallel.memory import memory_per_gpu
    return memory_per_gpu(model, mesh, par)


def report(result) -> dict:
    counts = collectives(result)
    table = {"title": "collectives per step (rank 0), by mesh dimension",
             "columns": ["mesh dim", "collective", "phase", "count", "MiB"],
             "rows": [[d, op, ph, n, f"{b / 2**20:.3f}"] for (d, op, ph), (n, b) in counts.items()],
             "notes": ["bytes as nccl-tests count them (all_gather: output, reduce_scatter: input); send/recv: "
                       "the pipeline's boundary tensors (pp) and the ring's K/V permutes (cp)"]}
    par = result.options
    rows = [["parallelisms (torchtitan's order)", " -> ".join(par.names())]]
    rows += [[f"{d} ({result.workload.dim_words.get(d, d)})", result.mesh.size(d)] for d in result.mesh.names]
    if par.pipeline is not None:
        rows += _pipeline_rows(result)
    from distlab.sim.parallel.memory import memory_section
    mem = memory_section(result)
    rows += mem["rows"]
    return {"rows": rows, "tables": [table], "warnings": mem["warnings"],
            "json": {"parallelisms": par.names(),
                     "collectives": [{"mesh_dim": d, "op": op, "phase": ph, "count": n, "bytes": b}
                                     for (d, op, ph), (n, b) in counts.items()],
                     "memory": mem["json"]}}


def _pipeline_rows(result) -> list:
    """The schedule and the bubble: 1 - compute-busy / makespan, averaged over rank 0's pipeline group."""
    from distlab.sim.kernel.spans import union_length
    pipe, trace = result.plan.meta["pipeline"], result.trace
    ranks = result.mesh.group_of(0, "pp")
    busy = [union_length([(o.start, o.end) for o in trace.for_rank(r) if o.kind == "compute"]) for r in ranks]
    bubble = 1 - sum(busy) / (len(ranks) * trace.makespan) if trace.makespan else 0.0
    return [["pipeline", f"{pipe['schedule']}, {pipe['microbatches']} micro-batches, blocks per stage "
                         f"{pipe['split'] or 'even'}"],
            ["bubble (idle share of the pipeline ranks x makespan)", f"{bubble:.1%}"]]
