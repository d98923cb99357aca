"""Scenarios: a model, a parallelism strategy and a cluster, as one YAML file or dict, turned into a plan.

    name: gpt2-small-ddp            # optional
    model: gpt2-small               # a preset, or {preset: gpt2-small, micro_batch: 8}, or {kind: mlp, ...}
    parallelism: {kind: ddp, bucket_cap_mb: 25}
    cluster: dgx-h100               # a preset or a cluster .yaml (relative to the scenario file)
    nodes: 1                        # optional: overrides the cluster's node count
    world_size: 8                   # optional: ranks (default: every GPU of the cluster)
    stragglers: {3: 1.5}            # optional: rank -> compute slowdown factor (> 0; 1.5 = 50% slower)
    degraded_links: {node0.nic3.up: 0.25}   # optional: link -> bandwidth factor in (0, 1]

``BUILDERS`` maps a parallelism kind to ``build(scenario, model, cluster) -> (Plan, info)``; the builder
validates its own ``parallelism`` keys and raises ConfigError naming the key.
"""
from __future__ import annotations

import copy
import os

from distlab.sim.ddp.plan import build as build_ddp
from distlab.sim.errors import ConfigError
from distlab.sim.fsdp.scenario import build as build_fsdp
from distlab.sim.pipeline.scenario import build as build_pipeline

KEYS = ("name", "description", "model", "parallelism", "cluster", "nodes", "world_size", "stragglers",
        "degraded_links")
# kind -> build(scenario, model, cluster) -> (Plan, info)
BUILDERS = {"ddp": build_ddp, "fsdp": build_fsdp, "pipeline": build_pipeline}

DEFAULT = {"name": "gpt2-small DDP on one DGX H100",
           "model": {"preset": "gpt2-small", "micro_batch": 8},
           "parallelism": {"kind": "ddp"},
           "cluster": "dgx-h100", "nodes": 1}


def load(path_or_dict, where: str | None = None) -> dict:
    """A validated scenario dict (a deep copy); a path is read as YAML and its cluster file made absolute."""
    if isinstance(path_or_dict, dict):
        d, where = copy.deepcopy(path_or_dict), where or "scenario"
    else:
        from distlab.sim.io import load_yaml
        where = where or str(path_or_dict)
        d = load_yaml(path_or_dict)
        if isinstance(d, dict) and isinstance(d.get("cluster"), str) and d["cluster"].endswith((".yaml", ".yml")):
            d["cluster"] = os.path.join(os.path.dirname(os.path.abspath(path_or_dict)), d["cluster"])
    return validate(d, where)


def validate(d, where: str = "scenario") -> dict:
    if not isinstance(d, dict):
        raise ConfigError(f"a scenario is a mapping with keys {', '.join(KEYS)}", where)
    for k in d:
        if k not in KEYS:
            raise ConfigError(f"unknown key {k!r}; allowed: {', '.join(KEYS)}", where)
    for k in ("model", "parallelism"):
        if k not in d:
            raise ConfigError(f"missing key {k!r}", where)
    par = d["parallelism"]
    if isinstance(par, str):
        par = d["parallelism"] = {"kind": par}
    if not isinstance(par, dict) or "kind" not in par:
        raise ConfigError(f"must be a mapping with a 'kind' ({', '.join(BUILDERS)})", f"{where}: parallelism")
    if not isinstance(par["kind"], str) or par["kind"] not in BUILDERS:
        raise ConfigError(f"unknown kind {par['kind']!r}; allowed: {', '.join(BUILDERS)}",
                          f"{where}: parallelism.kind")
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
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"{v!r} must be a whole number >= 1", f"{where}: {k}")
    return d


def resolve(d: dict, where: str = "scenario"):
    """(model, cluster) of a validated scenario."""
    from distlab.sim.cluster import load_cluster
    from distlab.sim.models import model_from_spec
    model = model_from_spec(d["model"], f"{where}: model")
    cluster = load_cluster(d["cluster"], d.get("nodes"))
    if d.get("world_size") is not None:
        cluster = cluster.with_world_size(d["world_size"])
    return model, cluster


def build(d: dict, where: str = "scenario"):
    """(plan, info, model, cluster) of a scenario (validated here again)."""
    d = validate(copy.deepcopy(d), where)
    model, cluster = resolve(d, where)
    try:
        plan, info = BUILDERS[d["parallelism"]["kind"]](d, model, cluster)
    except ConfigError as e:
        if e.where and not e.where.startswith(where):
            raise ConfigError(str(e).removeprefix(f"{e.where}: "), f"{where}: {e.where}") from None
        raise
    return plan, info, model, cluster


def simulate(d: dict, where: str = "scenario"):
    """(trace, info, model, cluster, plan) of a scenario."""
    from distlab.sim.engine import simulate as run
    plan, info, model, cluster = build(d, where)
    slowdown = d.get("stragglers") or {}
    if any(r >= plan.world_size for r in slowdown):
        raise ConfigError(f"rank {max(slowdown)} is outside the world (0..{plan.world_size - 1})",
                          f"{where}: stragglers")
    trace = run(plan, cluster, record_transfers=False, slowdown=slowdown, link_factors=d.get("degraded_links"))
    return trace, info, model, cluster, plan
