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
    fp8_recipe: te-delayed           # optional: how float8 GEMMs quantize (sim/compute/fp8.py RECIPES)

The section's key names the workload (sim/workloads/registry.py); its keys are the workload's options. The
mesh may leave out the workload's fill dimension (dp, dp_replicate): it takes the ranks the others leave; with
no mesh every rank is on the workload's default dimension (ddp: dp, fsdp: dp_shard; pipeline needs pp).
A mesh with no section that names one parallelism is that parallelism with its defaults (``mesh:
{dp_shard: 8}`` is ``fsdp: {}`` on 8 ranks). Several sections together, or a mesh naming several parallelisms,
compose (sim/workloads/composed.py: each mesh
dimension chooses its parallelism, sim/parallel/parallelize.py builds them in torchtitan's order):

    mesh: {pp: 16, dp_shard: 128, tp: 8}
    pipeline: {microbatches: 16}
    tp: {recompute: selective}

The old format ``parallelism: {kind: ddp, ...}`` still loads: it is translated (``shard_size`` -> mesh
dp_shard, ``stages`` -> pp, ``data_parallel`` -> dp).

A scenario is parsed once into the typed ``Scenario`` (sim/scenario/spec.py; parse.py from a mapping or YAML,
flags.py from `distlab simulate`'s flags); ``build``, ``simulate`` and ``parts`` take it (a mapping or a path is
parsed first). This package: spec.py (the dataclasses), parse.py (``validate``, ``from_dict``), layout.py (the
sections and the mesh checked and completed in one path: a single parallelism is a composition of one section),
flags.py (the command line), header.py (a plan file's scenario header), pipeline.py and what_if.py (studies of
several scenarios), and here what runs one.
"""
from __future__ import annotations

import copy
import math

from distlab.sim.errors import ConfigError
from distlab.sim.result import Result, step_summary, throughput
from distlab.sim.scenario import layout
from distlab.sim.scenario.parse import (KEYS, _parse, allowed_keys, complete_mesh,  # noqa: F401
                                        from_dict, load, resolve_cluster, translate_legacy, under, validate,
                                        workload_of)
from distlab.sim.scenario.spec import Batch, ClusterSpec, ModelSpec, Scenario  # noqa: F401
from distlab.sim.workloads import composed, registry

# the default of `distlab simulate`: as people train GPT-2 small (nanoGPT's train.py): DDP, bf16 autocast
DEFAULT = {"model": {"preset": "gpt2-small", "micro_batch": 8}, "ddp": {"autocast": "bfloat16"},
           "cluster": "dgx-h100", "nodes": 1}


def vary(s: Scenario, key: str, value, where: str = "--sweep") -> Scenario:
    """``s`` with sweep key ``key`` set to ``value`` (``set_value`` on its source mapping), parsed again: one
    Scenario per point of a sweep."""
    d = copy.deepcopy(s.source)
    set_value(d, key, value)
    return from_dict(d, f"{where} {key}={value}")


def sweep_keys(s: Scenario) -> tuple[str, ...]:
    """What ``--sweep`` takes for ``s`` (``layout_sweep_keys`` of its builder)."""
    return layout_sweep_keys(s.source, workload_record(s))


def set_value(d: dict, key: str, value) -> None:
    """Set sweep key ``key`` of scenario ``d``: micro_batch, nodes, world_size, a mesh dim of the layout (or its
    old name: stages, data_parallel, shard_size; the fill dimension then takes what is left) or the option of the
    one section that has it (``section.key`` where two have it; a section the mesh implies is added). One path
    for one parallelism or several (sim/scenario/layout.py)."""
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
    dim = w.legacy_keys.get(key, key)
    if dim in w.dims:
        mesh, fill = dict(d.get("mesh") or {}), layout.fill_dim(d, w)
        pinned = set(mesh) == set(w.dims) and d.get("world_size") == math.prod(mesh.values())
        mesh[dim] = value
        if pinned:                                 # world_size was the mesh's product: it follows the mesh
            d["world_size"] = math.prod(mesh.values()) if all(isinstance(v, int) for v in mesh.values()) else None
        elif fill and dim != fill:
            mesh.pop(fill, None)                   # the fill dim takes what the new size leaves
        d["mesh"] = mesh
        return
    sections = layout_sections(d, w)
    section, dot, option = key.partition(".")
    if dot and section in sections and option in registry.get(section).keys():
        d.setdefault(section, {})[option] = value
        return
    owners = [name for name in sections if key in registry.get(name).keys()]
    if "pipeline" in owners:            # TP's pipeline fields are for a tp section alone: the pipeline's win
        owners = ["pipeline"]
    if not owners and len(sections) == 1:
        owners = sections               # a lone section: its own check names the key
    if len(owners) != 1:
        owned = " and ".join(owners) or "none of this scenario's sections"
        raise ConfigError(f"{key!r} is an option of {owned}; allowed: {', '.join(layout_sweep_keys(d, w))}",
                          "--sweep")
    d.setdefault(owners[0], {})[key] = value


def layout_sections(d: dict, w) -> list[str]:
    """The sections of the layout built by ``w``: a lone section's, or those a composition has or its mesh
    implies, in torchtitan's order."""
    if w is not composed.WORKLOAD:
        return [w.name]
    mesh = d.get("mesh") or {}
    implied = {composed.OWNER[k] for k in mesh if k in composed.OWNER} | ({"fsdp"} if "cp" in mesh else set())
    return [name for name in composed.COMPOSABLE if name in d or name in implied]


def composed_sections(d: dict) -> list[str]:
    return layout_sections(d, composed.WORKLOAD)


def layout_sweep_keys(d: dict, w) -> tuple[str, ...]:
    """The sweep keys of the layout built by ``w``: the scenario's own, the mesh dimensions (and their old names),
    its sections' options (``section.key`` for an option two sections have, e.g. tp.recompute and cp.recompute;
    a pipeline's fields are the pipeline section's)."""
    keys = ("nodes", "world_size", "micro_batch") + w.dims + tuple(w.legacy_keys)
    sections = layout_sections(d, w)
    for name in sections:
        for k in registry.get(name).keys():
            owners = [o for o in sections if k in registry.get(o).keys()]
            shared = len(owners) > 1 and "pipeline" not in owners
            keys += (f"{name}.{k}",) if shared else (k,) if k not in keys else ()
    return keys


def composed_sweep_keys(d: dict) -> tuple[str, ...]:
    return layout_sweep_keys(d, composed.WORKLOAD)


def parallelism(d: dict) -> dict:
    """The scenario's parallelism as the old flat dict {kind, options..., shard_size/stages/data_parallel from
    the mesh as written}: for callers written against the old format."""
    w = workload_of(d)
    mesh = d.get("mesh") or {}
    if w is composed.WORKLOAD:          # no flat form: the kind and the mesh
        return {"kind": w.name, "mesh": dict(mesh)}
    return {"kind": w.name, **d[w.name], **{k: mesh[dim] for k, dim in w.legacy_keys.items() if dim in mesh}}


def resolve(d, where: str = "scenario"):
    """(model, cluster) of a scenario (a Scenario, or a validated mapping)."""
    from distlab.sim.models import model_from_spec
    if isinstance(d, Scenario):
        return model_from_spec(d.model_spec(), f"{where}: model"), d.cluster.cluster
    return model_from_spec(d["model"], f"{where}: model"), resolve_cluster(d)


def scenario_of(d, where: str | None = None, cluster=None) -> Scenario:
    """``d`` as a Scenario: a Scenario as it is (on ``cluster`` when given), a mapping or a path parsed
    (sim/scenario/parse.py ``from_dict``)."""
    if isinstance(d, Scenario):
        return d if cluster is None else from_dict(d.source, where, cluster)
    return from_dict(d, where, cluster)


def on_world(s, world_size: int, where: str = "scenario") -> Scenario:
    """``s`` (a Scenario; a mapping or a path is parsed here, once) on ``world_size`` ranks: itself when it has
    that many, else its mapping with that world size parsed again (the mesh completes on the world). For a real
    run on ``--nproc`` ranks (runtime/parallel/*/validate.py)."""
    if isinstance(s, Scenario):
        if s.cluster.world_size == world_size:
            return s
        d = copy.deepcopy(s.source)
    else:
        d = load(s, where if isinstance(s, dict) else None)
    d["world_size"] = world_size
    return from_dict(d, where)


def options_of(s: Scenario):
    """What the scenario's builder takes: its one parallelism's options, or a composition's Parallelisms
    (sim/parallel/parallelize.py)."""
    from distlab.sim.parallel.parallelize import Parallelisms
    return Parallelisms(**s.parallelisms) if s.workload == composed.WORKLOAD.name else s.parallelisms[s.workload]


def workload_record(s: Scenario):
    """The workload record that builds ``s`` (sim/workloads/registry.py, or the composition's)."""
    return composed.WORKLOAD if s.workload == composed.WORKLOAD.name else registry.get(s.workload)


def parts(d, where: str = "scenario", cluster=None) -> tuple:
    """(validated scenario mapping, workload, model, cluster, completed mesh, options) of a scenario (a
    Scenario, a mapping or a path), without building its plan: for a composition the options are a
    Parallelisms (sim/parallel/parallelize.py), what ``parallelize`` and the planner's estimate
    (sim/planner/composed.py) take. ``cluster``: a Cluster to use instead of the scenario's (sim/jobs/: a job on
    its nodes of a shared one)."""
    s = scenario_of(d, where, cluster)
    model, cluster = resolve(s, where)
    return s.source, workload_record(s), model, cluster, s.device_mesh(f"{where}: mesh"), options_of(s)


def build(d, where: str = "scenario", cluster=None) -> Result:
    """The Result of a scenario (a Scenario, or a mapping or path parsed here) before simulation: plan, mesh,
    model, cluster; no trace. ``cluster``: a Cluster to build on instead of the scenario's (sim/jobs/: a job on
    its nodes of a shared one)."""
    d, w, model, cluster, mesh, opts = parts(d, where, cluster)
    try:
        plan, info = w.build(model, mesh, opts, cluster)
    except ConfigError as e:
        raise under(e, where) from None
    if isinstance(d, dict) and d.get("fp8_recipe"):
        plan = with_fp8_recipe(plan, d["fp8_recipe"], cluster.gpu)
    return Result(d, w, opts, mesh, model, cluster, plan, info or {}, None)


def with_fp8_recipe(plan, recipe: str, gpu):
    """``plan`` with its float8 GEMM ops priced under ``recipe`` (sim/compute/fp8.py), as reproduce prices a run's."""
    from dataclasses import replace
    from distlab.sim.compute.kernels import FLOAT8, op_seconds
    from distlab.sim.plan import Compute, Plan
    priced: dict = {}

    def one(op):
        if not isinstance(op, Compute) or op.dtype != FLOAT8 or not op.gemms or op.seconds is not None:
            return op
        if id(op) not in priced:
            priced[id(op)] = (op, replace(op, seconds=op_seconds(op, gpu, recipe)))
        return priced[id(op)][1]
    return Plan([[one(op) for op in ops] for ops in plan.ranks], name=plan.name, meta=plan.meta)


def simulate(d, where: str = "scenario") -> Result:
    """Build and simulate one step of a scenario (a Scenario, a mapping or a path): the Result with trace, step
    summary and the workload's report."""
    from distlab.sim.kernel.engine import simulate as run
    s = scenario_of(d, where)
    result = build(s, where)
    slowdown = dict(s.stragglers)
    if any(r >= result.plan.world_size for r in slowdown):
        raise ConfigError(f"rank {max(slowdown)} is outside the world (0..{result.plan.world_size - 1})",
                          f"{where}: stragglers")
    result.trace = run(result.plan, result.cluster, record_transfers=False, slowdown=slowdown,
                       link_factors=dict(s.degraded_links) or None)
    result.summary = step_summary(result.trace)
    result.summary.update(throughput(result))
    if result.workload.report is not None:
        result.reports[result.workload.name] = result.workload.report(result)
    return result
