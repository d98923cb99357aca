"""A published run with pipeline stages (pp > 1) as a plan, simulated on data-parallel replica 0 only.

    >>> from distlab.sim.reproduce.pipeline import layers_of
    >>> layers_of(1, [2, 2, 2, 2], [0, 1, 0, 1])        # interleaved: rank 1 holds stages 1 and 3
    [2, 3, 6, 7]

The plan is PP x TP x DP (sim/parallel/tp/pipeline.py ``pp_tp_plan`` on the run's scenario mesh {dp, pp, tp} and
tp options, sim/reproduce/plans.py): the schedule with each forward/backward replaced by the TP segments of its
layers, each stage's gradients all-reduced over its dp replicas after its last backward, then AdamW over the
rank's parameters (1/dp of them with ZeRO 1). With ``replicas``: only the ranks of replica 0 (dp 2 in the built
mesh, so that the plan carries the dp all-reduces), each all-reduce replaced by a fixed-duration op of the time
it takes on the whole cluster beside the concurrent all-reduces of the stage's other TP ranks; with tp a multiple
of the node size, one TP rank per stage, its TP collectives timed alone (its group fills whole nodes) and, with
TP communication overlap, its ring exchanges timed as one ring step of the node (``_timed_ring_exchanges``).
"""
from __future__ import annotations

from distlab.sim.plan import Collective, Compute, Plan, Record, Recv, Send, Wait


def pipeline_plan(run, replicas: bool, cache: dict) -> Plan:
    from distlab.sim.mesh import Mesh
    from distlab.sim.parallel.pipeline.plan import PipelineSpec
    from distlab.sim.parallel.tp.compose import tp_local_model
    from distlab.sim.parallel.tp.pipeline import pp_tp_plan
    from distlab.sim.parallel.tp.plan import ADAM_BYTES
    from distlab.sim.reproduce.scenario import parts
    model, full, opts = parts(run)
    L = run.layout
    dp = min(L["dp"], 2) if replicas else L["dp"]
    mesh = Mesh({"dp": dp, "pp": L["pp"], "tp": L["tp"]}, f"run {run.name}")
    spec = PipelineSpec(schedule=opts.schedule, stages=L["pp"], microbatches=opts.microbatches,
                        virtual_stages=opts.virtual_stages, data_parallel=dp, split=opts.split)
    cluster = cache["cluster"]
    one_tp_rank = replicas and L["tp"] > 1 and L["tp"] % cluster.gpus_per_node == 0
    keep = L["pp"] * L["tp"] if replicas else mesh.world_size
    needed = [g for g in range(keep) if not (one_tp_rank and g % L["tp"])]
    if replicas:
        built = pp_tp_plan(model, mesh, spec, opts, run.name, only=list(needed))
        plan = Plan([[] for _ in range(mesh.world_size)], name=run.name, meta=built.meta)
        for g, ops in zip(needed, built.ranks):
            plan.ranks[g] = ops
    else:
        plan = pp_tp_plan(model, mesh, spec, opts, name=run.name, where=f"run {run.name}")
    local = tp_local_model(model, L["tp"])
    per_stage = plan.meta["pipeline"]["layers_per_stage"]
    stage_to_rank = plan.meta["pipeline"]["stage_to_rank"]
    share = L["dp"] if L["zero"] == 1 else 1
    ranks = []
    for g in range(keep):
        ops = plan.ranks[g]
        if g not in needed:
            ranks.append([])                          # TP rank 0 of the stage stands for the others
            continue
        if replicas and dp > 1:
            ops = [_timed_allreduce(op, g, run, cache) for op in ops]
        if one_tp_rank:
            ops = _timed_ring_exchanges([_timed_tp_collective(op, cache) for op in ops], L["tp"], cache)
        layers = layers_of(mesh.coords(g)["pp"], per_stage, stage_to_rank)
        n = sum(local.layers[i].param_bytes for i in layers) // 2 // share         # 16-bit parameters
        ops = ops + [Record("grads reduced", "comm"), Wait("grads reduced", "compute"),
                     Compute("optimizer", bytes=float(ADAM_BYTES * n), dtype=model.config["dtype"])]
        ranks.append(ops)
    return Plan(ranks, name=plan.name, meta={**plan.meta, "one_tp_rank": one_tp_rank})


def _timed_allreduce(op, rank: int, run, cache: dict):
    """A dp gradient all-reduce of replica 0's ``rank``, as a fixed-duration op on its stream."""
    if not isinstance(op, Collective) or not op.name.startswith("grad all_reduce stage"):
        return op
    return Compute(op.name, seconds=dp_allreduce_seconds(run, rank, op.bytes, op.dtype, cache), stream=op.stream)


