"""The planner's estimate of any composition sim/parallel/parallelize.py builds, from its pieces, without simulating
every rank.

    from distlab.sim.parallel.parallelize import choose
    mesh = Mesh({"pp": 16, "dp_shard": 128, "tp": 8})
    par = choose(mesh, {"pipeline": PipelineOptions(microbatches=16), "fsdp": FSDPOptions(reshard_after_forward=False)})
    step_s = estimate_composed(preset("llama3-405b"), mesh, par, load_cluster("dgx-h100", nodes=2048))

With a pipeline: one rank per pipeline index (its other coordinates 0) is built
(sim/parallel/parallelize.py ``action_programs``), each piece of its program timed alone (sim/planner/estimate.py
``streams_makespan``: its streams, every collective on its real group, ring attention's sends at the time of
their hop), then the schedule's actions list-scheduled with those durations (sim/planner/schedule.py, the walk the planner's
fast estimate uses too: an action starts when its rank is free and its input has arrived, the boundary tensor
sent when the producing action ends, each link's messages in order, under GPipe and 1F1B received when the
receiver gets to the action, as sim/parallel/pipeline/plan.py posts them), each stage's gradient reduction (FSDP2's reduce-scatters) runs after its last backward, the optimizer after the
rank's last action; the step is the last rank's end. Without a pipeline: rank 0's program timed the same way
(symmetric ranks). What it leaves out is what simulating every rank adds: contention between concurrent groups
on shared links, and overlap of a stage's gradient reduction with the actions after it (the estimate runs it in
line); interleaved schedules post their receives early, which the estimate does not model.
Checked against the simulation (tests/test_compose_estimate.py): equal to 0.1% on PP x FSDP2 (x TP) (x CP),
HSDP inside stages and PP x TP x DDP under 1F1B and GPipe, within 3% with interleaved 1F1B and without a pipeline
(FSDP2 x TP, HSDP x CP x TP, FSDP2 gradient accumulation), on a 32-GPU, 8-block model.
"""
from __future__ import annotations

from distlab.sim.errors import ConfigError
from distlab.sim.kernel.engine import compute_seconds
from distlab.sim.plan import Collective, Record, Send, Wait
from distlab.sim.planner.estimate import CostCache, streams_makespan
from distlab.sim.planner.schedule import compiled_schedule, run_schedule


def piece_seconds(ops: list, rank: int, cluster, costs: CostCache) -> float:
    """Seconds of one piece of ``rank``'s program run alone (a Wait on an event an earlier piece recorded has
    fired already)."""
    recorded = {o.event for o in ops if isinstance(o, Record)}

    def seconds(op) -> tuple[float, float]:
        if isinstance(op, Collective):
            return costs.split(op.op, op.bytes, tuple(op.group), op.algorithm)
        if isinstance(op, Send):                 # ring attention's exchange with the next rank of the cp ring
            total = costs.p2p(rank, op.peer, int(op.bytes))
            latency = min(total, costs.p2p(rank, op.peer, 4))
            return latency, total - latency
        return 0.0, compute_seconds(op, cluster)

    kept = [o for o in ops if not (isinstance(o, Wait) and o.event not in recorded)]
    return streams_makespan(kept, seconds, share=lambda o: o.stream if isinstance(o, Collective) else None,
                            interference=cluster.interference)


def estimate_composed(model, mesh, par, cluster, costs: CostCache | None = None) -> float:
    """Step seconds of ``model`` on ``mesh`` with ``par`` (sim/parallel/parallelize.py ``Parallelisms``) on
    ``cluster`` (module docstring)."""
    from distlab.sim.parallel.parallelize import parallelize
    costs = costs or CostCache(cluster)
    if par.pipeline is None:
        return piece_seconds(parallelize(model, mesh, par, only=[0]).ranks[0], 0, cluster, costs)
    return _pipelined(model, mesh, par, cluster, costs)


def _pipelined(model, mesh, par, cluster, costs: CostCache) -> float:
    from distlab.sim.parallel.pipeline import schedules as S
    from distlab.sim.parallel.pipeline.stages import pipeline_spec
    from distlab.sim.parallel.parallelize import action_programs
    spec = pipeline_spec(par.pipeline, model, mesh)
    p, m, v = spec.stages, spec.microbatches, spec.virtual_stages
    if any(S.overlap_pairs(spec.schedule, p, m, v)):
        raise ConfigError(f"the estimate schedules one action at a time; {spec.schedule} overlaps pairs of them",
                          "pipeline.schedule")
    pp_ranks = mesh.group_of(0, "pp")
    programs, meta = action_programs(model, mesh, par, pp_ranks)
    pieces = [{k: piece_seconds(ops, g, cluster, costs) for k, ops in programs[g].items()} for g in pp_ranks]
    boundary, placement = meta["boundary_bytes"], meta["stage_to_rank"]
    if par.fsdp is None and "dp" in mesh:          # replicas of the pipeline: each stage's gradients all-reduced
        for r, g in enumerate(pp_ranks):
            for stage in (s for s, at in enumerate(placement) if at == r):
                pieces[r]["reduce", stage] = costs.collective("all_reduce", meta["param_bytes"][stage],
                                                               tuple(mesh.group_of(g, "dp")))
    c = compiled_schedule(spec.schedule, p, m, v)
    if list(c.placement) != list(placement):
        raise ValueError(f"the schedule places its stages on {c.placement}, the plan on {placement}")
    seconds = [pieces[r][a] for (r, _, _), a in zip(c.order, c.actions)]
    message_s = [0.0] * len(c.order)
    for i, ((_, _, link), (kind, stage, _)) in enumerate(zip(c.order, c.actions)):
        if link >= 0:                       # the boundary tensor between this stage and the one it comes from
            src = stage - 1 if kind == "F" else stage + 1
            sender, receiver = c.links[link]
            message_s[i] = costs.p2p(pp_ranks[sender], pp_ranks[receiver], boundary[min(src, stage)])
    after_s = {i: pieces[c.order[i][0]].get(("reduce", stage), 0.0) for stage, i in enumerate(c.last_b)}
    _, ends = run_schedule(c, seconds, message_s, after_s)
    return max(ends[r] + pieces[r].get(("optimizer",), 0.0) for r in range(p))
