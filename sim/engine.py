"""Run a plan on a simulated cluster: one simpy process per (rank, stream), collectives as rendezvous.

- Ops of one stream run in order; streams of a rank run concurrently; Record/Wait order them like CUDA events.
- A collective starts moving data when every member of its group has reached it (the n-th collective a rank
  issues on a group, in plan order, meets the n-th of every other member) and ends for all members together.
- Send/Recv between a pair match in order and move data once both are posted (rendezvous, as NCCL's).
- Compute takes ``seconds``, or the roofline max(flops / (TFLOP/s x mfu), bytes / HBM bandwidth), times the
  rank's slowdown factor (a straggler has factor > 1). On a cluster with ``cpu_cores``, that is work that the
  node's running compute ops share the cores for (sim.cores: processor sharing). While a collective is in
  flight on a rank (from its launch to its end), that rank's compute runs ``cluster.interference`` times slower
  (sim.cores: the factor, and why it does not count the core sharing twice).
A plan that cannot finish raises SimulationDeadlock naming every stuck rank, stream and op.
Where every rank is provably symmetric (sim/symmetry.py: the same program, whole-world collectives), one rank is
simulated and the trace reads its records as every rank's (trace.RankCopies): memory and time per op do not grow
with the world size; ``simulate(..., symmetric=False)`` runs every rank (the same trace, tests/test_symmetry.py).
"""
from __future__ import annotations

from collections import defaultdict, deque

import simpy

from distlab.sim.cluster import Cluster
from distlab.sim.collectives.context import Context
from distlab.sim.cores import SharedCores
from distlab.sim.errors import ConfigError, SimulationDeadlock
from distlab.sim.network import Network, Topology
from distlab.sim.plan import Collective, Compute, Plan, Record, Send, Wait, describe
from distlab.sim.symmetry import find_symmetry, representative_plan
from distlab.sim.trace import OpRecord, RankCopies, Trace, TransferRecord


def compute_seconds(op: Compute, cluster: Cluster) -> float:
    if op.seconds is not None:
        return op.seconds
    gpu = cluster.gpu
    return max(op.flops / (gpu.tflops * 1e12 * gpu.mfu), op.bytes / (gpu.hbm_GBps * 1e9))


def simulate(plan: Plan, cluster: Cluster, *, record_transfers: bool = True,
             slowdown: dict[int, float] | None = None, link_factors: dict[str, float] | None = None,
             check: bool = True, protocol: str = "auto", symmetric: bool = True) -> Trace:
    """Simulate ``plan`` on ``cluster`` (rank r runs on GPU r). Returns the trace (meta source=simulated).
    ``slowdown[rank]`` multiplies that rank's compute time (a straggler); ``link_factors[link name]``
    multiplies a link's bandwidth (a degraded link). ``check`` runs sim.check first (mismatched collectives).
    ``protocol``: NCCL's protocol for every collective (LL, LL128, Simple) or "auto" (the fastest; NCCL_PROTO
    and NCCL_ALGO, if set, limit the choice as they limit NCCL's tuner). ``symmetric``: where all ranks are
    provably symmetric (sim/symmetry.py), simulate one and copy its records (the same trace, much faster)."""
    sym = find_symmetry(plan, cluster, slowdown, record_transfers) if symmetric else None
    if check:
        from distlab.sim.check import assert_consistent
        assert_consistent(representative_plan(plan) if sym else plan)
    for rank, factor in (slowdown or {}).items():
        if not isinstance(rank, int) or not 0 <= rank < plan.world_size or not factor > 0:
            raise ConfigError(f"slowdown {{{rank!r}: {factor!r}}}: needs a rank in 0..{plan.world_size - 1} "
                              "and a factor > 0", "stragglers")
    if plan.world_size > cluster.world_size:
        raise ConfigError(f"the plan has {plan.world_size} ranks but cluster {cluster.name!r} has "
                          f"{cluster.world_size} GPUs ({cluster.nodes} nodes x {cluster.gpus_per_node})", "plan")
    sim = _Simulation(plan, cluster, record_transfers, slowdown or {}, link_factors, protocol, sym)
    return sim.run()


