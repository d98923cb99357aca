"""From a cluster file's jobs to what is simulated: each job's nodes (sim/jobs/placement.py), its plan on a
cluster of its own nodes (a scenario built by its workload, sim/scenario.py, or a plan file), and that plan
repeated for its steps (sim/jobs/steps.py).

    jobs = build_jobs(spec)           # spec: sim/jobs/spec.ClusterSpec
    jobs[0].nodes, jobs[0].plan.world_size, jobs[0].label

Jobs with the same scenario on the same number of nodes share one plan (built once: a plan of 1000s of ranks
takes seconds to build).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from distlab.sim.errors import ConfigError
from distlab.sim.jobs.placement import place
from distlab.sim.jobs.steps import repeat
from distlab.sim.plan import Plan


@dataclass
class Job:
    """A job ready to simulate: ``plan`` is one step, ``run_plan`` its steps one after another."""
    spec: object                       # sim/jobs/spec.JobSpec
    nodes: tuple[int, ...]
    plan: Plan
    run_plan: Plan
    label: str                         # what runs: "llama-7b fsdp (128 ranks)"
    workload: str                      # fsdp, ddp, tp, ... or "plan"
    slowdown: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def world_size(self) -> int:
        return self.plan.world_size


def build_jobs(spec, cache: dict | None = None) -> list[Job]:
    """Place and build every job of ``spec``; ``cache`` (optional) keeps plans between calls (a sweep)."""
    cluster, g = spec.cluster, spec.cluster.gpus_per_node
    cache = {} if cache is None else cache
    plans = [_plan(job, cluster, i, spec.where, cache) for i, job in enumerate(spec.jobs)]
    requests = []
    for i, (job, (plan, _, _)) in enumerate(zip(spec.jobs, plans)):
        nodes = plan.world_size // g
        if job.nodes is not None and job.nodes != nodes:
            raise ConfigError(f"the plan has {plan.world_size} ranks, {nodes} nodes, but the job asks for {job.nodes}",
                              f"{spec.where}: jobs[{i}].nodes")
        requests.append((nodes, job.placement))
    leaf = cluster.inter_node.nodes_per_leaf if cluster.inter_node is not None else 0
    placed = place(requests, cluster.nodes, leaf, spec.seed, [j.name for j in spec.jobs], f"{spec.where}: jobs")
    out = []
    for job, nodes, (plan, label, workload) in zip(spec.jobs, placed, plans):
        slowdown = (job.scenario or {}).get("stragglers") or {}
        if any(r >= plan.world_size for r in slowdown):
            raise ConfigError(f"rank {max(slowdown)} is outside the job (0..{plan.world_size - 1})",
                              f"{spec.where}: jobs: {job.name}: stragglers")
        key = ("repeat", id(plan), job.steps)
        hit = cache.get(key)
        if hit is None or hit[0] is not plan:
            hit = cache[key] = (plan, repeat(plan, job.steps))
        out.append(Job(job, tuple(nodes), plan, hit[1], label, workload, dict(slowdown)))
    return out


def node_counts(spec) -> list[int]:
    """The nodes each job of ``spec`` takes (its ``nodes``, its listed placement, its scenario's nodes, or its
    plan's world in whole nodes), without building its plan."""
    out = []
    for job in spec.jobs:
        if job.nodes is not None:
            out.append(job.nodes)
        else:
            world = (Plan.load(job.plan) if isinstance(job.plan, str) else job.plan).world_size
            out.append(world // spec.cluster.gpus_per_node)
    return out


def placements(spec) -> list[tuple[int, ...]]:
    """The nodes of each job of ``spec`` (sim/jobs/placement.py), without building a plan."""
    cluster = spec.cluster
    leaf = cluster.inter_node.nodes_per_leaf if cluster.inter_node is not None else 0
    requests = list(zip(node_counts(spec), [j.placement for j in spec.jobs]))
    return place(requests, cluster.nodes, leaf, spec.seed, [j.name for j in spec.jobs], f"{spec.where}: jobs")


def _plan(job, cluster, i: int, where: str, cache: dict) -> tuple[Plan, str, str]:
    """(one step's plan, label, workload) of a job, on a cluster of its own nodes."""
    at = f"{where}: jobs[{i}]"
    g = cluster.gpus_per_node
    if job.plan is not None:
        key = ("plan", job.plan if isinstance(job.plan, str) else id(job.plan))
        if key not in cache:
            plan = Plan.load(job.plan) if isinstance(job.plan, str) else job.plan.validate(f"{at}.plan")
            if plan.world_size % g:
                raise ConfigError(f"the plan has {plan.world_size} ranks, not whole nodes of {g} GPUs; a job takes "
                                  "whole nodes", f"{at}.plan")
            cache[key] = (plan, f"{plan.name} ({plan.world_size} ranks)", "plan")
        return cache[key]
    d = dict(job.scenario)
    nodes = job.nodes if job.nodes is not None else d.get("nodes", 1)
    world = d.get("world_size")
    if world is not None and world != nodes * g:
        raise ConfigError(f"world_size {world} is not {nodes} whole nodes of {g} GPUs; a job takes whole nodes",
                          f"{at}.scenario")
    if nodes > cluster.nodes:
        raise ConfigError(f"the job needs {nodes} nodes but the cluster has {cluster.nodes}", f"{at}.nodes")
    key = ("scenario", json.dumps({k: v for k, v in d.items() if k not in ("cluster", "nodes", "name")},
                                  sort_keys=True, default=str), nodes)
    if key not in cache:
        from distlab.sim import scenario as sc
        d.pop("world_size", None)
        d["nodes"] = nodes
        s = sc.from_dict(d, at, cluster=cluster.with_nodes(nodes) if nodes != cluster.nodes else cluster)
        result = sc.build(s, at)             # the Scenario on the job's nodes of the shared cluster
        words = f"{result.model.name} {result.workload.name} ({result.plan.world_size} ranks)"
        cache[key] = (result.plan, words, result.workload.name)
    return cache[key]
