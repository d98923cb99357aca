"""Several jobs on one network: each alone on its nodes, then together, and what sharing cost each.

    outcome = simulate_jobs(spec.resolve(spec.load("jobs.yaml")))
    for run in outcome.runs: print(run.job.name, run.step_alone_s, run.step_shared_s, run.slowdown)

The rule. Every job runs its own plan on its own nodes (sim/jobs/fabric.py: its ranks' routes are the cluster's
links), all in one simpy environment over one Network: the flows of every job share links max-min fairly, as
any flows do (sim/kernel/network.py), so a job slows another only where their flows meet on a link. Jobs take
whole nodes, so the only links two jobs can both use are leaf switches' uplinks and downlinks to the spine
layer (with oversubscription > 1; a non-blocking fabric has none).

How it is computed, exactly and fast:
1. Alone: each job on its nodes with nothing else on the network (its step time alone; the symmetric
   reductions of sim/kernel/symmetry.py and subgroups.py apply where the job's placement keeps them:
   JobFabric.keeps). The links each job's traffic uses are listed too (every collective of the plan expanded).
2. Shared links: a link two jobs use. Jobs are joined through shared links into groups (connected components).
   Max-min fair rates of link-disjoint flow sets do not depend on each other, so a job in no group runs exactly
   as alone (its shared run is its alone run: tests/test_jobs.py checks against one simulation of all jobs).
3. Each group of jobs is simulated together, each job with the renamings that fix the links it shares
   (JobFabric.keeps: a renaming that moved its traffic off a shared link would equate ranks that sharing makes
   different) and without reusing collective durations on those links (the network is not otherwise idle).
   Every flow on a shared link is then simulated, and the bytes each job moves on each shared link counted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

from distlab.sim.collectives.context import Context
from distlab.sim.kernel.engine import Simulation
from distlab.sim.kernel.network import Network, Topology
from distlab.sim.kernel.symmetry import reductions
from distlab.sim.plan import Collective, Recv, Send
from distlab.sim.jobs.build import Job, build_jobs
from distlab.sim.jobs.fabric import JobFabric
from distlab.sim.jobs.steps import step_ends


@dataclass
class JobRun:
    """One job's result: step times alone and shared (seconds, one per step), the ranks its simulations ran
    (symmetric reductions: fewer than its world), the links it shares and the bytes it moved on each."""
    job: Job
    alone_s: list[float]
    shared_s: list[float]
    trace: object                       # the shared run's trace (its alone run where it shares nothing)
    simulated_alone: int
    simulated_shared: int
    shared_links: frozenset = frozenset()
    link_bytes: dict = field(default_factory=dict)     # link id -> bytes it moved there (shared links)
    trace_offset_s: float = 0.0         # the trace's time 0 is this many seconds into the run (an alone run)

    @property
    def step_alone_s(self) -> float:
        return sum(self.alone_s) / len(self.alone_s)

    @property
    def step_shared_s(self) -> float:
        return sum(self.shared_s) / len(self.shared_s)

    @property
    def slowdown(self) -> float:
        return self.step_shared_s / self.step_alone_s if self.step_alone_s > 0 else 1.0


@dataclass
class Outcome:
    """Every job's run, the groups simulated together (job indices), the topology (link names, capacities)."""
    spec: object
    runs: list[JobRun]
    groups: list[list[int]]
    topology: Topology


def simulate_jobs(spec, *, together: bool = False, symmetric: bool = True, protocol: str = "auto",
                  cache: dict | None = None) -> Outcome:
    """Simulate the jobs of ``spec`` (a ClusterSpec) alone and together (module docstring). ``together``: one
    simulation of every job, sharing or not, and ``symmetric=False``: every rank simulated (the references
    steps 2 and 3 are tested against). ``cache``: plans kept between calls (sim/jobs/build.py)."""
    topo = Topology(spec.cluster)
    jobs = build_jobs(spec, cache)
    cache = {} if cache is None else cache
    alone, uses = [], []
    for job in jobs:
        view = JobFabric(topo, job.nodes)
        key = ("alone", id(job.run_plan), view.pattern, tuple(sorted(job.slowdown.items())), symmetric, protocol)
        hit = cache.get(key)
        if hit is None or hit[0] is not job.run_plan:      # one simulation per plan and placement pattern
            ctx = Context(view, protocol)
            sym, classes = reductions(job.run_plan, view.cluster, view, slowdown=job.slowdown, protocol=protocol,
                                      ctx=ctx, symmetric=symmetric)
            run = _together(topo, [(job, view, ctx, sym, classes, 0.0, None)], protocol)[0]
            used = _links_used(job, ctx, sym, classes) & view.leaf_links if view.leaf_links else frozenset()
            hit = cache[key] = (job.run_plan, run, view.canonical(used))
        alone.append(hit[1])
        uses.append(view.translate(hit[2]))
    shared = [frozenset().union(*(u & v for k, v in enumerate(uses) if k != i)) for i, u in enumerate(uses)]
    groups = _groups(shared, uses) if not together else [list(range(len(jobs)))]
    runs: list = [None] * len(jobs)
    for group in groups:
        if len(group) == 1 and not together:
            i = group[0]
            trace, n = alone[i]
            ends = step_ends(trace, jobs[i].plan, jobs[i].spec.steps)
            runs[i] = JobRun(jobs[i], _times(ends, 0.0), _times(ends, 0.0), trace, n, n,
                             trace_offset_s=jobs[i].spec.start_s)
            continue
        parts, counters = [], []
        for i in group:
            view = JobFabric(topo, jobs[i].nodes, shared[i])
            ctx = Context(view, protocol)
            sym, classes = reductions(jobs[i].run_plan, view.cluster, view, slowdown=jobs[i].slowdown,
                                      protocol=protocol, busy=shared[i], ctx=ctx, check=False, symmetric=symmetric)
            counters.append(LinkBytes(shared[i], len(topo.names)))
            parts.append((jobs[i], view, ctx, sym, classes, jobs[i].spec.start_s, counters[-1]))
        for i, (trace, n), counter in zip(group, _together(topo, parts, protocol), counters):
            job = jobs[i]
            alone_ends = step_ends(alone[i][0], job.plan, job.spec.steps)
            ends = step_ends(trace, job.plan, job.spec.steps)
            runs[i] = JobRun(job, _times(alone_ends, 0.0), _times(ends, job.spec.start_s), trace, alone[i][1], n,
                             shared[i], counter.bytes())
    return Outcome(spec, runs, [g for g in groups if len(g) > 1], topo)


