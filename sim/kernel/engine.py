"""Run a plan on a simulated cluster: one simpy process per (rank, stream), collectives as rendezvous.

- Ops of one stream run in order; streams of a rank run concurrently; Record/Wait order them like CUDA events.
- A collective starts moving data when every member of its group has reached it (the n-th collective a rank
  issues on a process group, in plan order, meets the n-th of every other member) and ends for all members
  together. The collectives of one process group (its ranks and name) run in issue order, one at a time on
  NCCL, at most two on Gloo; different groups overlap (sim/kernel/communicators.py).
- Send/Recv between a pair match in order and move data once both are posted (rendezvous, as NCCL's), on the
  pair's own communicator: they never wait for a process group's collectives (sim/kernel/communicators.py).
- Compute takes ``seconds``, or its kernels' times (sim/compute.py: GEMMs by shape on the GPU's efficiency
  curve, FlashAttention, memory-bound bytes), or the roofline max(flops / (TFLOP/s x mfu), bytes / HBM
  bandwidth), plus launch_s per kernel (or per host-dispatched op: ``launches``), times the
  rank's slowdown factor (a straggler has factor > 1). Where compute runs (a node's shared cores, a GPU) and
  how a collective and the compute beside it slow each other (interference both ways, arrival skew, gloo's CPU
  work on CPU clusters) is sim/kernel/hosts.py's.
A plan that cannot finish raises SimulationDeadlock naming every stuck rank, stream and op.
Where every rank is provably symmetric (sim/kernel/symmetry.py: the same program, whole-world collectives), one rank is
simulated and the trace reads its records as every rank's (trace.RankCopies): memory and time per op do not grow
with the world size. Where ranks fall into classes under node shifts and local rotations (sim/kernel/subgroups.py: TP x
DP, FSDP x TP, PP x TP x DP), one rank per class is simulated, with the network traffic the argument there
requires; a collective a stream hands over and waits for at once runs in the waiting stream (sim/kernel/inline.py).
``simulate(..., symmetric=False)`` runs every rank, op by op (the same trace, tests/test_symmetry.py).
"""
from __future__ import annotations

from collections import defaultdict, deque

import simpy

from distlab.sim.cluster import Cluster
from distlab.sim.collectives.context import Context
from distlab.sim.compute import op_seconds
from distlab.sim.errors import ConfigError, SimulationDeadlock
from distlab.sim.kernel.communicators import Turns, slots_for
from distlab.sim.kernel.hosts import Hosts
from distlab.sim.kernel.network import Network, Topology
from distlab.sim.plan import Collective, Compute, Plan, Record, Send, Wait, describe
from distlab.sim.kernel.inline import fuse
from distlab.sim.kernel.solo import run_steps
from distlab.sim.kernel.symmetry import reductions
from distlab.sim.trace import OpRecord, RankCopies, Trace, TransferRecord


def compute_seconds(op: Compute, cluster: Cluster) -> float:
    """The op's compute time on the cluster's GPU: sim/compute.py (GEMMs by shape, attention, memory-bound)."""
    return op_seconds(op, cluster.gpu)


def simulate(plan: Plan, cluster: Cluster, *, record_transfers: bool = True,
             slowdown: dict[int, float] | None = None, link_factors: dict[str, float] | None = None,
             check: bool = True, protocol: str = "auto", symmetric: bool = True) -> Trace:
    """Simulate ``plan`` on ``cluster`` (rank r runs on GPU r). Returns the trace (meta source=simulated).
    ``slowdown[rank]`` multiplies that rank's compute time (a straggler); ``link_factors[link name]``
    multiplies a link's bandwidth (a degraded link). ``check`` runs sim.check first (mismatched collectives).
    ``protocol``: NCCL's protocol for every collective (LL, LL128, Simple) or "auto" (the fastest; NCCL_PROTO
    and NCCL_ALGO, if set, limit the choice as they limit NCCL's tuner). ``symmetric``: where all ranks are
    provably symmetric (sim/kernel/symmetry.py), simulate one and copy its records (the same trace, much faster)."""
    sym, classes = reductions(plan, cluster, None, slowdown=slowdown, record_transfers=record_transfers,
                              link_factors=link_factors, protocol=protocol, symmetric=symmetric, check=check)
    for rank, factor in (slowdown or {}).items():
        if not isinstance(rank, int) or not 0 <= rank < plan.world_size or not factor > 0:
            raise ConfigError(f"slowdown {{{rank!r}: {factor!r}}}: needs a rank in 0..{plan.world_size - 1} "
                              "and a factor > 0", "stragglers")
    if plan.world_size > cluster.world_size:
        raise ConfigError(f"the plan has {plan.world_size} ranks but cluster {cluster.name!r} has "
                          f"{cluster.world_size} GPUs ({cluster.nodes} nodes x {cluster.gpus_per_node})", "plan")
    sim = _Simulation(plan, cluster, record_transfers, slowdown or {}, link_factors, protocol, sym, classes)
    return sim.run()


