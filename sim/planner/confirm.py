"""Confirming a layout without simulating every rank: the composition's own program, one rank per pipeline
index (sim/planner/composed.py), for clusters too large to simulate rank by rank in a planner's minutes.

    parts = layout_parts(estimator, layout)            # (model, mesh, Parallelisms) of the layout's scenario
    step_s = composed_step(estimator, layout)

`distlab plan` confirms its best estimates with the discrete-event simulator up to ``SIMULATE_UP_TO`` GPUs
(every rank simulated: contention between concurrent groups included). Beyond, a simulation of one layout takes
minutes and gigabytes (Llama 3 405B on 16,384 H100 as TP 8 x HSDP did not finish in 10 minutes on a shared
core), so the best estimates are confirmed by building the layout's program through
sim/parallel/parallelize.py for the ranks of one pipeline (rank 0 without a pipeline) and timing it: every op
the simulator would run on those ranks, every collective on its real group, the schedule walked with those
durations. What it leaves out is contention between concurrent groups on shared links
(tests/test_compose_estimate.py: within 0.1% of the simulator under 1F1B and GPipe, 3% with interleaved 1F1B
and without a pipeline; tests/test_planner_scale.py holds it to the estimate's bound).
"""
from __future__ import annotations

from distlab.sim.mesh import Mesh

SIMULATE_UP_TO = 1024          # GPUs up to which the planner confirms with the discrete-event simulator


def layout_parts(est, L) -> tuple:
    """(model, mesh, Parallelisms) of layout ``L`` as its scenario (Layout.scenario) builds it: the pipeline with
    TP (and DDP replicas) as sim/parallel/tp/pipeline.py ``pp_tp_plan``; FSDP2 inside stages not resharded
    after forward (torchtitan's default with pp); CP with FSDP2 over dp_shard x cp; DDP x TP, FSDP2 x TP as
    their builders (tp/ddp.py, tp/compose.py)."""
    from distlab.sim.parallel.cp.local import CPOptions
    from distlab.sim.parallel.ddp.plan import DDPOptions
    from distlab.sim.parallel.fsdp.plan import FSDPOptions
    from distlab.sim.parallel.parallelize import Parallelisms
    from distlab.sim.parallel.pipeline.plan import PipelineOptions
    from distlab.sim.parallel.tp.plan import TPOptions
    sp = L.sequence_parallel and L.tp > 1
    par = Parallelisms()
    if L.pipelined:
        par.pipeline = PipelineOptions(schedule=L.schedule, microbatches=L.microbatches,
                                       virtual_stages=L.virtual_stages, split=list(L.split) if L.split else None)
    if L.cp > 1:
        par.cp, par.tp = CPOptions(recompute=L.recompute), TPOptions(sequence_parallel=sp)
    else:
        par.tp = TPOptions(sequence_parallel=sp, loss_parallel=L.loss_parallel, recompute=L.recompute)
    if L.dp_kind != "ddp" or L.cp > 1:
        par.fsdp = FSDPOptions(reshard_after_forward=L.pp == 1)    # torchtitan: not pp_enabled
    elif L.dp > 1 and not L.pipelined:
        par.ddp = DDPOptions()
    return est.model(L.micro_batch), Mesh(L.mesh()), par


def composed_step(est, L) -> float:
    """Step seconds of layout ``L`` from its program (module docstring), with the estimator's cost caches."""
    from distlab.sim.planner.composed import estimate_composed
    model, mesh, par = layout_parts(est, L)
    return estimate_composed(model, mesh, par, est.cluster, est.costs)