def _together(topo: Topology, parts: list, protocol: str) -> list:
    """Simulate ``parts`` (job, view, ctx, sym, classes, start, watch) on one network: [(trace, ranks simulated)]."""
    env = simpy.Environment()
    net = Network(env, topo)
    sims = [Simulation(job.run_plan, view.cluster, False, job.slowdown, None, protocol, sym, classes,
                       shared=(env, net, view, ctx), start_s=start, watch=watch)
            for job, view, ctx, sym, classes, start, watch in parts]
    for s in sims:
        s.start()
    env.run()
    return [(s.finish(), len(s.simulated)) for s in sims]


def _times(ends: list[float], start: float) -> list[float]:
    return [b - a for a, b in zip([start] + ends[:-1], ends)]


def _groups(shared: list[frozenset], uses: list[frozenset]) -> list[list[int]]:
    """Jobs joined through shared links (connected components), each job alone where it shares nothing."""
    parent = list(range(len(uses)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i
    owner: dict = {}
    for i, links in enumerate(uses):
        for link in links & shared[i]:
            j = owner.setdefault(link, i)
            parent[root(i)] = root(j)
    out: dict = {}
    for i in range(len(uses)):
        out.setdefault(root(i), []).append(i)
    return sorted(out.values())


def _links_used(job: Job, ctx: Context, sym, classes) -> frozenset:
    """Every link the job's traffic uses: its classes' units (all images), else every distinct collective and
    send of its plan expanded."""
    if classes is not None:
        return classes.links
    plan = job.plan
    ranks = [sym.representative] if sym else range(plan.world_size)
    seen, links = set(), set()
    for r in ranks:
        for op in plan.ranks[r]:
            if isinstance(op, Collective):
                group = plan.group_of(op)
                key = (op.op, group, op.bytes, op.algorithm, op.root, op.splits)
                if key not in seen:
                    seen.add(key)
                    _, _, steps = ctx.expand(op.op, group, op.bytes, op.algorithm, op.root, op.splits)
                    for pairs, _, _ in steps:
                        links.update(pairs.entry_link.tolist())
            elif isinstance(op, (Send, Recv)) and (r, op.peer) not in seen:
                seen.add((r, op.peer))
                links.update(ctx.topo.route(r, op.peer) if isinstance(op, Send) else ctx.topo.route(op.peer, r))
    return frozenset(links)


class LinkBytes:
    """Bytes one job puts on the ``watched`` links (a Simulation's ``watch``: called with every step it starts)."""

    def __init__(self, watched: frozenset, n_links: int):
        self.mask = np.zeros(n_links, dtype=bool)
        self.mask[list(watched)] = True
        self.total = np.zeros(n_links)
        self._seen: dict = {}

    def __call__(self, pairs, sizes, latency) -> None:
        scalar = np.isscalar(sizes)
        key = (id(pairs), float(sizes) if scalar else id(sizes))
        hit = self._seen.get(key)
        if hit is None or hit[0] is not pairs or (not scalar and hit[1] is not sizes):
            on = self.mask[pairs.entry_link] if len(pairs) else np.zeros(0, dtype=bool)
            w = np.broadcast_to(np.asarray(sizes, dtype=float), (len(pairs),))[pairs.entry_flow[on]]
            links, inverse = np.unique(pairs.entry_link[on], return_inverse=True)
            hit = self._seen[key] = (pairs, sizes, links, np.bincount(inverse, weights=w, minlength=len(links)))
        if len(hit[2]):
            self.total[hit[2]] += hit[3]

    def bytes(self) -> dict:
        return {int(link): float(self.total[link]) for link in np.flatnonzero(self.total)}
