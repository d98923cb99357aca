"""A scenario with a section per parallelism, the mesh naming their dimensions: the composition
sim/parallel/parallelize.py builds in torchtitan's order.

    mesh: {pp: 16, dp_shard: 128, tp: 8}       # outermost first; each dimension chooses its parallelism
    pipeline: {schedule: 1f1b, microbatches: 16}
    fsdp: {param_dtype: bfloat16}
    tp: {sequence_parallel: true, recompute: selective}

Dimensions: pp -> pipeline, tp -> tp, cp -> cp (with FSDP2 over dp_shard x cp), dp_shard and dp_replicate ->
fsdp (HSDP with both), dp -> ddp (with pp: replicas of the pipeline). A section whose dimension the mesh lacks
is an error, except the data-parallel one: ``fsdp`` (or ``ddp``) takes the ranks the other dimensions leave, as
torchtitan's dp_shard = -1 does, placed in torchtitan's mesh order (pp, dp_replicate, dp_shard, cp, tp). A
section left out takes its defaults. Inside a pipeline FSDP2 does not reshard after forward unless the fsdp
section says so (torchtitan's default policy with pp: "do not reshard after forward to avoid per-microbatch
all-gathers"); with CP, FSDP2 over dp_shard x cp follows the cp section's ``overlap`` unless the fsdp section
says (as sim/parallel/cp/plan.py). A scenario is composed when it has several sections, or a mesh with
dimensions its one section's parallelism does not have (one section on its own dimensions is that workload,
sim/workloads/<name>.py). This module is the composition's record (its builder, report and figure); checking
and completing a layout, one section or several, is one path: sim/scenario/layout.py.
"""
from __future__ import annotations

from dataclasses import replace

from distlab.sim.parallel.parallelize import DIMS, MESH_ORDER, Parallelisms
from distlab.sim.workloads.base import Workload

COMPOSABLE = ("pipeline", "tp", "cp", "fsdp", "ddp")
OWNER = {d: name for name, dims in DIMS.items() for d in dims}      # mesh dim -> parallelism


def is_composed(d: dict, sections: list[str], dims_of) -> bool:
    """Several sections, or a mesh with dimensions outside its one section's (``dims_of(name)``), or a mesh and
    no section."""
    mesh = d.get("mesh")
    if len(sections) > 1 or not sections and isinstance(mesh, dict) and mesh:
        return True
    return len(sections) == 1 and isinstance(mesh, dict) and any(k not in dims_of(sections[0]) for k in mesh)


def build(model, mesh, par: Parallelisms, cluster):
    from distlab.sim.models.activations import effective_recompute, require_structure
    from distlab.sim.parallel.parallelize import parallelize
    for name in ("tp", "cp"):                       # TP and CP rewrite a transformer's modules by name
        opts = getattr(par, name)
        if opts is not None:
            require_structure(model, "tensor parallelism" if name == "tp" else "context parallelism")
            rc = effective_recompute(model, opts.recompute, f"{name}.recompute")
            par = replace(par, **{name: replace(opts, recompute=rc)})
    plan = parallelize(model, mesh, par, cluster=cluster)
    return plan, {"composed": {k: v for k, v in plan.meta.items() if k != "memory"}}


def report(result) -> dict:
    from distlab.sim.workloads.composed_report import report as composed_report
    return composed_report(result)


def figure(result, title=None):
    """A timeline of rank 0 and (with a pipeline) the first rank of the last stage, only their ops read from the
    trace (a plan of thousands of ranks draws as fast as a small one), labels on ops longer than 4% of the step."""
    from distlab.sim.plots import timeline
    from distlab.sim.trace import Trace
    ranks = [0, result.mesh.group_of(0, "pp")[-1]] if "pp" in result.mesh else [0, min(1, result.plan.world_size - 1)]
    ranks = sorted(set(ranks))
    sub = Trace([o for r in ranks for o in result.trace.for_rank(r)], [], dict(result.trace.meta))
    wide = 0.04 * sub.makespan
    return timeline(sub, ranks=ranks, title=title, highlight=lambda o: o.name if o.end - o.start > wide else None)


WORKLOAD = Workload(
    name="composed", help="any composition of pipeline, tp, cp, fsdp (HSDP, ZeRO) and ddp on one mesh, built in "
                          "torchtitan's order (sim/parallel/parallelize.py)",
    dims=MESH_ORDER, options=Parallelisms, build=build, report=report, figure=figure, fill_dim="dp_shard",
    dim_words={"pp": "pipeline stages", "dp_replicate": "HSDP replicas", "dp_shard": "FSDP2 shard group size",
               "dp": "DDP replicas", "cp": "context-parallel ranks", "tp": "tensor-parallel ranks"})
