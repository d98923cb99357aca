"""What `distlab cluster` prints about a multi-job simulation: a row per job, the contended links, JSON.

    rows = job_rows(outcome)                  # job, what, nodes, leaves, alone, shared, slowdown, ranks simulated
    links = contended_links(outcome, top=5)   # the shared links with the most bytes, and whose bytes they are
    d = outcome_json(outcome)                 # the `--json` object (schema distlab.cluster/1)

Step times are means over a job's steps (each step: from the end of the previous one to the end of its last op
on any rank, sim/jobs/steps.py); slowdown = shared / alone. A link is contended when the flows of two or more
jobs use it; its bytes are what each job put on it over the whole run (the wire bytes of the protocol).
"""
from __future__ import annotations


def compact(nodes) -> str:
    """``(0, 1, 2, 3, 8, 9)`` -> ``'0-3,8-9'`` (the order kept: a listed placement shows as written)."""
    parts, start, prev = [], None, None
    for n in list(nodes) + [None]:
        if start is not None and (n is None or n != prev + 1):
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = None
        if n is not None and start is None:
            start = n
        prev = n
    return ",".join(parts)


def leaves(outcome, run) -> list[int]:
    topo = outcome.topology
    return sorted({topo.leaf_of(n) for n in run.job.nodes} - {None})


def fabric_words(cluster) -> str:
    inter = cluster.inter_node
    if inter is None or cluster.nodes == 1:
        return "one node"
    words = f"{inter.fabric}, {inter.nics_per_node} x {inter.bandwidth_GBps:g} GB/s NICs per node"
    if inter.nodes_per_leaf and inter.oversubscription > 1:
        words += f", leaves of {inter.nodes_per_leaf} nodes, {inter.oversubscription:g}:1 to the spine"
    elif inter.oversubscription > 1:
        words += f", {inter.oversubscription:g}:1 node uplinks"
    else:
        words += ", non-blocking"
    return words


def short(text: str, width: int = 18) -> str:
    """``text`` in ``width`` columns, cut between its words around an ellipsis (sim/output.py shorten)."""
    from distlab.sim.output import shorten
    return shorten(text, width)


def job_rows(outcome) -> list[list]:
    """A row per job (JOB_COLUMNS); long node lists are cut (``--json`` has them whole)."""
    rows = []
    for run in outcome.runs:
        job = run.job
        rows.append([short(job.name), job.workload, job.world_size, short(compact(job.nodes)),
                     short(compact(leaves(outcome, run)) or "-", 10), f"{job.spec.start_s * 1e3:g}", job.spec.steps,
                     f"{run.step_alone_s * 1e3:.3f}", f"{run.step_shared_s * 1e3:.3f}", f"{run.slowdown:.3f}x",
                     f"{run.simulated_alone}/{run.simulated_shared}"])
    return rows


JOB_COLUMNS = ["job", "what", "GPUs", "nodes", "leaves", "start ms", "steps", "alone ms", "shared ms", "slowdown",
               "simulated"]


def contended_links(outcome, top: int = 5) -> list[dict]:
    """The ``top`` links by bytes among those two or more jobs used, with each job's bytes."""
    topo = outcome.topology
    by_link: dict = {}
    for run in outcome.runs:
        for link, nbytes in run.link_bytes.items():
            by_link.setdefault(link, {})[run.job.name] = nbytes
    rows = [{"link": topo.names[link], "capacity_GBps": float(topo.capacity[link]) / 1e9,
             "bytes": sum(jobs.values()), "bytes_by_job": dict(sorted(jobs.items(), key=lambda kv: -kv[1]))}
            for link, jobs in by_link.items() if len(jobs) > 1]
    rows.sort(key=lambda r: (-r["bytes"], r["link"]))
    return rows[:top]


def link_rows(links: list[dict], shown: int = 3) -> list[list]:
    """A row per contended link: the ``shown`` jobs with the most bytes on it, then how many more."""
    rows = []
    for r in links:
        jobs = list(r["bytes_by_job"].items())
        words = ", ".join(f"{short(name, 14)} {b / 1e9:.3f}" for name, b in jobs[:shown])
        rows.append([r["link"], f"{r['capacity_GBps']:g}", f"{r['bytes'] / 1e9:.3f}",
                     words + (f", +{len(jobs) - shown} more" if len(jobs) > shown else "")])
    return rows


LINK_COLUMNS = ["link", "GB/s", "GB moved", "by job (GB)"]


def run_json(outcome, run) -> dict:
    job = run.job
    return {"name": job.name, "workload": job.workload, "label": job.label, "nodes": list(job.nodes),
            "leaves": leaves(outcome, run), "world_size": job.world_size, "start_s": job.spec.start_s,
            "steps": job.spec.steps, "step_alone_s": run.step_alone_s, "step_shared_s": run.step_shared_s,
            "slowdown": run.slowdown, "steps_alone_s": run.alone_s, "steps_shared_s": run.shared_s,
            "ranks_simulated_alone": run.simulated_alone, "ranks_simulated_shared": run.simulated_shared,
            "shared_links": sorted(outcome.topology.names[link] for link in run.shared_links)}


def outcome_json(outcome, top: int = 5) -> dict:
    spec, c = outcome.spec, outcome.spec.cluster
    inter = c.inter_node
    names = [run.job.name for run in outcome.runs]
    return {"name": spec.name, "cluster": c.name, "nodes": c.nodes, "gpus_per_node": c.gpus_per_node,
            "world_size": c.world_size,
            "fabric": {"layout": inter.fabric if inter else None,
                       "nodes_per_leaf": inter.nodes_per_leaf if inter else 0,
                       "oversubscription": inter.oversubscription if inter else 1.0},
            "jobs": [run_json(outcome, run) for run in outcome.runs],
            "groups": [[names[i] for i in g] for g in outcome.groups],
            "contended_links": contended_links(outcome, top),
            "worst_slowdown": max(run.slowdown for run in outcome.runs)}