class _Simulation:
    def __init__(self, plan, cluster, record, slowdown, link_factors, protocol="auto", sym=None):
        self.plan, self.cluster, self.slowdown, self.sym = plan, cluster, slowdown, sym
        self.simulated = [sym.representative] if sym else range(plan.world_size)
        self.durations: dict = {}        # repeated collectives (sym.repeat_collectives): key -> (s, algorithm, flows)
        self.env = simpy.Environment()
        self.topo = Topology(cluster, link_factors)
        self.net = Network(self.env, self.topo, record=record)
        self.ctx = Context(self.topo, protocol)
        self.protocols_used: set[str] = set()
        cores = cluster.cpu_cores
        slow = cluster.interference
        self.cores = [SharedCores(self.env, cores, slow) for _ in range(cluster.nodes)] if cores else None
        no_cores = slow != 1 and not cores          # interference alone: each rank's own SharedCores
        self.gpus = {r: SharedCores(self.env, None, slow) for r in self.simulated} if no_cores else None
        self.members: dict = {}          # id(group) -> (group, its simulated members): interference
        self.records: list[OpRecord] = []
        self.waiting: dict[tuple[int, str], str] = {}          # (rank, stream) -> what it waits in
        self.events = [defaultdict(self.env.event) for _ in range(plan.world_size)]
        self.rendezvous: dict = {}
        self.sends: dict = defaultdict(deque)
        self.recvs: dict = defaultdict(deque)
        self.seq = self._sequence_numbers()

    def _sequence_numbers(self) -> dict:
        """(rank, op index) -> (group id, n, group): the n-th collective this rank issues on that group, in plan
        order. Groups are interned (one tuple and a small id per distinct group): nothing per op grows with the
        world size, and matching hashes an int, not a tuple of every member."""
        seq, counters, by_id, by_tuple = {}, defaultdict(int), {}, {}
        for r in self.simulated:
            for i, op in enumerate(self.plan.ranks[r]):
                if isinstance(op, Collective):
                    hit = by_id.get(id(op.group))
                    if hit is None:
                        g = self.plan.group_of(op)
                        hit = by_id[id(op.group)] = by_tuple.setdefault(g, (len(by_tuple), g))
                    gid, g = hit
                    seq[r, i] = (gid, counters[r, gid], g)
                    counters[r, gid] += 1
        return seq

    def run(self) -> Trace:
        for r in self.simulated:
            ops = self.plan.ranks[r]
            streams = list(dict.fromkeys(op.stream for op in ops))
            for s in streams:
                self.waiting[r, s] = "start"
                self.env.process(self._stream(r, s, [(i, op) for i, op in enumerate(ops) if op.stream == s]))
        self.env.run()
        stuck = [(r, s, what) for (r, s), what in sorted(self.waiting.items()) if what is not None]
        if stuck:
            raise SimulationDeadlock(stuck, self.env.now)
        self.records.sort(key=lambda o: (o.rank, o.index))
        if self.sym:
            self.records = RankCopies(self.records, self.sym.representative, self.sym.members)
        transfers = [TransferRecord(s, d, st, e, b, tuple(self.topo.names[l] for l in route))
                     for s, d, st, e, b, route in self.net.transfers]
        transfers.sort(key=lambda t: (t.start, t.end, t.src, t.dst))
        meta = {"source": "simulated", "plan": self.plan.name, "cluster": self.cluster.name,
                "world_size": self.plan.world_size, "flows": self.net.flows_done,
                "protocols": sorted(self.protocols_used)}
        return Trace(self.records, transfers, meta)

    def _stream(self, rank, stream, ops):
        env = self.env
        for index, op in ops:
            start = env.now
            self.waiting[rank, stream] = f"op #{index} {describe(op)}"
            rec = OpRecord(rank, stream, index, op.kind, getattr(op, "name", "") or op.kind, start, start)
            if isinstance(op, Compute):
                seconds = compute_seconds(op, self.cluster) * self.slowdown.get(rank, 1.0)
                pool = self._pool(rank)
                if pool:
                    yield from pool.run(seconds, rank)
                else:
                    yield env.timeout(seconds)
            elif isinstance(op, Record):
                ev = self.events[rank][op.event]
                if not ev.triggered:
                    ev.succeed()
                rec.name = op.event
            elif isinstance(op, Wait):
                rec.name = op.event
                self.waiting[rank, stream] = f"wait for event {op.event!r} (op #{index})"
                yield self.events[rank][op.event]
            elif isinstance(op, Collective):
                group = self.seq[rank, index][2]
                self.waiting[rank, stream] = f"{describe(op)} #{self.seq[rank, index][1]} on group {_fmt(group)}"
                launch, algorithm = yield from self._collective(rank, index, op)
                rec.bytes, rec.op, rec.group, rec.launch, rec.algorithm = op.bytes, op.op, group, launch, algorithm
                rec.name = op.name or op.op
            else:
                launch = yield from self._p2p(rank, op)
                rec.bytes, rec.launch, rec.peer = op.bytes, launch, op.peer
                rec.name = op.name or op.kind
            rec.end = env.now
            self.records.append(rec)
        self.waiting[rank, stream] = None

    def _collective(self, rank, index, op: Collective):
        gid, n, group = self.seq[rank, index]
        key = (gid, n)
        rv = self.rendezvous.get(key)
        if rv is None:
            rv = self.rendezvous[key] = {"op": op, "rank": rank, "arrived": 0, "done": self.env.event()}
        else:
            first = rv["op"]
            if (first.op, first.bytes, first.root) != (op.op, op.bytes, op.root):
                raise ConfigError(f"collective mismatch on group {_fmt(group)}, collective #{key[1]}: rank {rv['rank']} "
                                  f"calls {describe(first)}, rank {rank} calls {describe(op)}", "plan")
        rv["arrived"] += 1
        if rv["arrived"] == (1 if self.sym else len(group)):      # symmetric: all members arrive together
            del self.rendezvous[key]
            self.env.process(self._run_collective(rv, op, group))
        yield rv["done"]
        return rv["launch"], rv["algorithm"]

    def _pool(self, rank):
        """The SharedCores that times ``rank``'s compute: its node's cores, its own GPU (interference), or None."""
        if self.cores:
            return self.cores[self.cluster.node_of(rank)]
        return self.gpus[rank] if self.gpus else None

    def _communicating(self, group, delta: int) -> None:
        """A collective on ``group`` starts (+1) or ends (-1): interference on its simulated members' compute."""
        if self.cluster.interference == 1:
            return
        hit = self.members.get(id(group))           # groups are interned (_sequence_numbers): no tuple hashing
        if hit is None or hit[0] is not group:
            in_group = set(group)
            hit = self.members[id(group)] = (group, [r for r in self.simulated if r in in_group])
        for r in hit[1]:
            self._pool(r).communicating(r, delta)

    def _run_collective(self, rv, op, group):
        self._communicating(group, +1)
        rv["launch"] = start = self.env.now
        key = (op.op, op.bytes, op.algorithm, op.root, group) if self.sym and self.sym.repeat_collectives else None
        if key in self.durations:        # the network is otherwise idle: the same duration (sim/symmetry.py)
            seconds, rv["algorithm"], flows = self.durations[key]
            self.net.flows_done += flows
            yield self.env.timeout(seconds)
            self._communicating(group, -1)
            rv["done"].succeed()
            return
        flows = self.net.flows_done
        algorithm, protocol, step_iter = self.ctx.expand(op.op, group, op.bytes, op.algorithm, op.root)
        rv["algorithm"] = algorithm
        self.protocols_used.add(protocol)
        for pairs, sizes, latency in step_iter:
            yield self.net.transfer(pairs, sizes, latency)
        if key is not None:
            self.durations[key] = (self.env.now - start, algorithm, self.net.flows_done - flows)
        self._communicating(group, -1)
        rv["done"].succeed()

    def _p2p(self, rank, op):
        if isinstance(op, Send):
            pair, mine, theirs = (rank, op.peer), self.sends, self.recvs
        else:
            pair, mine, theirs = (op.peer, rank), self.recvs, self.sends
        if theirs[pair]:
            other_op, slot = theirs[pair].popleft()
            if other_op.bytes != op.bytes:
                raise ConfigError(f"send/recv mismatch between ranks {pair[0]} -> {pair[1]}: "
                                  f"{describe(other_op)} meets {describe(op)}", "plan")
            self.env.process(self._run_p2p(pair, op.bytes, slot))
        else:
            slot = {"done": self.env.event()}
            mine[pair].append((op, slot))
        yield slot["done"]
        return slot["launch"]

    def _run_p2p(self, pair, nbytes, slot):
        slot["launch"] = self.env.now
        pairs = self.ctx.pairs(("p2p", pair), lambda: [pair])
        yield self.net.transfer(pairs, float(nbytes))
        slot["done"].succeed()


def _fmt(group) -> str:
    g = list(group)
    if len(g) > 2 and g == list(range(g[0], g[-1] + 1)):
        return f"[{g[0]}..{g[-1]}]"
    return "[" + ",".join(map(str, g)) + "]"


def simulate_collective(op: str, nbytes: int, cluster: Cluster, algorithm: str = "auto", root: int = 0,
                        group: tuple[int, ...] | None = None, record_transfers: bool = False,
                        protocol: str = "auto") -> tuple[Trace, str]:
    """One collective over the whole cluster (or ``group``): (trace, algorithm used); the protocol used is in
    trace.meta["protocols"]."""
    n = cluster.world_size
    group = tuple(range(n)) if group is None else tuple(group)
    c = Collective(op=op, bytes=int(nbytes), group=group, algorithm=algorithm, root=root, name=op)
    plan = Plan([[c] if r in group else [] for r in range(n)], name=f"{op}-{nbytes}").validate()
    trace = simulate(plan, cluster, record_transfers=record_transfers, protocol=protocol)
    algos = {o.algorithm for o in trace.ops}
    return trace, algos.pop() if algos else algorithm


__all__ = ["simulate", "simulate_collective", "compute_seconds"]
