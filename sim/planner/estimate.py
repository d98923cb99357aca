"""The planner's fast estimate of one step: the discrete-event simulator's own costs, combined without it.

Every term is what the simulator would charge (compute: ``engine.compute_seconds`` of the builders' own ops;
a collective: ``engine.simulate_collective`` of that op on its group, placed as the mesh places it, on a cluster
cut down to the nodes the group spans; a point-to-point message: the simulator on two ranks), so the estimate
follows every change to the cost models. What it leaves out is what the simulator adds by simulating every
rank at once: contention between concurrent groups on shared links.

How the terms combine (the builders' structure, sim/parallel/tp/*):
- inside a layer, compute waits for each TP collective (stream ``tp``): a stage's forward F_s and backward B_s
  of one micro-batch are sums;
- PP x TP x DDP (1F1B, GPipe, interleaved 1F1B with stage s on rank s % p): the pipeline's actions
  (sim/parallel/pipeline/schedules.py) list-scheduled per rank with these durations (sim/planner/schedule.py,
  the one schedule walk sim/planner/composed.py uses too); then, per rank, its stages' gradient all-reduces over
  dp in turn, each after its stage's last backward. Step = the last end;
- DDP x TP, FSDP2 x TP, HSDP x TP and CP x TP x FSDP2/HSDP: rank 0's program, built small, run stream by stream
  (sim/planner/flat.py): ops in order per stream, Wait holds a stream until its Record, ring attention's
  permutes meet their receives by symmetry; collectives take their time on the real group of their mesh
  dimension. Exact for symmetric ranks without contention.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from distlab.sim.kernel.engine import compute_seconds, simulate, simulate_collective
from distlab.sim.plan import Compute, Plan, Record, Recv, Send, Wait


@dataclass
class Estimate:
    """Step seconds and its terms (seconds on the critical rank): compute, exposed TP and DP communication,
    pipeline bubble and point-to-point, recomputation (the extra forward work inside compute)."""
    step_s: float
    terms: dict = field(default_factory=dict)


LINEAR_FROM = 1 << 20          # bytes from which a collective's time is read off a straight octave (CostCache)
LINEAR_TOLERANCE = 1e-3


class CostCache:
    """Collective and p2p times from the simulator, cached by what they depend on. From 1 MiB on, where the
    simulated time is a straight line in the bytes across an octave [2^k, 2^(k+1)] (checked: the time at
    1.5·2^k is within 0.1% of the mean of the ends), a size inside it is interpolated from the ends, so the
    thousands of gradient sizes of a search cost three simulations per octave and group; elsewhere (the
    algorithm or protocol changes inside the octave) the size itself is simulated."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.gpn = cluster.gpus_per_node
        self._cuts: dict = {}
        self._times: dict = {}
        self._asked: dict = {}          # (op, bytes, group, algorithm) -> seconds: every block asks the same

    def collective(self, op: str, nbytes: int, group: tuple, algorithm: str = "auto") -> float:
        """Seconds of one collective on ``group``, simulated on the cluster cut to the nodes it spans (cached by
        that cut: groups the cut makes equal, e.g. every rank's dp group, are simulated once)."""
        if len(group) < 2 or nbytes <= 0 and op != "barrier":
            return 0.0
        asked = (op, nbytes, group, algorithm)
        t = self._asked.get(asked)
        if t is None:
            t = self._asked[asked] = self._collective(op, nbytes, group, algorithm)
        return t

    def _collective(self, op: str, nbytes: int, group: tuple, algorithm: str) -> float:
        key = self._cuts.get(group)
        if key is None:
            small, members = self._cut(group)
            key = self._cuts[group] = (small, members, (small.nodes, small.gpus_per_node, members))
        if nbytes < LINEAR_FROM or op == "barrier":
            return self._simulated(op, nbytes, key[2], algorithm, key[0], key[1])
        lo = 1 << (nbytes.bit_length() - 1)             # the octave [lo, 2 lo] holding nbytes
        t = [self._simulated(op, b, key[2], algorithm, key[0], key[1]) for b in (lo, 3 * lo // 2, 2 * lo)]
        if abs(t[1] - (t[0] + t[2]) / 2) <= LINEAR_TOLERANCE * t[1]:      # straight across the octave
            return t[0] + (t[2] - t[0]) * (nbytes - lo) / lo
        return self._simulated(op, nbytes, key[2], algorithm, key[0], key[1])

    def _simulated(self, op: str, nbytes: int, shape: tuple, algorithm: str, small, members) -> float:
        k = (op, nbytes, shape, algorithm)
        if k not in self._times:
            trace, _ = simulate_collective(op, nbytes, small, algorithm=algorithm, group=members)
            self._times[k] = trace.makespan
        return self._times[k]

    @lru_cache(maxsize=None)
    def split(self, op: str, nbytes: int, group: tuple, algorithm: str = "auto") -> tuple[float, float]:
        """(latency, transfer) seconds of a collective: latency = its time for the smallest message (one
        element per rank), transfer = the rest (what concurrent collectives share)."""
        total = self.collective(op, nbytes, group, algorithm)
        floor = min(total, self.collective(op, 4 * len(group), group, algorithm)) if total else 0.0
        return floor, total - floor

    @lru_cache(maxsize=None)
    def p2p(self, src: int, dst: int, nbytes: int) -> float:
        small, (a, b) = self._cut((src, dst))
        n = small.world_size
        ranks = [[] for _ in range(n)]
        ranks[a] = [Send(b, int(nbytes), name="m")]
        ranks[b] = [Recv(a, int(nbytes), name="m")]
        return simulate(Plan(ranks, name="p2p").validate(), small, record_transfers=False).makespan

    def _cut(self, group: tuple):
        """The cluster cut down to the nodes ``group`` spans (renumbered in order), and the group on it. A group
        with one rank per node on a fabric with a NIC per GPU runs as on nodes of one GPU and one NIC (what NCCL
        sees too: one rank per node), so its cost does not grow with the GPUs left idle beside it; likewise a
        group with the same k GPUs of every node (a data-parallel group beside TP or CP: every tp-th GPU) runs
        as on nodes of k GPUs and k NICs (tests/test_planner_scale.py checks both against the whole nodes)."""
        from dataclasses import replace
        nodes = sorted({r // self.gpn for r in group})
        index = {node: i for i, node in enumerate(nodes)}
        c = self.cluster
        local = sorted({r % self.gpn for r in group})
        k = len(local)
        if 1 < k < self.gpn and len(nodes) > 1 and len(group) == k * len(nodes) \
                and c.inter_node.nics_per_node == self.gpn:
            position = {j: i for i, j in enumerate(local)}
            small = replace(c, nodes=len(nodes), gpus_per_node=k, inter_node=replace(c.inter_node, nics_per_node=k))
            return small, tuple(index[r // self.gpn] * k + position[r % self.gpn] for r in group)
        if len(nodes) == len(group) > 1 and c.inter_node.nics_per_node == self.gpn and self.gpn > 1:
            small = replace(c, nodes=len(nodes), gpus_per_node=1, inter_node=replace(c.inter_node, nics_per_node=1))
            return small, tuple(range(len(group)))
        small = c.with_nodes(len(nodes))
        return small, tuple(index[r // self.gpn] * self.gpn + r % self.gpn for r in group)


def op_seconds(op, cluster, costs: CostCache, group_of=None) -> float:
    """Seconds of a Compute or Collective op (``group_of(op)`` maps a collective to its real group)."""
    if isinstance(op, Compute):
        return compute_seconds(op, cluster)
    group = group_of(op) if group_of else op.group
    return costs.collective(op.op, op.bytes, tuple(group), op.algorithm)


def streams_makespan(ops: list, seconds, share=lambda op: None, interference: float = 1.0,
                     comm=lambda op: None, slots: int = 1) -> float:
    """One rank's ops run stream by stream (ops in order; a Wait holds its stream until the matching Record
    of another stream has passed; an event fires once, as in the engine): the time the last stream ends.
    ``seconds(op)`` is (latency, transfer) seconds of an op alone (compute: (0, t)). Ops running at once with
    the same ``share(op)`` key (not None: collectives over the same links) share the transfer part equally
    (processor sharing, the simulator's max-min share of a link among equal flows); latency is not shared.
    While a collective (an op with a share key) is in flight, compute runs ``interference`` times slower (the
    engine's rule, sim/kernel/engine.py). Point-to-point ops are those of a ring every rank runs alike (ring attention's
    permutes): the k-th Send of a name starts once the k-th Recv of that name is posted (by symmetry the peer
    posts its receive when this rank does), and that Recv ends when the Send ends. Collectives of one process
    group (``comm(op)``, not None) start in list order, at most ``slots`` at once (the engine's rule,
    sim/kernel/communicators.py)."""
    queues: dict[str, list] = {}
    turn: list = []                        # per position: (communicator, its n-th collective) or None
    count: dict = {}
    for i, op in enumerate(ops):
        queues.setdefault(op.stream, []).append(i)
        c = comm(op)
        turn.append(None if c is None else (c, count.get(c, 0)))
        if c is not None:
            count[c] = count.get(c, 0) + 1
    started: dict = {}                     # communicator -> collectives started
    in_flight: dict = {}                   # communicator -> collectives running
    pos = {s: 0 for s in queues}
    events: dict[str, float] = {}
    posted: dict[tuple, int] = {}          # p2p name -> receives posted so far
    sent: dict = {}                        # p2p name -> sends finished so far
    sends: dict = {}                       # p2p name -> sends started so far
    running: dict[str, list] = {}          # stream -> [latency left, transfer left at full rate, share key, op]
    now = 0.0
    while True:
        moved = True
        while moved:                       # start what can start now (a Record may free an earlier stream)
            moved = False
            for s, q in queues.items():
                while s not in running and pos[s] < len(q):
                    op = ops[q[pos[s]]]
                    t = turn[q[pos[s]]]
                    if t is not None and (started.get(t[0], 0) != t[1] or in_flight.get(t[0], 0) >= slots):
                        break                      # its process group's turn has not come
                    if isinstance(op, Wait):
                        if op.event not in events:
                            break
                    elif isinstance(op, Record):
                        events.setdefault(op.event, now)
                    elif isinstance(op, Recv):
                        k = posted.setdefault(op.name, 0)
                        events.setdefault((op.name, k, "posted"), now)
                        if sent.get(op.name, 0) <= k:
                            break
                        posted[op.name] = k + 1
                    elif isinstance(op, Send):
                        k = sends.get(op.name, 0)
                        if (op.name, k, "posted") not in events:
                            break
                        sends[op.name] = k + 1
                        lat, xfer = seconds(op)
                        running[s] = [lat, xfer, share(op), op]
                    else:
                        lat, xfer = seconds(op)
                        if t is not None:
                            started[t[0]] = t[1] + 1
                        if lat + xfer > 0:
                            running[s] = [lat, xfer, share(op), op]
                            if t is not None:
                                in_flight[t[0]] = in_flight.get(t[0], 0) + 1
                    pos[s] += 1
                    moved = True
        if not running:
            break
        users: dict = {}
        for lat, xfer, key, _ in running.values():
            if key is not None and lat <= 0:
                users[key] = users.get(key, 0) + 1
        busy = any(key is not None for _, _, key, _ in running.values())
        compute_rate = 1.0 / interference if busy else 1.0
        rate = {s: (compute_rate if key is None else 1.0 if lat > 0 else 1.0 / users[key])
                for s, (lat, _, key, _) in running.items()}
        dt = min(lat if lat > 0 else xfer / rate[s] for s, (lat, xfer, _, _) in running.items())
        now += dt
        eps = 1e-15 * max(1.0, now)
        for s in list(running):
            r = running[s]
            if r[0] > 0:
                r[0] -= dt
            else:
                r[1] -= dt * rate[s]
            if r[0] <= eps and r[1] <= eps:
                if isinstance(r[3], Send):
                    sent[r[3].name] = sent.get(r[3].name, 0) + 1
                c = comm(r[3])
                if c is not None:
                    in_flight[c] -= 1
                del running[s]
    if any(pos[s] < len(q) for s, q in queues.items()):
        raise ValueError("a Wait never met its Record")
    return now
