"""What the ranks' hosts do beside the network, for the engine (sim/kernel/engine.py): where compute runs, and how a
collective and the compute around it slow each other.

- Compute runs on a pool (sim.cores.SharedCores): with ``cpu_cores``, the node's cores, shared by its running
  compute ops (processor sharing); without, the rank's own GPU when an interference factor needs one; else none.
- ``interference`` I: while a collective is in flight on a rank (launch to end), that rank's compute runs I
  times slower (sim.cores: the factor, and why it does not count the core sharing twice).
- ``comm_interference`` K: while compute runs on a collective's members' pools, the collective progresses K
  times slower (sim.cores.CommSlowdown: the network time it lost is owed at its end).
- ``compute_jitter`` J > 0: a collective starts e_n sqrt(J mu) after its last member reached it (sim/kernel/skew.py:
  the expected last arrival of n ranks whose compute of mu seconds varies).
- ``comm_cpu_s`` / ``comm_cpu_s_per_byte`` (CPU clusters): a collective carries CPU work per member rank (a
  send/recv: on both ends), run as a job on that rank's node's cores beside the compute ops; it ends when both
  its network part and every member's CPU work are done (sim.cores.comm_cpu_seconds).

A collective's life here: ``arrive`` (the skew wait), ``launch`` (in flight: I on, K's account opened, CPU work
started), its network part (the engine's), ``land`` (K's debt paid, CPU work awaited, I off).
"""
from __future__ import annotations

from collections import defaultdict

from distlab.sim.kernel.cores import CommSlowdown, SharedCores, comm_cpu_seconds
from distlab.sim.kernel.skew import arrival_skew


class Hosts:
    """The pools of the ``simulated`` ranks of ``cluster`` in simpy ``env``, and the effects above."""

    def __init__(self, env, cluster, simulated):
        self.env, self.cluster, self.simulated = env, cluster, simulated
        cores, slow = cluster.cpu_cores, cluster.interference
        self.cores = [SharedCores(env, cores, slow) for _ in range(cluster.nodes)] if cores else None
        self.comm_slow = cluster.comm_interference
        no_cores = (slow != 1 or self.comm_slow != 1) and not cores   # interference alone: each rank's own pool
        self.gpus = {r: SharedCores(env, None, slow) for r in simulated} if no_cores else None
        self.jitter = cluster.compute_jitter
        self.computed: dict = defaultdict(float)       # rank -> compute seconds since its last collective
        self.members: dict = {}          # id(group) -> (group, its simulated members)

    def pool(self, rank):
        """The SharedCores that times ``rank``'s compute: its node's cores, its own GPU (interference), or None."""
        if self.cores:
            return self.cores[self.cluster.node_of(rank)]
        return self.gpus[rank] if self.gpus else None

    def compute(self, rank, seconds: float):
        """``rank`` computes ``seconds`` of work (a simpy generator), on its pool if it has one."""
        if self.jitter:
            self.computed[rank] += seconds
        pool = self.pool(rank)
        if pool:
            yield from pool.run(seconds, rank)
        else:
            yield self.env.timeout(seconds)

    def arrive(self, group):
        """Every member reached a collective on ``group`` (a simpy generator): wait until the last one really
        arrives, mu = the most compute any member did since its previous collective; restarts their counts."""
        if not self.jitter:
            return
        members = self._simulated_members(group)
        mu = max(self.computed[r] for r in members)
        for r in members:
            self.computed[r] = 0.0
        skew = arrival_skew(self.jitter, mu, len(group))
        if skew:
            yield self.env.timeout(skew)

    def launch(self, group, nbytes: int) -> tuple:
        """A collective of ``nbytes`` on ``group`` starts: what ``land`` needs (its CommSlowdown or None, its
        members' CPU jobs)."""
        self._communicating(group, +1)
        return self._comm_slowdown(group), self.cpu_jobs(nbytes, group)

    def land(self, group, flight: tuple):
        """Its network part is done (a simpy generator): it ends when K's debt and the CPU work are done."""
        slowed, cpu_jobs = flight
        if slowed:
            yield from slowed.finish()
        if cpu_jobs:
            yield self.env.all_of(cpu_jobs)
        self._communicating(group, -1)

    def cpu_jobs(self, nbytes: int, ranks) -> list:
        """A collective or send/recv of ``nbytes`` on ``ranks`` starts: its CPU work on each one's node cores, as
        simpy processes (none without cpu_cores or with comm_cpu_s = comm_cpu_s_per_byte = 0; every rank is
        simulated then: sim/kernel/symmetry.py and sim/kernel/subgroups.py refuse cpu_cores)."""
        seconds = comm_cpu_seconds(self.cluster, nbytes)
        if not seconds or not self.cores:
            return []
        return [self.env.process(self.pool(r).run(seconds, ("comm", r))) for r in ranks]

    def _simulated_members(self, group) -> list:
        hit = self.members.get(id(group))           # groups are interned (engine._sequence_numbers): no hashing
        if hit is None or hit[0] is not group:
            in_group = set(group)
            hit = self.members[id(group)] = (group, [r for r in self.simulated if r in in_group])
        return hit[1]

    def _communicating(self, group, delta: int) -> None:
        """A collective on ``group`` starts (+1) or ends (-1): interference on its simulated members' compute."""
        if self.cluster.interference == 1:
            return
        for r in self._simulated_members(group):
            self.pool(r).communicating(r, delta)

    def _comm_slowdown(self, group) -> CommSlowdown | None:
        """Its CommSlowdown over its simulated members' pools (None if K = 1)."""
        if self.comm_slow == 1:
            return None
        pools = {id(p): p for p in map(self.pool, self._simulated_members(group))}
        return CommSlowdown(self.env, list(pools.values()), self.comm_slow)