def _timed_tp_collective(op, cache: dict):
    """A TP collective as a fixed-duration op on its stream: with tp a multiple of the node size, its group fills
    whole nodes and only it uses their NVLink/NVSwitch links (pipeline sends and dp all-reduces cross nodes on the
    NICs, sim/kernel/network.py routes), so its duration is that of the collective alone."""
    if not isinstance(op, Collective) or op.stream != "tp":
        return op
    from distlab.sim.kernel.engine import simulate_collective
    key = ("tp", op.op, op.bytes, op.algorithm, len(op.group))     # every node alike
    if key not in cache:
        trace, _ = simulate_collective(op.op, op.bytes, cache["cluster"], op.algorithm, group=op.group)
        cache[key] = trace.makespan
    return Compute(op.name, seconds=cache[key], stream=op.stream)


def _timed_ring_exchanges(ops: list, t: int, cache: dict) -> list:
    """TP communication overlap's ring exchanges (sim/parallel/tp/overlap.py: a Send to the next tp rank on stream
    "tp", a Recv from the previous on "tp_recv") of one TP rank standing for its stage, exactly: every tp rank runs
    the same program at the same times, so the peer posts its matching Send and Recv when this rank does, and the
    transfer starts once both of this rank's are posted (rendezvous) and takes what one step of the ring takes on
    the node's NVLink with all t ranks sending at once (its group fills whole nodes: no other traffic there). Each
    pair becomes: "tp" records that its Send is posted, waits for the Recv's, runs the transfer as a
    fixed-duration op and records its end; "tp_recv" records that its Recv is posted, waits for both."""
    out, k, pending = [], 0, None
    for op in ops:
        if isinstance(op, Send) and op.stream == "tp" and op.name.startswith("tp p2p"):
            pending = op
            continue
        if isinstance(op, Recv) and pending is not None and op.name == pending.name:
            k += 1
            s, r, x = f"ring {k} send", f"ring {k} recv", f"ring {k} moved"
            seconds = ring_step_seconds(pending.bytes, pending.dtype, t, cache)
            out += [Record(s, pending.stream), Record(r, op.stream), Wait(r, pending.stream),   # each stream's
                    Compute(pending.name, seconds=seconds, stream=pending.stream), Record(x, pending.stream),
                    Wait(s, op.stream), Wait(x, op.stream)]           # order; records before their waits
            pending = None
            continue
        out.append(op)
    return out


def ring_step_seconds(nbytes: int, dtype: str, t: int, cache: dict) -> float:
    """Seconds of one step of a ring exchange: each of t ranks of one node sends ``nbytes`` to the next (and
    receives from the previous) at once, simulated on the cluster's first node."""
    from distlab.sim.kernel.engine import simulate
    key = ("ring", nbytes, dtype, t)
    if key not in cache:
        ranks = [[Send((r + 1) % t, nbytes, dtype, name="ring", stream="tp"),
                  Recv((r - 1) % t, nbytes, dtype, name="ring", stream="tp_recv")] for r in range(t)]
        trace = simulate(Plan(ranks, name="tp ring step").validate(), cache["cluster"], record_transfers=False,
                         check=False)
        cache[key] = trace.makespan
    return cache[key]


def dp_allreduce_seconds(run, rank: int, nbytes: int, dtype: str, cache: dict, op: str = "all_reduce") -> float:
    """Seconds of the dp collective ``op`` (all_reduce; reduce_scatter with ZeRO 1) of replica-0 rank ``rank``'s
    stage, simulated on the whole cluster together with the concurrent ones of the other TP ranks of that stage
    (each over its own dp group)."""
    from distlab.sim.kernel.engine import simulate
    L, cluster = run.layout, cache["cluster"]
    per_replica = L["pp"] * L["tp"]
    first = rank - rank % L["tp"]                       # the stage's TP ranks in replica 0: first .. first+tp-1
    whole_nodes = per_replica % cluster.gpus_per_node == 0 and L["tp"] % cluster.gpus_per_node == 0
    key = ("dp", op, nbytes, dtype, None if whole_nodes else first)
    if key not in cache:
        ops: list = [[] for _ in range(run.gpus)]
        for t in range(L["tp"]):
            group = tuple(d * per_replica + first + t for d in range(L["dp"]))
            for g in group:
                ops[g] = [Collective(op, nbytes, dtype, group, name=f"dp grad {op}")]
        trace = simulate(Plan(ops, name=f"dp {op}").validate(), cluster, record_transfers=False, check=False)
        cache[key] = trace.makespan
    return cache[key]


def layers_of(pp_rank: int, layers_per_stage: list, stage_to_rank: list) -> list[int]:
    """Layer indices held by pipeline rank ``pp_rank`` (its stages, stage s on rank stage_to_rank[s])."""
    out, start = [], 0
    for s, n in enumerate(layers_per_stage):
        if stage_to_rank[s] == pp_rank:
            out += range(start, start + n)
        start += n
    return out
