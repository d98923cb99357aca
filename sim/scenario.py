"""Scenarios: a model, a device mesh, a section per parallelism and a cluster, as one YAML file or dict.

    name: llama-7b HSDP              # optional
    model: {preset: llama-7b, micro_batch: 1}   # a preset, or {preset: ..., micro_batch: 8}, or {kind: mlp, ...}
    mesh: {dp_replicate: 2, dp_shard: 8}        # optional: named dims, outermost first (sim/mesh.py)
    fsdp: {zero: 3, param_dtype: bfloat16}      # one section per parallelism: ddp, fsdp or pipeline
    cluster: dgx-h100                # a preset or a cluster .yaml (relative to the scenario file)
    nodes: 2                         # optional: overrides the cluster's node count
    world_size: 16                   # optional: ranks (default: every GPU of the cluster)
    stragglers: {3: 1.5}             # optional: rank -> compute slowdown factor (> 0; 1.5 = 50% slower)
    degraded_links: {node0.nic3.up: 0.25}   # optional: link -> bandwidth factor in (0, 1]

The section's key names the workload (sim/workloads/registry.py); its keys are the workload's options. The
mesh may leave out the workload's fill dimension (dp, dp_replicate): it takes the ranks the others leave; with
no mesh every rank is on the workload's default dimension (ddp: dp, fsdp: dp_shard; pipeline needs pp).
Several sections together, or a mesh naming several parallelisms, compose (sim/workloads/composed.py: each mesh
dimension chooses its parallelism, sim/parallel/parallelize.py builds them in torchtitan's order):

    mesh: {pp: 16, dp_shard: 128, tp: 8}
    pipeline: {microbatches: 16}
    tp: {recompute: selective}

The old format ``parallelism: {kind: ddp, ...}`` still loads: it is translated (``shard_size`` -> mesh
dp_shard, ``stages`` -> pp, ``data_parallel`` -> dp).
"""
from __future__ import annotations

import copy
import math
import os

from distlab.sim.errors import ConfigError
from distlab.sim.mesh import Mesh
from distlab.sim.result import Result, step_summary, throughput
from distlab.sim.workloads import composed, registry
from distlab.sim.workloads.registry import SCENARIO_KEYS

KEYS = SCENARIO_KEYS
# the default of `distlab simulate`: as people train GPT-2 small (nanoGPT's train.py): DDP, bf16 autocast
DEFAULT = {"model": {"preset": "gpt2-small", "micro_batch": 8}, "ddp": {"autocast": "bfloat16"},
           "cluster": "dgx-h100", "nodes": 1}


def load(path_or_dict, where: str | None = None) -> dict:
    """A validated scenario dict (a deep copy); a path is read as YAML and its cluster file and model config.json
    made absolute (relative to the scenario's folder)."""
    if isinstance(path_or_dict, dict):
        d, where = copy.deepcopy(path_or_dict), where or "scenario"
    else:
        from distlab.sim.io import load_yaml
        where = where or str(path_or_dict)
        d = load_yaml(path_or_dict)
        if isinstance(d, dict) and isinstance(d.get("cluster"), str) and d["cluster"].endswith((".yaml", ".yml")):
            d["cluster"] = os.path.join(os.path.dirname(os.path.abspath(path_or_dict)), d["cluster"])
        model = d.get("model") if isinstance(d, dict) else None      # a config.json beside the scenario
        if isinstance(model, dict) and isinstance(model.get("hf_config"), str):
            d["model"] = {**model, "hf_config": os.path.join(os.path.dirname(os.path.abspath(path_or_dict)),
                                                             model["hf_config"])}
    return validate(d, where)


def allowed_keys() -> str:
    return ", ".join(KEYS[:4] + registry.names() + KEYS[4:]) + " (or the old parallelism: {kind: ...})"