class _Simulation:
    """One plan's simulation. Several may share one simpy environment and network (``shared``: (env, network,
    the plan's view of the topology, its Context), sim/jobs/): each starts its streams at ``start_s``
    (``start``), the environment runs once, each collects its own records (``finish``). ``watch(pairs, sizes)``,
    if given, sees every step this plan puts on the network (the bytes it moves on shared links)."""

    def __init__(self, plan, cluster, record, slowdown, link_factors, protocol="auto", sym=None, classes=None,
                 shared=None, start_s: float = 0.0, watch=None):
        self.plan, self.cluster, self.slowdown, self.sym, self.classes = plan, cluster, slowdown, sym, classes
        self.simulated = [sym.representative] if sym else classes.reps if classes else range(plan.world_size)
        self.durations: dict = {}        # reused collective durations: key -> (s, algorithm, flows)
        self.clock: dict = {}            # (rank, stream) -> end of its last op run inline (sim/kernel/inline.py)
        self.start_s, self.watch = start_s, watch
        if shared is None:
            self.env = simpy.Environment()
            self.topo = Topology(cluster, link_factors)
            self.net = Network(self.env, self.topo, record=record)
            self.ctx = Context(self.topo, protocol)
        else:
            self.env, self.net, self.topo, self.ctx = shared
        self.protocols_used: set[str] = set()
        self.hosts = Hosts(self.env, cluster, self.simulated)
        self.records: list[OpRecord] = []
        self.waiting: dict[tuple[int, str], str] = {}          # (rank, stream) -> what it waits in
        self.events = [defaultdict(self.env.event) for _ in range(plan.world_size)]
        self.rendezvous: dict = {}
        self.sends: dict = defaultdict(deque)
        self.recvs: dict = defaultdict(deque)
        self.turns = Turns(self.env, slots_for(cluster))              # per process group (communicators.py)
        self.seq = self._sequence_numbers()

    def _sequence_numbers(self) -> dict:
        """(rank, op index) -> (group id, n, group): the n-th collective this rank issues on that process group
        (its ranks and name), in plan order. Groups are interned (one tuple and a small id per distinct group):
        nothing per op grows with the world size, and matching hashes an int, not a tuple of every member."""
        seq, counters, by_id, by_comm = {}, defaultdict(int), {}, {}
        orbit = self.classes.group_orbit if self.classes else None
        for r in self.simulated:
            for i, op in enumerate(self.plan.ranks[r]):
                if type(op) is Collective:
                    hit = by_id.get((id(op.group), op.group_name))
                    if hit is None:
                        c = self.plan.communicator_of(op)
                        hit = by_id[id(op.group), op.group_name] = (
                            (orbit[c], c.ranks) if orbit is not None else
                            by_comm.setdefault(c, (len(by_comm), c.ranks)))
                    gid, g = hit
                    seq[r, i] = (gid, counters[r, gid], g)
                    counters[r, gid] += 1
        return seq

    def run(self) -> Trace:
        self.start()
        self.env.run()
        return self.finish()

    def start(self) -> None:
        """Every simulated (rank, stream) as a simpy process."""
        for r in self.simulated:
            per_stream: dict = {}
            for i, op in enumerate(self.plan.ranks[r]):
                per_stream.setdefault(op.stream, []).append((i, op))
            if self.sym or self.classes:         # the full simulation stays the reference (tests/test_symmetry.py)
                per_stream = fuse(per_stream, lambda i, op: True)
            for s, ops in per_stream.items():
                self.waiting[r, s] = "start"
                self.env.process(self._stream(r, s, ops))

    def finish(self) -> Trace:
        """The trace, once the environment has run (SimulationDeadlock if a stream is stuck)."""
        stuck = [(r, s, self._waiting_text(r, what)) for (r, s), what in sorted(self.waiting.items())
                 if what is not None]
        if stuck:
            raise SimulationDeadlock(stuck, self.env.now)
        self.records.sort(key=lambda o: (o.rank, o.index))
        if self.sym:
            self.records = RankCopies(self.records, self.sym.representative, self.sym.members)
        elif self.classes:
            self.records = RankCopies(self.records, self.classes.rep_of, range(self.plan.world_size), self.plan)
        transfers = [TransferRecord(s, d, st, e, b, tuple(self.topo.names[l] for l in route))
                     for s, d, st, e, b, route in self.net.transfers]
        transfers.sort(key=lambda t: (t.start, t.end, t.src, t.dst))
        meta = {"source": "simulated", "plan": self.plan.name, "cluster": self.cluster.name,
                "world_size": self.plan.world_size, "flows": self.net.flows_done,
                "protocols": sorted(self.protocols_used)}
        return Trace(self.records, transfers, meta)

    def _waiting_text(self, rank, what) -> str:
        """What a stuck stream waits in, from the (index, op) it stopped at (made only for a deadlock)."""
        if isinstance(what, str):
            return what
        index, op = what
        if isinstance(op, Wait):
            return f"wait for event {op.event!r} (op #{index})"
        if isinstance(op, Collective):
            return f"{describe(op)} #{self.seq[rank, index][1]} on group {_fmt(self.seq[rank, index][2])}"
        return f"op #{index} {describe(op)}"

    def _stream(self, rank, stream, ops):
        env, waiting, key = self.env, self.waiting, (rank, stream)
        events = self.events[rank]
        if self.start_s:
            yield env.timeout(self.start_s)
        for index, op in ops:
            start = env.now
            if index is None:                   # a collective handed over and waited for at once (sim/kernel/inline.py)
                yield from self._inline(rank, stream, op)
                continue
            waiting[key] = (index, op)
            kind = type(op)
            if kind is Compute:
                rec = OpRecord(rank, stream, index, "compute", op.name or "compute", start, start)
                yield from self.hosts.compute(rank, compute_seconds(op, self.cluster) * self.slowdown.get(rank, 1.0))
            elif kind is Record:
                rec = OpRecord(rank, stream, index, "record", op.event, start, start)
                ev = events[op.event]
                if not ev.triggered:
                    ev.succeed()
            elif kind is Wait:
                rec = OpRecord(rank, stream, index, "wait", op.event, start, start)
                ev = events[op.event]
                if ev.callbacks is not None:      # not yet processed (a processed one resumes at once anyway)
                    yield ev
            elif kind is Collective:
                group = self.seq[rank, index][2]
                launch, algorithm = yield from self._collective(rank, index, op)
                rec = OpRecord(rank, stream, index, "collective", op.name or op.op, start, start, op.bytes, op.op,
                               launch, group, algorithm)
            else:
                launch = yield from self._p2p(rank, op)
                rec = OpRecord(rank, stream, index, op.kind, op.name or op.kind, start, start, op.bytes,
                               launch=launch, peer=op.peer)
            rec.end = env.now
            self.records.append(rec)
        waiting[key] = None

    def _inline(self, rank, stream, p):
        """Run sim/kernel/inline.py's pattern in this (X's) process; the records the two processes would make."""
        (ia, ra), (iwa, wa), (ic, c), (irb, rb), (iwb, wb) = p.record_a, p.wait_a, p.collective, p.record_b, p.wait_b
        t_a, other = self.env.now, (rank, p.stream)
        self.waiting[rank, stream] = (ic, c)
        gid, _, group = self.seq[rank, ic]
        reuse = self.classes and self.classes.arrivals[gid] == 1 and gid in self.classes.exclusive
        hit = self.durations.get((c.op, c.bytes, c.algorithm, c.root, group)) if reuse else None
        if hit is not None:                      # alone on links of its own: its known duration
            seconds, algorithm, flows = hit
            self.net.flows_done += flows
            yield from self.hosts.arrive(group)
            yield from self.turns.start(gid, self.seq[rank, ic][1])     # its process group's turn
            launch = self.env.now
            flight = self.hosts.launch(group, c.bytes)     # in flight: interference both ways, as always
            yield self.env.timeout(seconds)
            yield from self.hosts.land(group, flight)
            self.turns.end(gid)
        else:
            launch, algorithm = yield from self._collective(rank, ic, c)
        end = self.env.now
        self.records += [OpRecord(rank, stream, ia, "record", ra.event, t_a, t_a),
                         OpRecord(rank, p.stream, iwa, "wait", wa.event, self.clock.get(other, 0.0), t_a),
                         OpRecord(rank, p.stream, ic, "collective", c.name or c.op, t_a, end, c.bytes, c.op, launch,
                                  group, algorithm),
                         OpRecord(rank, p.stream, irb, "record", rb.event, end, end),
                         OpRecord(rank, stream, iwb, "wait", wb.event, t_a, end)]
        self.clock[other] = end

    def _collective(self, rank, index, op: Collective):
        gid, n, group = self.seq[rank, index]
        key = (gid, n)
        rv = self.rendezvous.get(key)
        if rv is None:
            rv = self.rendezvous[key] = {"op": op, "rank": rank, "arrived": 0, "done": self.env.event()}
        else:
            first = rv["op"]
            roots_differ = self.classes is None and first.root != op.root     # classes: roots are renamed
            if (first.op, first.bytes) != (op.op, op.bytes) or roots_differ:
                raise ConfigError(f"collective mismatch on group {_fmt(group)}, collective #{key[1]}: rank {rv['rank']} "
                                  f"calls {describe(first)}, rank {rank} calls {describe(op)}", "plan")
        rv["arrived"] += 1
        # symmetric: the members of one class arrive together (sim/kernel/symmetry.py, sim/kernel/subgroups.py)
        if rv["arrived"] == (1 if self.sym else self.classes.arrivals[gid] if self.classes else len(group)):
            del self.rendezvous[key]
            self.env.process(self._run_collective(rv, op, group, key))
        yield rv["done"]
        return rv["launch"], rv["algorithm"]

    def _run_collective(self, rv, op, group, turn):
        """Run it once every member arrived and its process group's turn came (``turn``: (group id, n))."""
        yield from self.hosts.arrive(group)
        yield from self.turns.start(*turn)
        yield from self._transfer_collective(rv, op, group, turn[0])
        self.turns.end(turn[0])
        rv["done"].succeed()

    def _transfer_collective(self, rv, op, group, gid):
        flight = self.hosts.launch(group, op.bytes)
        rv["launch"] = start = self.env.now
        key = (op.op, op.bytes, op.algorithm, op.root, group, op.splits) \
            if self.sym and self.sym.repeat_collectives else None
        if self.classes and gid in self.classes.exclusive:
            key = (op.op, op.bytes, op.algorithm, op.root, group)     # links of its own: reused (sim/kernel/subgroups.py)
        if key in self.durations:        # the network is otherwise idle: the same duration (sim/kernel/symmetry.py)
            seconds, rv["algorithm"], flows = self.durations[key]
            self.net.flows_done += flows
            yield self.env.timeout(seconds)
            yield from self.hosts.land(group, flight)
            return
        flows = self.net.flows_done
        if self.classes:         # the flows of every simulated group of the orbit (sim/kernel/subgroups.py; no splits)
            algorithm, protocol, step_iter, extra = self.classes.steps[group, op.group_name, op.op, op.bytes,
                                                                       op.algorithm, op.root]
            self.net.flows_done += extra
            count = extra + sum(len(p) for p, _, _ in step_iter)      # the orbit's flows (others may end meanwhile)
        else:
            algorithm, protocol, step_iter = self.ctx.expand(op.op, group, op.bytes, op.algorithm, op.root, op.splits)
        rv["algorithm"] = algorithm
        self.protocols_used.add(protocol)
        if self.watch is not None:
            step_iter = [self.watch(*step) or step for step in step_iter]
        yield from run_steps(self.net, step_iter)      # in the network's step loop (sim/kernel/solo.py, sim/kernel/netloop.py)
        if key is not None:
            flows = count if self.classes else self.net.flows_done - flows
            self.durations[key] = (self.env.now - start, algorithm, flows)     # the network time alone
        yield from self.hosts.land(group, flight)

    def _p2p(self, rank, op):
        if isinstance(op, Send):
            pair, mine, theirs = (rank, op.peer), self.sends, self.recvs
        else:
            pair, mine, theirs = (op.peer, rank), self.recvs, self.sends
        real = pair
        if self.classes:         # a send meets the receive of the same pair orbit (sim/kernel/subgroups.py)
            pair = self.classes.pair_orbit[pair]
        if theirs[pair]:
            other_op, slot = theirs[pair].popleft()
            if other_op.bytes != op.bytes:
                raise ConfigError(f"send/recv mismatch between ranks {real[0]} -> {real[1]}: "
                                  f"{describe(other_op)} meets {describe(op)}", "plan")
            self.env.process(self._run_p2p(pair, op.bytes, slot))
        else:
            slot = {"done": self.env.event()}
            mine[pair].append((op, slot))
        yield slot["done"]
        return slot["launch"]

    def _run_p2p(self, pair, nbytes, slot):
        slot["launch"] = self.env.now
        if self.classes:
            pairs, extra = self.classes.p2p[pair]
            self.net.flows_done += extra
        else:
            pairs = self.ctx.pairs(("p2p", pair), lambda: [pair])
        cpu_jobs = self.hosts.cpu_jobs(nbytes, pair)        # the sender's and the receiver's gloo threads
        if self.watch is not None:
            self.watch(pairs, float(nbytes), None)
        yield self.net.transfer(pairs, float(nbytes))
        if cpu_jobs:
            yield self.env.all_of(cpu_jobs)
        slot["done"].succeed()


Simulation = _Simulation      # sim/jobs/ runs several on one network (``shared``)


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
