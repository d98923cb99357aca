"""The multi-job file: one cluster, its fabric, and the jobs that share it.

    name: two jobs on a 2:1 spine                  # optional
    cluster: dgx-h100                              # a preset or a cluster .yaml (relative to this file)
    nodes: 32                                      # the cluster's nodes
    fabric: {layout: fat-tree, nodes_per_leaf: 8, oversubscription: 2}   # optional: the inter-node network
    placement: packed                              # optional: the jobs' default policy (default packed)
    seed: 0                                        # optional: random placement's seed
    jobs:
      - name: llama-7b                             # optional (default: job 0, job 1, ...)
        scenario: ../scenarios/fsdp-llama-7b.yaml  # a scenario file or mapping (sim/scenario.py), or
        # plan: plan.json                          #   a plan file (its world size in whole nodes)
        nodes: 16                                  # optional: default the scenario's nodes
        placement: spread                          # packed, spread, random, or a list of node numbers
        start_s: 0.0                               # optional: when its first step starts
        steps: 2                                   # optional: steps it runs, one after another

A job runs on the file's cluster (its scenario's ``cluster`` is left aside) with ``nodes`` of its nodes; it takes
whole nodes. ``fabric``: ``layout`` is the inter-node fabric (rail-optimized or fat-tree), ``nodes_per_leaf``
the leaf switches' size and ``oversubscription`` the ratio of a leaf's down- to uplink bandwidth
(sim/kernel/network.py): with a ratio of 1 the fabric is non-blocking and jobs on separate nodes never meet.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, replace

from distlab.sim.cluster import FABRICS, Cluster, load_cluster
from distlab.sim.errors import ConfigError
from distlab.sim.plan import Plan

KEYS = ("name", "cluster", "nodes", "fabric", "placement", "seed", "jobs")
JOB_KEYS = ("name", "scenario", "plan", "nodes", "placement", "start_s", "steps")
FABRIC_KEYS = ("layout", "nodes_per_leaf", "oversubscription")
MAX_JOBS = 256
MAX_STEPS = 1000


@dataclass(frozen=True)
class JobSpec:
    """One job: a validated scenario mapping (``scenario``) or a plan file (``plan``), on ``nodes`` nodes placed by
    ``placement`` (a policy or a tuple of node numbers), starting at ``start_s``, ``steps`` steps long."""
    name: str
    scenario: dict | None
    plan: str | Plan | None             # a plan file, or (from Python) a Plan
    nodes: int | None
    placement: str | tuple[int, ...]
    start_s: float = 0.0
    steps: int = 1


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    cluster: Cluster
    jobs: tuple[JobSpec, ...]
    seed: int = 0
    where: str = "cluster file"


def load(path_or_dict, where: str | None = None) -> dict:
    """The file as a mapping (scenario and plan paths made absolute), checked (``check``)."""
    if isinstance(path_or_dict, dict):
        d, where, base = copy.deepcopy(path_or_dict), where or "cluster file", None
    else:
        from distlab.sim.io import load_yaml
        where, base = where or str(path_or_dict), os.path.dirname(os.path.abspath(path_or_dict))
        d = load_yaml(path_or_dict)
    if base is not None and isinstance(d, dict):
        if isinstance(d.get("cluster"), str) and d["cluster"].endswith((".yaml", ".yml")):
            d["cluster"] = os.path.join(base, d["cluster"])
        for job in d.get("jobs") or []:
            if isinstance(job, dict):
                for key in ("scenario", "plan"):
                    if isinstance(job.get(key), str):
                        job[key] = os.path.join(base, job[key])
    check(d, where)
    return d


def check(d, where: str) -> None:
    """Keys and value types of the file (the scenarios are checked when the jobs are resolved)."""
    if not isinstance(d, dict):
        raise ConfigError(f"a cluster file is a mapping with keys {', '.join(KEYS)}", where)
    _known(d, KEYS, where)
    for key in ("cluster", "jobs"):
        if key not in d:
            raise ConfigError(f"missing key {key!r}", where)
    jobs = d["jobs"]
    if not isinstance(jobs, list) or not jobs or len(jobs) > MAX_JOBS:
        raise ConfigError(f"must be a list of 1 to {MAX_JOBS} jobs, each a mapping with keys {', '.join(JOB_KEYS)}",
                          f"{where}: jobs")
    fabric = d.get("fabric") or {}
    if not isinstance(fabric, dict):
        raise ConfigError(f"must be a mapping with keys {', '.join(FABRIC_KEYS)}", f"{where}: fabric")
    _known(fabric, FABRIC_KEYS, f"{where}: fabric")
    if "layout" in fabric and fabric["layout"] not in FABRICS:
        raise ConfigError(f"unknown layout {fabric['layout']!r}; allowed: {', '.join(FABRICS)}",
                          f"{where}: fabric.layout")
    leaf = fabric.get("nodes_per_leaf", 0)
    if isinstance(leaf, bool) or not isinstance(leaf, int) or not 0 <= leaf <= 65536:
        raise ConfigError(f"{leaf!r} must be a whole number of nodes >= 0 (0 = no leaf switches)",
                          f"{where}: fabric.nodes_per_leaf")
    ratio = fabric.get("oversubscription", 1)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 1 <= ratio <= 1000:
        raise ConfigError(f"{ratio!r} must be a number >= 1 (1 = non-blocking; at most 1000)",
                          f"{where}: fabric.oversubscription")
    seed = d.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"{seed!r} must be a whole number", f"{where}: seed")
    _placement(d.get("placement", "packed"), f"{where}: placement", policy_only=True)
    for i, job in enumerate(jobs):
        at = f"{where}: jobs[{i}]"
        if not isinstance(job, dict):
            raise ConfigError(f"a job is a mapping with keys {', '.join(JOB_KEYS)}", at)
        _known(job, JOB_KEYS, at)
        if ("scenario" in job) == ("plan" in job):
            raise ConfigError("a job needs one of scenario (a file or mapping) or plan (a plan file)", at)
        if "plan" in job and not isinstance(job["plan"], (str, Plan)):
            raise ConfigError(f"{job['plan']!r} must be a plan file path", f"{at}.plan")
        if "nodes" in job and (isinstance(job["nodes"], bool) or not isinstance(job["nodes"], int)
                               or job["nodes"] < 1):
            raise ConfigError(f"{job['nodes']!r} must be a whole number of nodes >= 1", f"{at}.nodes")
        steps = job.get("steps", 1)
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
            raise ConfigError(f"{steps!r} must be a whole number of steps in 1..{MAX_STEPS}", f"{at}.steps")
        start = job.get("start_s", 0.0)
        if isinstance(start, bool) or not isinstance(start, (int, float)) or not 0 <= start < 1e6:
            raise ConfigError(f"{start!r} must be seconds >= 0 (and below 1e6)", f"{at}.start_s")
        if "placement" in job:
            _placement(job["placement"], f"{at}.placement")


def _known(d: dict, keys, where: str) -> None:
    for k in d:
        if k not in keys:
            raise ConfigError(f"unknown key {k!r}; allowed: {', '.join(keys)}", where)


def _placement(value, where: str, policy_only: bool = False) -> None:
    from distlab.sim.jobs.placement import POLICIES
    if isinstance(value, str) and value in POLICIES:
        return
    if not policy_only and isinstance(value, list) and value:
        return                           # node numbers: checked against the cluster when placed
    allowed = ", ".join(POLICIES) + ("" if policy_only else ", or a list of node numbers")
    raise ConfigError(f"unknown placement {value!r}; allowed: {allowed}", where)


def resolve(d: dict, where: str = "cluster file") -> ClusterSpec:
    """The cluster (with the fabric and node count of the file) and the jobs, their scenarios validated."""
    from distlab.sim import scenario as sc
    check(d, where)
    cluster = load_cluster(d["cluster"], d.get("nodes"))
    if cluster.inter_node is None and cluster.nodes > 1:
        raise ConfigError(f"cluster {cluster.name!r} has no inter-node network", f"{where}: cluster")
    fabric = d.get("fabric") or {}
    if fabric and cluster.inter_node is not None:
        inter = replace(cluster.inter_node, fabric=fabric.get("layout", cluster.inter_node.fabric),
                        nodes_per_leaf=fabric.get("nodes_per_leaf", cluster.inter_node.nodes_per_leaf),
                        oversubscription=float(fabric.get("oversubscription", cluster.inter_node.oversubscription)))
        cluster = replace(cluster, inter_node=inter)          # the values: checked above
    jobs = []
    for i, job in enumerate(d["jobs"]):
        at = f"{where}: jobs[{i}]"
        name = str(job.get("name", f"job {i}"))
        scenario = None
        if "scenario" in job:
            scenario = sc.load(job["scenario"], at + ".scenario" if isinstance(job["scenario"], dict) else None)
            if scenario.get("degraded_links"):
                raise ConfigError("degraded_links name one cluster's links; a job in a cluster file cannot have "
                                  "them", f"{at}.scenario")
        nodes = job.get("nodes", scenario.get("nodes", 1) if scenario is not None else None)
        placement = job.get("placement", d.get("placement", "packed"))
        if isinstance(placement, list):
            placement = tuple(placement)
            if nodes is not None and "nodes" in job and len(placement) != nodes:
                raise ConfigError(f"lists {len(placement)} nodes but nodes is {nodes}", f"{at}.placement")
            nodes = len(placement)
        jobs.append(JobSpec(name, scenario, job.get("plan"), nodes, placement, float(job.get("start_s", 0.0)),
                            int(job.get("steps", 1))))
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"two jobs are named {dup!r}; names are unique", f"{where}: jobs")
    return ClusterSpec(str(d.get("name", os.path.basename(where))), cluster, tuple(jobs), int(d.get("seed", 0)), where)
