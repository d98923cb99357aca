"""A scenario's layout: its parallelisms on its mesh, checked, completed and turned into options in one path.

    sections, builder = check(d, "scenario")       # {dp_shard: 8} and no section: ["fsdp"], the fsdp record
    mesh = complete_mesh(d, builder, 16)           # Mesh(dp_replicate=2, dp_shard=8): the fill dimension added
    options = options_of(d, builder, mesh)         # {"fsdp": FSDPOptions(...)}: one options object per section

The rule: a single parallelism is a composition of one section. Every scenario goes through the same steps:
its sections (written, or named by the mesh: each dimension names its parallelism, sim/workloads/composed.py
OWNER), each section's options parsed by its record (sim/workloads/base.py), the mesh's dimensions checked
against the layout, the fill dimension added, the options completed. What differs is data, the ``builder``:
one section on its own dimensions (a one-dimensional mesh, or the dimensions its builder composes itself, e.g.
TP's dp x pp x tp) is built by its record (sim/workloads/<name>.py); anything else by the composition's record
(sim/workloads/composed.py WORKLOAD, sim/parallel/parallelize.py in torchtitan's order). Errors name the key
as written (``scenario: mesh``, ``scenario: fsdp.zero``).
"""
from __future__ import annotations

import math
from dataclasses import replace

from distlab.sim.errors import ConfigError
from distlab.sim.mesh import Mesh
from distlab.sim.workloads import composed, registry
from distlab.sim.workloads.composed import COMPOSABLE, OWNER

PIPELINE_KEYS = ("schedule", "microbatches", "virtual_stages", "split")     # TP's own pipeline: a lone tp section


def sections_of(d: dict) -> list[str]:
    """The sections of a scenario mapping as written, in the mapping's order."""
    return [k for k in d if k in registry.names()]


def named_by_mesh(mesh) -> str | None:
    """The one parallelism a mesh without sections names, when its dimensions are all that parallelism's (ep:
    the ep workload); None for a mesh naming several (a composition) or none."""
    if not isinstance(mesh, dict) or not mesh or any(not isinstance(k, str) for k in mesh):
        return None
    names = {"ep"} if "ep" in mesh else {OWNER.get(k) for k in mesh}
    if len(names) != 1 or None in names or next(iter(names)) not in registry.names():
        return None
    w = registry.get(next(iter(names)))
    return w.name if all(k in w.dims for k in mesh) and all(k in mesh for k in w.required_dims) else None


def builder_of(d: dict, sections: list[str]):
    """The record that builds the layout: the one section's when the mesh keeps to its dimensions, else the
    composition's (several sections, a mesh with another parallelism's dimension, or a mesh and no section:
    sim/workloads/composed.py ``is_composed``); None with neither a section nor a mesh."""
    if composed.is_composed(d, sections, lambda name: registry.get(name).dims):
        return composed.WORKLOAD
    return registry.get(sections[0]) if sections else None


def check(d: dict, where: str) -> tuple[list[str], object]:
    """(sections, builder) of a scenario mapping, every section and the mesh checked (module docstring); a mesh
    naming one parallelism and no section gets that section, as if written ({dp_shard: 8} is fsdp: {})."""
    sections = sections_of(d)
    one = named_by_mesh(d.get("mesh")) if not sections else None
    if one is not None:
        d[one] = {}
        sections = [one]
    builder = builder_of(d, sections)
    if builder is None:
        raise ConfigError(f"missing a parallelism section: one of {', '.join(registry.names())} "
                          "(e.g. ddp: {}), or a mesh naming the parallelisms (e.g. mesh: {pp: 2, dp_shard: 4})", where)
    composing = builder is composed.WORKLOAD
    for name in sections:
        if composing and name not in COMPOSABLE:
            raise ConfigError(f"the {name} section does not compose with others (it has its own dims); allowed "
                              f"together: {', '.join(COMPOSABLE)}", where)
        registry.get(name).parse(d[name], f"{where}: {name}")
    stray = [k for k in PIPELINE_KEYS if composing and k in (d.get("tp") or {})]
    if stray:
        raise ConfigError(f"tp.{stray[0]} is for a tp section on its own; in a composition the pipeline section "
                          f"has it (pipeline: {{{stray[0]}: ...}}, flag --{stray[0].replace('_', '-')})",
                          f"{where}: tp")
    if "fsdp" in sections and "ddp" in sections:
        raise ConfigError("give fsdp (dp_shard, dp_replicate) or ddp (dp), not both", where)
    _check_mesh(d.get("mesh"), sections, builder, where)
    return sections, builder


def _needed(sections: list[str], builder) -> list[tuple[str, str]]:
    """(section, mesh dimension) pairs the mesh must have: a lone section's required dims; in a composition each
    section's first dimension, but the data-parallel ones' (they may fill)."""
    if builder is not composed.WORKLOAD:
        return [(builder.name, dim) for dim in builder.required_dims]
    return [(name, composed.DIMS[name][0]) for name in sections if name not in ("fsdp", "ddp")]


