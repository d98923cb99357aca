"""What-ifs of a job mix, each an independent simulation (run together through sim/workers.py):

    rows = sweep(d, {"placement": ["packed", "spread"], "oversubscription": [1, 2, 4]})   # every combination
    m = matrix(d)          # m["slowdown"][i][j]: job i's slowdown beside job j alone (on the nodes of the full mix)
    c = capacity(d, 1.1)   # the most GPUs the mix fills (job by job) while every job stays within 1.1x

``d`` is a cluster file's mapping (sim/jobs/spec.py). Sweep keys: ``placement`` (the policy of every job that
does not list its nodes), ``oversubscription``, ``nodes_per_leaf`` and ``layout`` (rail-optimized or fat-tree;
the fabric's keys) and ``seed``. The interference matrix places every job as the whole mix places it, then runs
each pair on those nodes with nothing else. The capacity search adds the mix's jobs one at a time, in file
order and round again (each placed by its policy), and simulates each count until the jobs no longer fit the
cluster: the answer is the GPUs of the last count before the worst slowdown (shared / alone) first passes the
threshold.
"""
from __future__ import annotations

import copy
import itertools

from distlab.sim.errors import ConfigError
from distlab.sim.jobs import spec as specs
from distlab.sim.workers import run_many

SWEEP_KEYS = ("placement", "oversubscription", "nodes_per_leaf", "layout", "seed")


def case(d: dict) -> dict:
    """Simulate one cluster file mapping: its `--json` object (sim/jobs/report.py). Module-level: workers run it."""
    from distlab.sim.jobs.report import outcome_json
    from distlab.sim.jobs.together import simulate_jobs
    return outcome_json(simulate_jobs(specs.resolve(d, d.get("name", "cluster file"))))


def with_values(d: dict, values: dict) -> dict:
    """``d`` with sweep keys set (a copy)."""
    d = copy.deepcopy(d)
    for key, value in values.items():
        if key == "placement":
            d["placement"] = value
            for job in d["jobs"]:
                if not isinstance(job.get("placement"), list):
                    job["placement"] = value
        elif key == "seed":
            d["seed"] = value
        elif key in ("oversubscription", "nodes_per_leaf", "layout"):
            d["fabric"] = {**(d.get("fabric") or {}), key: value}
        else:
            raise ConfigError(f"unknown sweep key {key!r}; allowed: {', '.join(SWEEP_KEYS)}", "--sweep")
    specs.check(d, f"--sweep {values}")
    return d


def sweep(d: dict, keys: dict, **run) -> list[dict]:
    """One result per combination of ``keys`` (name -> values): the combination and the case's result."""
    combos = [dict(zip(keys, values)) for values in itertools.product(*keys.values())]
    cases = [with_values(d, combo) for combo in combos]
    return [{"values": combo, **result} for combo, result in zip(combos, run_many(case, cases, **run))]


def matrix(d: dict, **run) -> dict:
    """Each pair of jobs on the nodes the whole mix gives them, alone together: job i's slowdown beside job j."""
    from distlab.sim.jobs.build import placements
    spec = specs.resolve(d)
    placed = placements(spec)
    names = [job.name for job in spec.jobs]
    pairs = [(i, j) for i in range(len(placed)) for j in range(i + 1, len(placed))]
    cases = []
    for i, j in pairs:
        pair = copy.deepcopy(d)
        pair["jobs"] = [{**copy.deepcopy(d["jobs"][k]), "placement": list(placed[k]), "nodes": len(placed[k]),
                         "name": names[k]} for k in (i, j)]
        cases.append(pair)
    m = [[1.0] * len(names) for _ in names]
    for (i, j), result in zip(pairs, run_many(case, cases, **run)):
        m[i][j], m[j][i] = result["jobs"][0]["slowdown"], result["jobs"][1]["slowdown"]
    return {"jobs": names, "slowdown": m}


def capacity(d: dict, threshold: float, **run) -> dict:
    """The mix's jobs added one at a time until they no longer fit (module docstring)."""
    if not threshold >= 1:
        raise ConfigError(f"{threshold!r} must be a slowdown >= 1 (1.1 = 10% slower than alone)", "--capacity")
    from distlab.sim.jobs.build import node_counts
    spec = specs.resolve(d)
    sizes = node_counts(spec)
    counts, used = [], 0
    for k in itertools.count():
        used += sizes[k % len(sizes)]
        if used > spec.cluster.nodes:
            break
        counts.append(k + 1)
    cases = []
    for n in counts:
        c = copy.deepcopy(d)
        c["jobs"] = []
        for k in range(n):
            job = copy.deepcopy(d["jobs"][k % len(d["jobs"])])
            if isinstance(job.get("placement"), list):
                job.pop("placement")             # a listed placement cannot repeat: the default policy places it
                job["nodes"] = sizes[k % len(sizes)]
            job["name"] = f"{job.get('name', f'job {k % len(sizes)}')}#{k // len(sizes) + 1}"
            c["jobs"].append(job)
        cases.append(c)
    rows = []
    for n, result in zip(counts, run_many(case, cases, **run)):
        gpus = sum(len(job["nodes"]) for job in result["jobs"]) * spec.cluster.gpus_per_node
        rows.append({"jobs": n, "gpus": gpus, "worst_slowdown": result["worst_slowdown"],
                     "mean_slowdown": sum(j["slowdown"] for j in result["jobs"]) / n})
    first = next((k for k, r in enumerate(rows) if r["worst_slowdown"] > threshold), len(rows))
    best = rows[first - 1] if first else None
    return {"threshold": threshold, "rows": rows, "gpus": best["gpus"] if best else 0,
            "jobs": best["jobs"] if best else 0, "cluster_gpus": spec.cluster.world_size}
