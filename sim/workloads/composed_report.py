"""What `distlab simulate` reports of a composed scenario (sim/workloads/composed.py): the collectives per mesh
dimension and phase on rank 0, the pipeline's bubble, and the memory of the fullest rank.

Memory per GPU (the rank with the most bytes among the pipeline ranks): its stages' parameters as TP leaves them
(sim/parallel/tp/rules.py local shapes), sharded over FSDP2's group (dp_shard x cp) as the ZeRO stage says
(sim/parallel/fsdp/memory.py: ZeRO-3 all three sharded, ZeRO-2 gradients and optimizer, ZeRO-1 the optimizer;
DDP none), mixed-precision AdamW's bytes per element (``precision``: with FSDP2's ZeRO-3 its fp32 shards
4 + 4 + 8, as the fsdp workload's report; else ZeRO's 2 + 2 + 12 for 16-bit params); activations of one block as the model's
family keeps them (sim/models/activations.py: tp, sequence parallelism, cp, recompute; the same function as
`distlab memory` and every workload): without a pipeline its peak (the same bytes as `distlab memory`), with one
a block's bytes times the most blocks the rank holds at once walking its schedule (sim/workloads/tp.py
``peak_blocks``: each F adds its stage's blocks, each B frees them).
FSDP2's transient unsharded units are not counted.
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
    """Bytes per GPU of the fullest pipeline rank (module docstring)."""
    return memory_of(result.model, result.mesh, result.options)


def memory_of(model, mesh, par) -> dict:
    """Bytes per GPU of the fullest pipeline rank of ``model`` on ``mesh`` with ``par`` (a Parallelisms), without
    building the plan: {"pipeline_rank": its pp index, "breakdown_bytes": {params, grads, optimizer,
    activations}} (module docstring)."""
    from distlab.sim.parallel.fsdp.memory import precision
    from distlab.sim.parallel.fsdp.units import padded_numel
    from distlab.sim.models.activations import activations, effective_recompute
    from distlab.sim.parallel.tp.rules import local_shape
    c = model.config
    size = {d: mesh.size(d) if d in mesh else 1 for d in ("pp", "dp_shard", "cp", "tp")}
    tp, cp = size["tp"], size["cp"]
    S = size["dp_shard"] * cp if par.fsdp is not None else 1
    zero = par.fsdp.zero if par.fsdp is not None else 0
    p, g, k = precision(c["dtype"], fsdp2=zero == 3)      # FSDP2's fp32 shards, as every FSDP2 report
    sp = par.tp is not None and par.tp.sequence_parallel
    own = par.tp.recompute if par.tp is not None else "none"
    if par.cp is not None and own == "none":      # CP x TP: the cp section's recompute (sim/parallel/layers.py)
        own = par.cp.recompute
    transformer = c.get("kind") in ("gpt", "moe")
    if transformer:          # the model family's activations (sim/models/activations.py), as every command counts
        whole = activations(model, effective_recompute(model, own), None, tp, sp, cp,
                            par.tp is not None and par.tp.loss_parallel)
        per_block = whole.per_block()
    else:                    # an MLP: each layer's activation is one "block"
        per_block = max(L.activation_bytes for L in model.layers)
    numel = [sum(padded_numel(local_shape(q, tp), S) for q in L.params) for L in model.layers]
    if par.pipeline is None:
        blocks = sum(1 for L in model.layers if L.name.startswith("h.")) if transformer else len(model.layers)
        stages_of_rank, ranges, peaks = [[0]], [range(len(model.layers))], {0: blocks}
    else:
        from distlab.sim.parallel.pipeline import schedules as Sch
        from distlab.sim.parallel.pipeline.plan import stage_ranges
        from distlab.sim.parallel.pipeline.stages import pipeline_spec
        from distlab.sim.workloads.tp import peak_blocks
        spec = pipeline_spec(par.pipeline, model, mesh)
        pp, v = size["pp"], spec.virtual_stages
        ranges = stage_ranges(model, pp * v, spec.split)
        blocks = tuple(sum(1 for i in r if model.layers[i].name.startswith("h.") or not transformer) for r in ranges)
        peaks = peak_blocks(Sch.build(spec.schedule, pp, spec.microbatches, v), blocks, range(pp))
        placement = Sch.stage_to_rank(spec.schedule, pp, v)
        stages_of_rank = [[s for s, r in enumerate(placement) if r == q] for q in range(pp)]
    best = None
    for q, peak in peaks.items():
        full = sum(numel[i] for s in stages_of_rank[q] for i in ranges[s])
        shard = full // S
        # one stage: the whole model's peak (embedding, head and loss, a recomputed block's forward), as
        # `distlab memory` and the DDP/FSDP/TP/CP reports count it; a pipeline rank: its blocks at once
        acts = whole.peak_bytes if transformer and par.pipeline is None else per_block * peak
        parts = {"params": (shard if zero == 3 else full) * p, "grads": (shard if zero >= 2 else full) * g,
                 "optimizer": (shard if zero >= 1 else full) * k, "activations": acts}
        if best is None or sum(parts.values()) > sum(best[1].values()):
            best = (q, parts)
    return {"pipeline_rank": best[0], "breakdown_bytes": best[1]}


def report(result) -> dict:
    from distlab.sim.parallel.fsdp.memory import breakdown_line, fit_text, fits
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
    mem = memory(result)
    parts = mem["breakdown_bytes"]
    total, gpu = sum(parts.values()), result.cluster.gpu.memory_GiB
    ok = fits(total, gpu)
    rows += [[f"memory per GPU: {k}", f"{v / 2**30:.3f} GiB"] for k, v in parts.items()]
    where = f"total; pipeline rank {mem['pipeline_rank']}" if par.pipeline is not None else "total"
    rows += [[f"memory per GPU ({where})", f"{total / 2**30:.3f} GiB"],
             ["fits the GPU", fit_text(total, gpu)]]
    return {"rows": rows, "tables": [table], "warnings": [] if ok else ["does not fit: " + breakdown_line(parts, total, gpu)],
            "json": {"parallelisms": par.names(),
                     "collectives": [{"mesh_dim": d, "op": op, "phase": ph, "count": n, "bytes": b}
                                     for (d, op, ph), (n, b) in counts.items()],
                     "memory": {**mem, "total_bytes": total, "fits": ok, "gpu_memory_GiB": gpu}}}


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