def validate(d, where: str = "scenario") -> dict:
    """``d`` in the current format (translated from the old one), every key and option checked."""
    if not isinstance(d, dict):
        raise ConfigError(f"a scenario is a mapping with keys {allowed_keys()}", where)
    for k in d:
        if k not in KEYS and k not in registry.names() and k != "parallelism":
            raise ConfigError(f"unknown key {k!r}; allowed: {allowed_keys()}", where)
    if "model" not in d:
        raise ConfigError("missing key 'model'", where)
    if "parallelism" in d:
        translate_legacy(d, where)
    sections = [k for k in d if k in registry.names()]
    if composed.is_composed(d, sections, lambda name: registry.get(name).dims):
        composed.validate(d, sections, _parse, where)
    elif not sections:
        raise ConfigError(f"missing a parallelism section: one of {', '.join(registry.names())} "
                          "(e.g. ddp: {}), or a mesh naming the parallelisms (e.g. mesh: {pp: 2, dp_shard: 4})", where)
    else:
        workload = registry.get(sections[0])
        workload.parse(d[sections[0]], f"{where}: {workload.name}")
        _check_mesh(d, workload, where)
    d.setdefault("cluster", "dgx-h100")
    if not isinstance(d["cluster"], str):
        raise ConfigError(f"{d['cluster']!r} must be a preset name or a cluster .yaml path", f"{where}: cluster")
    for key, low, high in (("stragglers", 0.0, float("inf")), ("degraded_links", 0.0, 1.0)):
        v = d.get(key)
        if v is None:
            continue
        if not isinstance(v, dict):
            raise ConfigError("must be a mapping, e.g. {3: 1.5}" if key == "stragglers"
                              else "must be a mapping, e.g. {node0.nic3.up: 0.25}", f"{where}: {key}")
        for name, factor in v.items():
            if key == "stragglers" and (isinstance(name, bool) or not isinstance(name, int) or name < 0):
                raise ConfigError(f"{name!r} must be a rank (a whole number >= 0)", f"{where}: stragglers")
            if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not low < factor <= high:
                allowed = "a number > 0" if key == "stragglers" else "a number in (0, 1]"
                raise ConfigError(f"factor {factor!r} for {name!r} must be {allowed}", f"{where}: {key}")
    for k in ("nodes", "world_size"):
        v = d.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65536):
            raise ConfigError(f"{v!r} must be a whole number from 1 to 65,536 (the simulator's ranks)",
                              f"{where}: {k}")
    return d


def translate_legacy(d: dict, where: str) -> None:
    """``parallelism: {kind: K, ...}`` -> ``K: {...}`` plus the mesh sizes it named (in place)."""
    par = d.pop("parallelism")
    if isinstance(par, str):
        par = {"kind": par}
    if not isinstance(par, dict) or "kind" not in par:
        raise ConfigError(f"must be a mapping with a 'kind' ({', '.join(registry.names())})", f"{where}: parallelism")
    kind = par["kind"]
    if not isinstance(kind, str) or kind not in registry.names():
        raise ConfigError(f"unknown kind {kind!r}; allowed: {', '.join(registry.names())}",
                          f"{where}: parallelism.kind")
    if kind in d or "mesh" in d:
        raise ConfigError(f"write either the old parallelism: {{kind: {kind}}} or a {kind}: section with a mesh, "
                          "not both", where)
    w = registry.get(kind)
    section = {k: v for k, v in par.items() if k != "kind" and k not in w.legacy_keys}
    mesh = {w.legacy_keys[k]: v for k, v in par.items() if k in w.legacy_keys and v is not None}
    if w.legacy is not None:
        w.legacy(section, mesh, d)
    d[kind] = section
    if mesh:
        d["mesh"] = {dim: mesh[dim] for dim in w.dims if dim in mesh}


def _check_mesh(d: dict, workload, where: str) -> None:
    """Mesh names come from the registry; the workload's required dims are there; sizes are whole numbers."""
    mesh = d.get("mesh")
    if mesh is None:
        if workload.default_dim is None:
            dims = " x ".join(workload.required_dims)
            raise ConfigError(f"the {workload.name} section needs mesh dimension {dims} "
                              f"({workload.dim_words.get(workload.required_dims[0], '')}), e.g. mesh: "
                              f"{{{workload.required_dims[0]}: 2}}", where)
        return
    if not isinstance(mesh, dict) or not mesh:
        raise ConfigError(f"must be a mapping of dimension sizes, e.g. {{{workload.dims[-1]}: 2}}", f"{where}: mesh")
    for dim in mesh:
        if dim not in registry.mesh_dims():
            raise ConfigError(f"unknown mesh dimension {dim!r}; allowed: {', '.join(registry.mesh_dims())}",
                              f"{where}: mesh")
        if dim not in workload.dims:
            users = [w.name for w in registry.REGISTRY.values() if dim in w.dims]
            raise ConfigError(f"mesh dimension {dim!r} belongs to {' or '.join(users)}, not to {workload.name}; "
                              f"allowed with {workload.name}: {', '.join(workload.dims)}", f"{where}: mesh")
    for dim in workload.required_dims:
        if dim not in mesh:
            raise ConfigError(f"the {workload.name} section needs mesh dimension {dim!r} "
                              f"({workload.dim_words.get(dim, dim)}); this mesh has {', '.join(map(str, mesh))}",
                              f"{where}: mesh")
    Mesh(mesh, f"{where}: mesh")          # sizes