def _check_mesh(mesh, sections: list[str], builder, where: str) -> None:
    """Mesh names come from the records, each belongs to the layout, the needed ones are there, sizes whole."""
    composing = builder is composed.WORKLOAD
    needed = _needed(sections, builder)
    if composing and (not isinstance(mesh, dict) or not mesh):
        raise ConfigError("a composition needs a mesh naming its dimensions, e.g. mesh: {pp: 2, dp_shard: 4, "
                          f"tp: 2}} (dims: {', '.join(builder.dims)})", f"{where}: mesh")
    if mesh is None:
        if builder.default_dim is None:
            dim = needed[0][1]
            raise ConfigError(f"the {builder.name} section needs mesh dimension {' x '.join(d for _, d in needed)} "
                              f"({builder.dim_words.get(dim, '')}), e.g. mesh: {{{dim}: 2}}", where)
        return
    if not isinstance(mesh, dict) or not mesh:
        raise ConfigError(f"must be a mapping of dimension sizes, e.g. {{{builder.dims[-1]}: 2}}", f"{where}: mesh")
    for dim in mesh:
        if composing and dim not in OWNER:
            raise ConfigError(f"unknown mesh dimension {dim!r} for a composition; allowed: {', '.join(builder.dims)}",
                              f"{where}: mesh")
        if dim not in registry.mesh_dims():
            raise ConfigError(f"unknown mesh dimension {dim!r}; allowed: {', '.join(registry.mesh_dims())}",
                              f"{where}: mesh")
        if dim not in builder.dims:
            users = [w.name for w in registry.REGISTRY.values() if dim in w.dims]
            raise ConfigError(f"mesh dimension {dim!r} belongs to {' or '.join(users)}, not to {builder.name}; "
                              f"allowed with {builder.name}: {', '.join(builder.dims)}", f"{where}: mesh")
    for name, dim in needed:
        if dim not in mesh and not (composing and any(k in mesh for k in composed.DIMS[name])):
            words = "" if composing else f" ({builder.dim_words.get(dim, dim)})"
            shown = dim if composing else repr(dim)
            raise ConfigError(f"the {name} section needs mesh dimension {shown}{words}; this mesh has "
                              f"{', '.join(map(str, mesh))}", f"{where}: mesh")
    if composing and "dp" in mesh and ("dp_shard" in mesh or "dp_replicate" in mesh or "cp" in mesh):
        raise ConfigError("dp (DDP) composes with pp and tp only; with dp_shard, dp_replicate or cp use FSDP2 "
                          "(HSDP: dp_replicate x dp_shard)", f"{where}: mesh")
    Mesh(mesh, f"{where}: mesh")          # sizes


def fill_dim(d: dict, builder) -> str | None:
    """The dimension that takes the ranks the written ones leave: the builder's; in a composition dp with a ddp
    section or dp in the mesh, else dp_shard (torchtitan's dp_shard = -1)."""
    if builder is composed.WORKLOAD:
        return "dp" if "ddp" in d or "dp" in (d.get("mesh") or {}) else "dp_shard"
    return builder.fill_dim


def complete_mesh(d: dict, builder, world: int, where: str = "scenario") -> Mesh:
    """The scenario's mesh on ``world`` ranks: as written, with the fill dimension added when the written dims
    leave ranks over (a composition's also when its section is written, at its place in torchtitan's order; a lone
    section's outermost), or every rank on the builder's default dimension when there is no mesh."""
    given = d.get("mesh")
    if given is None:
        return Mesh({builder.default_dim: world})
    given, fill = dict(given), fill_dim(d, builder)
    composing = builder is composed.WORKLOAD
    product = math.prod(given.values())
    if fill is not None and fill not in given and (product != world or composing and OWNER[fill] in d):
        if world % product:
            raise ConfigError(_not_dividing(given, builder, composing, world), f"{where}: mesh")
        order = list(given)
        rank = composed.MESH_ORDER.index
        at = next((i for i, k in enumerate(order) if k in composed.MESH_ORDER and rank(k) > rank(fill)),
                  len(order)) if composing else 0
        order.insert(at, fill)
        given[fill] = world // product
        given = {k: given[k] for k in order}
        if not composing:
            return Mesh(given, f"{where}: mesh")
    return Mesh(given, f"{where}: mesh").check_world(world, f"{where}: mesh")


def _not_dividing(given: dict, builder, composing: bool, world: int) -> str:
    """The error of written dimensions that do not divide the world, short enough to fit 100 columns after
    ``distlab simulate: error: --mesh: ``: the dimensions by their keys (``pp 3 x tp 2 = 6``), a lone section's
    one dimension in words with its key (``shard group size 3 ... (dp_shard=3)``). The fill dimension that
    would take the rest (dp_shard, dp_replicate or dp) is the one left out."""
    words = builder.dim_words.get(next(iter(given))) if not composing and len(given) == 1 else None
    if words:
        (dim, size), = given.items()
        return f"{words} {size} must divide the world size {world} ({dim}={size})"
    text = " x ".join(f"{k} {v}" for k, v in given.items())
    total = "" if len(given) == 1 else f" = {math.prod(given.values())}"
    return f"{text}{total} must divide the world size {world}"


def options_of(d: dict, builder, mesh: Mesh, where: str = "scenario"):
    """What ``builder`` takes: a lone section's options object, or a composition's Parallelisms (each section's
    options, defaults for the mesh's other parallelisms; FSDP2 inside a pipeline not resharded after forward,
    and over dp_shard x cp following CP's overlap, unless the fsdp section says: sim/workloads/composed.py)."""
    if builder is not composed.WORKLOAD:
        return builder.parse(d[builder.name], f"{where}: {builder.name}")
    from distlab.sim.parallel.parallelize import choose
    given = {name: registry.get(name).parse(d[name], f"{where}: {name}") for name in COMPOSABLE if name in d}
    par = choose(mesh, given, f"{where}: mesh")
    written = d.get("fsdp") or {}
    piped = "pp" in mesh and mesh.size("pp") > 1        # torchtitan: reshard_after_forward = not pp_enabled
    if piped and par.fsdp is not None and "reshard_after_forward" not in written:
        par.fsdp = replace(par.fsdp, reshard_after_forward=False)
    if par.cp is not None and par.fsdp is not None and "overlap" not in written:
        par.fsdp = replace(par.fsdp, overlap=par.cp.overlap)     # CP's overlap covers its FSDP2, as cp_plan's
    return par
