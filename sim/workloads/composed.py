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
sim/workloads/<name>.py).
"""
from __future__ import annotations

import math
from dataclasses import replace

from distlab.sim.errors import ConfigError
from distlab.sim.mesh import Mesh
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


def validate(d: dict, sections: list[str], parse, where: str) -> None:
    """Every section composable and valid (``parse(name, section, where)``), every mesh dimension known, each
    section's dimension in the mesh (but the data-parallel one's, which may fill)."""
    for name in sections:
        if name not in COMPOSABLE:
            raise ConfigError(f"the {name} section does not compose with others (it has its own dims); allowed "
                              f"together: {', '.join(COMPOSABLE)}", where)
        parse(name, d[name], f"{where}: {name}")
    stray = [k for k in ("schedule", "microbatches", "virtual_stages", "split") if k in (d.get("tp") or {})]
    if stray:
        raise ConfigError(f"tp.{stray[0]} is for a tp section on its own; in a composition the pipeline section "
                          f"has it (pipeline: {{{stray[0]}: ...}}, flag --{stray[0].replace('_', '-')})", f"{where}: tp")
    if "fsdp" in sections and "ddp" in sections:
        raise ConfigError("give fsdp (dp_shard, dp_replicate) or ddp (dp), not both", where)
    mesh = d.get("mesh")
    if not isinstance(mesh, dict) or not mesh:
        raise ConfigError(f"a composition needs a mesh naming its dimensions, e.g. mesh: {{pp: 2, dp_shard: 4, "
                          f"tp: 2}} (dims: {', '.join(MESH_ORDER)})", f"{where}: mesh")
    for dim in mesh:
        if dim not in OWNER:
            raise ConfigError(f"unknown mesh dimension {dim!r} for a composition; allowed: {', '.join(MESH_ORDER)}",
                              f"{where}: mesh")
    for name in sections:
        if name in ("fsdp", "ddp"):
            continue
        if not any(dim in mesh for dim in DIMS[name]):
            raise ConfigError(f"the {name} section needs mesh dimension {DIMS[name][0]}; this mesh has "
                              f"{', '.join(map(str, mesh))}", f"{where}: mesh")
    if "dp" in mesh and ("dp_shard" in mesh or "dp_replicate" in mesh or "cp" in mesh):
        raise ConfigError("dp (DDP) composes with pp and tp only; with dp_shard, dp_replicate or cp use FSDP2 "
                          "(HSDP: dp_replicate x dp_shard)", f"{where}: mesh")
    Mesh(mesh, f"{where}: mesh")


def fill_dim(d: dict) -> str:
    """The dimension that takes the ranks the written ones leave: dp with a ddp section or dp in the mesh, else
    dp_shard (torchtitan's dp_shard = -1)."""
    return "dp" if "ddp" in d or "dp" in (d.get("mesh") or {}) else "dp_shard"


def complete_mesh(d: dict, world: int, where: str = "scenario") -> Mesh:
    """The mesh as written, with the fill dimension inserted in torchtitan's order when ranks are left over."""
    given = dict(d["mesh"])
    product = math.prod(given.values())
    fill = fill_dim(d)
    if fill not in given and (product != world or OWNER[fill] in d):
        if world % product:
            raise ConfigError(f"{' x '.join(f'{k} {v}' for k, v in given.items())} = {product} must divide the world "
                              f"size {world} (the rest goes to {fill}); allowed: divisors of {world}",
                              f"{where}: mesh")
        given[fill] = world // product
        order = [k for k in given if k != fill]
        at = next((i for i, k in enumerate(order) if k in MESH_ORDER and MESH_ORDER.index(k) > MESH_ORDER.index(fill)),
                  len(order))
        order.insert(at, fill)
        given = {k: given[k] for k in order}
    return Mesh(given, f"{where}: mesh").check_world(world, f"{where}: mesh")


def options_of(d: dict, mesh: Mesh, parse, where: str) -> Parallelisms:
    """The Parallelisms of a validated composed scenario on its completed ``mesh``: each section's options
    (``parse``), defaults for the dimensions without one; FSDP2 inside a pipeline not resharded after forward
    unless said (module docstring)."""
    from distlab.sim.parallel.parallelize import choose
    given = {name: parse(name, d[name], f"{where}: {name}") for name in COMPOSABLE if name in d}
    par = choose(mesh, given, f"{where}: mesh")
    piped = "pp" in mesh and mesh.size("pp") > 1        # torchtitan: reshard_after_forward = not pp_enabled
    if piped and par.fsdp is not None and "reshard_after_forward" not in (d.get("fsdp") or {}):
        par.fsdp = replace(par.fsdp, reshard_after_forward=False)
    if par.cp is not None and par.fsdp is not None and "overlap" not in (d.get("fsdp") or {}):
        par.fsdp = replace(par.fsdp, overlap=par.cp.overlap)     # CP's overlap covers its FSDP2, as cp_plan's
    return par


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