def _parse(name: str, section, where: str):
    """The options dataclass of one section (sim/workloads/base.py Workload.parse)."""
    return registry.get(name).parse(section, where)


def workload_of(d: dict):
    """The record of a validated scenario: its one section's workload, or the composition's
    (sim/workloads/composed.py) when it has several sections or a mesh of several parallelisms."""
    sections = [k for k in d if k in registry.names()]
    if composed.is_composed(d, sections, lambda name: registry.get(name).dims):
        return composed.WORKLOAD
    return registry.get(sections[0])


def complete_mesh(d: dict, workload, world: int, where: str = "scenario") -> Mesh:
    """The scenario's mesh on ``world`` ranks: as written, with the workload's fill dimension added (outermost)
    when the written dims leave ranks over, or every rank on its default dimension when there is no mesh."""
    if workload is composed.WORKLOAD:
        return composed.complete_mesh(d, world, where)
    given = d.get("mesh")
    if given is None:
        return Mesh({workload.default_dim: world})
    product = math.prod(given.values())
    if product != world and workload.fill_dim is not None and workload.fill_dim not in given:
        if world % product:
            words = " x ".join(f"{workload.dim_words.get(k, k)} {v}" for k, v in given.items())
            raise ConfigError(f"{words} must divide the world size {world} (the rest goes to {workload.fill_dim}); "
                              f"allowed: divisors of {world}", f"{where}: mesh")
        return Mesh({workload.fill_dim: world // product, **given}, f"{where}: mesh")
    return Mesh(given, f"{where}: mesh").check_world(world, f"{where}: mesh")


def set_value(d: dict, key: str, value) -> None:
    """Set sweep key ``key`` of scenario ``d``: micro_batch, nodes, world_size, a mesh dim (or its old name:
    stages, data_parallel, shard_size) or an option of the scenario's parallelism."""
    if key == "micro_batch":
        if isinstance(d["model"], str):
            d["model"] = {"preset": d["model"]}
        if not isinstance(d["model"], dict):
            raise ConfigError("micro_batch needs a preset or gpt model", "--micro-batch")
        d["model"]["micro_batch" if d["model"].get("kind") != "mlp" else "batch"] = value
        return
    if key in ("nodes", "world_size"):
        d[key] = value
        return
    w = workload_of(d)
    if w is composed.WORKLOAD:
        return _set_composed(d, key, value)
    dim = w.legacy_keys.get(key, key)
    if dim in w.dims:
        mesh = dict(d.get("mesh") or {})
        pinned = set(mesh) == set(w.dims) and d.get("world_size") == math.prod(mesh.values())
        mesh[dim] = value
        if pinned:                                 # world_size was the mesh's product: it follows the mesh
            d["world_size"] = math.prod(mesh.values()) if all(isinstance(v, int) for v in mesh.values()) else None
        elif w.fill_dim and dim != w.fill_dim:
            mesh.pop(w.fill_dim, None)             # the fill dim takes what the new size leaves
        d["mesh"] = mesh
        return
    d[w.name][key] = value


def _set_composed(d: dict, key: str, value) -> None:
    """A mesh dimension (the fill dimension then takes what is left) or the option of the one section that has
    it (a section the mesh implies is added)."""
    if key in composed.MESH_ORDER:
        mesh = dict(d["mesh"])
        mesh[key] = value
        fill = composed.fill_dim(d)
        if key != fill:
            mesh.pop(fill, None)
        d["mesh"] = mesh
        return
    section, dot, option = key.partition(".")
    if dot and section in composed_sections(d) and option in registry.get(section).keys():
        d.setdefault(section, {})[option] = value
        return
    owners = [name for name in composed_sections(d) if key in registry.get(name).keys()]
    if "pipeline" in owners:            # TP's pipeline fields are for a tp section alone: the pipeline's win
        owners = ["pipeline"]
    if len(owners) != 1:
        owned = " and ".join(owners) or "none of this scenario's sections"
        raise ConfigError(f"{key!r} is an option of {owned}; allowed: {', '.join(composed_sweep_keys(d))}",
                          "--sweep")
    d.setdefault(owners[0], {})[key] = value


def composed_sections(d: dict) -> list[str]:
    """The sections a composed scenario has or its mesh implies, in torchtitan's order."""
    mesh = d.get("mesh") or {}
    implied = {composed.OWNER[k] for k in mesh if k in composed.OWNER} | ({"fsdp"} if "cp" in mesh else set())
    return [name for name in composed.COMPOSABLE if name in d or name in implied]


def composed_sweep_keys(d: dict) -> tuple[str, ...]:
    """A composition's sweep keys: the mesh dimensions and its sections' options (``section.key`` for an option
    two sections have, e.g. tp.recompute and cp.recompute)."""
    keys = ("nodes", "world_size", "micro_batch") + composed.MESH_ORDER
    sections = composed_sections(d)
    for name in sections:
        for k in registry.get(name).keys():
            owners = [o for o in sections if k in registry.get(o).keys()]
            shared = len(owners) > 1 and "pipeline" not in owners
            keys += (f"{name}.{k}",) if shared else (k,) if k not in keys else ()
    return keys


def parallelism(d: dict) -> dict:
    """The scenario's parallelism as the old flat dict {kind, options..., shard_size/stages/data_parallel from
    the mesh as written}: for callers written against the old format."""
    w = workload_of(d)
    mesh = d.get("mesh") or {}
    if w is composed.WORKLOAD:          # no flat form: the kind and the mesh
        return {"kind": w.name, "mesh": dict(mesh)}
    return {"kind": w.name, **d[w.name], **{k: mesh[dim] for k, dim in w.legacy_keys.items() if dim in mesh}}


def resolve(d: dict, where: str = "scenario"):
    """(model, cluster) of a validated scenario."""
    from distlab.sim.cluster import load_cluster
    from distlab.sim.models import model_from_spec
    model = model_from_spec(d["model"], f"{where}: model")
    cluster = load_cluster(d["cluster"], d.get("nodes"))
    if d.get("world_size") is not None:
        cluster = cluster.with_world_size(d["world_size"])
    return model, cluster


def parts(d: dict, where: str = "scenario", cluster=None) -> tuple:
    """(validated scenario, workload, model, cluster, completed mesh, options) of a scenario, without building
    its plan: for a composition the options are a Parallelisms (sim/parallel/parallelize.py), what
    ``parallelize`` and the planner's estimate (sim/planner/composed.py) take. ``cluster``: a Cluster to use
    instead of the scenario's (sim/jobs/: a job on its nodes of a shared one)."""
    d = validate(copy.deepcopy(d), where)
    w = workload_of(d)
    if cluster is None:
        model, cluster = resolve(d, where)
    else:
        from distlab.sim.models import model_from_spec
        model = model_from_spec(d["model"], f"{where}: model")
    try:
        mesh = complete_mesh(d, w, cluster.world_size, where)
        opts = composed.options_of(d, mesh, _parse, where) if w is composed.WORKLOAD else \
            w.parse(d[w.name], f"{where}: {w.name}")
    except ConfigError as e:
        raise _under(e, where) from None
    from distlab.sim.parallel.pipeline.plan import with_default_microbatches
    return d, w, model, cluster, mesh, with_default_microbatches(opts, mesh)


def _under(e: ConfigError, where: str) -> ConfigError:
    if e.where and not e.where.startswith(where):
        return ConfigError(str(e).removeprefix(f"{e.where}: "), f"{where}: {e.where}")
    return e


def build(d: dict, where: str = "scenario", cluster=None) -> Result:
    """The Result of a scenario before simulation (validated here again): plan, mesh, model, cluster; no trace.
    ``cluster``: a Cluster to build on instead of the scenario's (sim/jobs/: a job on its nodes of a shared one)."""
    d, w, model, cluster, mesh, opts = parts(d, where, cluster)
    try:
        plan, info = w.build(model, mesh, opts, cluster)
    except ConfigError as e:
        raise _under(e, where) from None
    return Result(d, w, opts, mesh, model, cluster, plan, info or {}, None)


def simulate(d: dict, where: str = "scenario") -> Result:
    """Build and simulate one step: the Result with trace, step summary and the workload's report."""
    from distlab.sim.kernel.engine import simulate as run
    result = build(d, where)
    slowdown = d.get("stragglers") or {}
    if any(r >= result.plan.world_size for r in slowdown):
        raise ConfigError(f"rank {max(slowdown)} is outside the world (0..{result.plan.world_size - 1})",
                          f"{where}: stragglers")
    result.trace = run(result.plan, result.cluster, record_transfers=False, slowdown=slowdown,
                       link_factors=d.get("degraded_links"))
    result.summary = step_summary(result.trace)
    result.summary.update(throughput(result))
    if result.workload.report is not None:
        result.reports[result.workload.name] = result.workload.report(result)
    return result
