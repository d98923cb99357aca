"""Parsing and validating a scenario mapping (a YAML file's, the command line's, a plan header's) into the typed
Scenario (sim/scenario/spec.py), once.

    s = from_dict({"model": "gpt2-small", "ddp": {}}, "scenario")   # or load("scenarios/fsdp-llama-7b.yaml")
    build(s)                                                            # sim/scenario/__init__.py

``validate`` checks every key and option of the mapping (errors name the key as written, ``scenario: fsdp.zero``)
and translates the old ``parallelism: {kind: ...}`` format; ``from_dict`` then resolves what the mapping leaves
implicit (the cluster's world, the completed mesh, every option's default) so that one layout is one object.
The workload records (sim/workloads/) define the sections; this module only reads them. The layout (sections,
mesh, options) is checked and completed by sim/scenario/layout.py in one path: one parallelism is a composition
of one section, not a separate case.
"""
from __future__ import annotations

import copy
import os

from distlab.sim.errors import ConfigError
from distlab.sim.mesh import Mesh
import distlab.sim.scenario.layout as layout
from distlab.sim.workloads import composed, registry
from distlab.sim.workloads.registry import SCENARIO_KEYS

KEYS = SCENARIO_KEYS


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
    layout.check(d, where)             # one path for one parallelism or several (sim/scenario/layout.py)
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
    from distlab.sim.cluster import MAX_RANKS
    for k in ("nodes", "world_size"):      # nodes: against the cluster's GPUs per node too (resolve_cluster)
        v = d.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_RANKS):
            raise ConfigError(f"{v!r} is out of range; allowed: 1 to {MAX_RANKS:,} (ranks the simulator takes)",
                              f"{where}: {k}")
    from distlab.sim.scenario.batch import check_value
    check_value(d.get("global_batch"), f"{where}: global_batch")
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


def _parse(name: str, section, where: str):
    """The options dataclass of one section (sim/workloads/base.py Workload.parse)."""
    return registry.get(name).parse(section, where)


def workload_of(d: dict):
    """The record that builds a validated scenario mapping: its one section's, or the composition's
    (sim/scenario/layout.py ``builder_of``)."""
    return layout.builder_of(d, layout.sections_of(d))


def complete_mesh(d: dict, workload, world: int, where: str = "scenario") -> Mesh:
    """The scenario's mesh on ``world`` ranks (sim/scenario/layout.py ``complete_mesh``)."""
    return layout.complete_mesh(d, workload, world, where)


def from_dict(d, where: str | None = None, cluster=None):
    """The Scenario of a scenario mapping (validated here; a path is loaded as ``load`` does, its errors named
    by the path). ``cluster``: a Cluster to run on instead of the scenario's (sim/jobs/: a job on its nodes of a
    shared one)."""
    from distlab.sim.scenario.spec import Batch, ClusterSpec, ModelSpec, Scenario
    where = where or ("scenario" if isinstance(d, dict) else str(d))
    d = load(d, where) if not isinstance(d, dict) else validate(copy.deepcopy(d), where)
    w = workload_of(d)
    if cluster is None:
        cluster = resolve_cluster(d, where)
    try:
        mesh = complete_mesh(d, w, cluster.world_size, where)
        from distlab.sim.parallel.pipeline.plan import with_default_microbatches   # 2 x pp x v when unset
        par = layout.options_of(d, w, mesh, where)        # one options object, or a composition's Parallelisms
        if d.get("global_batch") is not None:                # m from the global batch (sim/scenario/batch.py)
            from distlab.sim.scenario.batch import apply, micro_batch_of
            par = apply(par, mesh, d["global_batch"], micro_batch_of(d, where),
                              f"{where}: global_batch")
        par = with_default_microbatches(par, mesh)
        options = {name: getattr(par, name) for name in par.names()} if w is composed.WORKLOAD else {w.name: par}
    except ConfigError as e:
        raise under(e, where) from None
    if not isinstance(d["model"], (str, dict)):
        from distlab.sim.models.presets import preset_names
        raise ConfigError(f"must be a preset name ({', '.join(preset_names())}) or a mapping", f"{where}: model")
    spec = {"preset": d["model"]} if isinstance(d["model"], str) else dict(d["model"])
    form = next((k for k in ("preset", "hf_config", "factory", "kind") if k in spec), "kind")
    mlp = spec.get("kind") == "mlp"
    micro_batch = spec.pop("batch" if mlp else "micro_batch", None)
    source = spec.pop(form, "gpt")
    model = ModelSpec(form, source, tuple(sorted(spec.items())))
    return Scenario(model=model, batch=Batch(micro_batch, d.get("global_batch")), mesh=tuple(mesh.as_dict().items()),
                    parallelisms=options,
                    workload=w.name, cluster=ClusterSpec(d["cluster"], cluster.nodes, cluster.world_size, cluster),
                    stragglers=tuple(sorted((d.get("stragglers") or {}).items())),
                    degraded_links=tuple(sorted((d.get("degraded_links") or {}).items())),
                    name=d.get("name"), description=d.get("description"), source=d,
                    fp8_recipe=_fp8_recipe(d, cluster, where))


def _fp8_recipe(d: dict, cluster, where: str):
    """The scenario's ``fp8_recipe``, checked against its GPU (sim/compute/fp8.py check_recipe), or None."""
    if d.get("fp8_recipe") is None:
        return None
    from distlab.sim.compute.fp8 import RECIPES, check_recipe
    if not isinstance(d["fp8_recipe"], str):
        raise ConfigError(f"{d['fp8_recipe']!r} must be a recipe name; allowed: {', '.join(RECIPES)}",
                          f"{where}: fp8_recipe")
    return check_recipe(d["fp8_recipe"], cluster.gpu, f"{where}: fp8_recipe").name


def resolve_cluster(d: dict, where: str = "scenario"):
    """The Cluster of a validated scenario mapping: its preset or file, nodes (at most the simulator's ranks over
    the cluster's GPUs per node, named as written) and world size."""
    from distlab.sim.cli import check_whole
    from distlab.sim.cluster import load_cluster, nodes_bound
    if d.get("nodes") is not None:
        check_whole(d["nodes"], f"{where}: nodes", 1, *nodes_bound(load_cluster(d["cluster"])))
    cluster = load_cluster(d["cluster"], d.get("nodes"))
    if d.get("world_size") is not None:
        try:
            cluster = cluster.with_world_size(d["world_size"])
        except ConfigError as e:                    # named in its file (a GB200 job of partial trays)
            raise under(e, where) from None
    return cluster


def under(e: ConfigError, where: str) -> ConfigError:
    """``e`` with its place prefixed by ``where`` (once)."""
    if e.where and not e.where.startswith(where):
        return ConfigError(str(e).removeprefix(f"{e.where}: "), f"{where}: {e.where}")
    return e
