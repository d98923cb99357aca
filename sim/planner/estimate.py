"""The planner's fast estimate of one step: the discrete-event simulator's own costs, combined without it.

Every term is what the simulator would charge (compute: ``engine.compute_seconds`` of the builders' own ops;
a collective: ``engine.simulate_collective`` of that op on its group, placed as the mesh places it, on a cluster
cut down to the nodes the group spans; a point-to-point message: the simulator on two ranks), so the estimate
follows every change to the cost models. What it leaves out is what the simulator adds by simulating every
rank at once: contention between concurrent groups on shared links.

How the terms combine (the builders' structure, sim/tp/*):
- inside a layer, compute waits for each TP collective (stream ``tp``): a stage's forward F_s and backward B_s
  of one micro-batch are sums;
- PP x TP x DDP: the pipeline's actions (sim/pipeline/schedules.py) list-scheduled per rank with these
  durations: an action starts when its rank is free and its input has arrived; a message starts when the
  sender's action has ended, the previous message on that link has been delivered and (receives posted on
  demand, as gpipe and 1f1b run) the receiver is ready for it; then each stage's gradient all-reduce over dp
  after its last backward. Step = the last end;
- DDP x TP and FSDP2 x TP: rank 0's program (built on a mesh with two replicas: bytes do not depend on their
  number) run stream by stream: ops in order per stream, Wait holds a stream until its Record; collectives
  over dp take their time on the real dp group. Exact for symmetric ranks without contention.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from distlab.sim.engine import compute_seconds, simulate, simulate_collective
from distlab.sim.plan import Compute, Plan, Record, Recv, Send, Wait


@dataclass
class Estimate:
    """Step seconds and its terms (seconds on the critical rank): compute, exposed TP and DP communication,
    pipeline bubble and point-to-point, recomputation (the extra forward work inside compute)."""
    step_s: float
    terms: dict = field(default_factory=dict)


class CostCache:
    """Collective and p2p times from the simulator, cached by what they depend on."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.gpn = cluster.gpus_per_node

    @lru_cache(maxsize=None)
    def collective(self, op: str, nbytes: int, group: tuple, algorithm: str = "auto") -> float:
        if len(group) < 2 or nbytes <= 0 and op != "barrier":
            return 0.0
        small, members = self._cut(group)
        trace, _ = simulate_collective(op, nbytes, small, algorithm=algorithm, group=members)
        return trace.makespan

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
        sees too: one rank per node), so its cost does not grow with the GPUs left idle beside it."""
        from dataclasses import replace
        nodes = sorted({r // self.gpn for r in group})
        index = {node: i for i, node in enumerate(nodes)}
        c = self.cluster
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


def streams_makespan(ops: list, seconds, share=lambda op: None, interference: float = 1.0) -> float:
    """One rank's ops run stream by stream (ops in order; a Wait holds its stream until the matching Record
    of another stream has passed; an event fires once, as in the engine): the time the last stream ends.
    ``seconds(op)`` is (latency, transfer) seconds of an op alone (compute: (0, t)). Ops running at once with
    the same ``share(op)`` key (not None: collectives over the same links) share the transfer part equally
    (processor sharing, the simulator's max-min share of a link among equal flows); latency is not shared.
    While a collective (an op with a share key) is in flight, compute runs ``interference`` times slower (the
    engine's rule, sim/engine.py). Sends and receives are not allowed (a rank alone cannot meet its peer)."""
    queues: dict[str, list] = {}
    for op in ops:
        if isinstance(op, (Send, Recv)):
            raise ValueError("streams_makespan takes one rank without point-to-point ops")
        queues.setdefault(op.stream, []).append(op)
    pos = {s: 0 for s in queues}
    events: dict[str, float] = {}
    running: dict[str, list] = {}          # stream -> [latency left, transfer left at full rate, share key]
    now = 0.0
    while True:
        moved = True
        while moved:                       # start what can start now (a Record may free an earlier stream)
            moved = False
            for s, q in queues.items():
                while s not in running and pos[s] < len(q):
                    op = q[pos[s]]
                    if isinstance(op, Wait):
                        if op.event not in events:
                            break
                    elif isinstance(op, Record):
                        events.setdefault(op.event, now)
                    else:
                        lat, xfer = seconds(op)
                        if lat + xfer > 0:
                            running[s] = [lat, xfer, share(op)]
                    pos[s] += 1
                    moved = True
        if not running:
            break
        users: dict = {}
        for lat, xfer, key in running.values():
            if key is not None and lat <= 0:
                users[key] = users.get(key, 0) + 1
        busy = any(key is not None for _, _, key in running.values())
        compute_rate = 1.0 / interference if busy else 1.0
        rate = {s: (compute_rate if key is None else 1.0 if lat > 0 else 1.0 / users[key])
                for s, (lat, _, key) in running.items()}
        dt = min(lat if lat > 0 else xfer / rate[s] for s, (lat, xfer, _) in running.items())
        now += dt
        eps = 1e-15 * max(1.0, now)
        for s in list(running):
            r = running[s]
            if r[0] > 0:
                r[0] -= dt
            else:
                r[1] -= dt * rate[s]
            if r[0] <= eps and r[1] <= eps:
                del running[s]
    if any(pos[s] < len(q) for s, q in queues.items()):
        raise ValueError("a Wait never met its Record")
    return now


def pipeline_makespan(actions: list[list], duration, message_s, on_demand: bool = True) -> tuple[list, list]:
    """List-schedule the pipeline's per-rank ``actions`` (sim.pipeline.schedules.Action, one stage per rank):
    ``duration(a)`` seconds of action a, ``message_s(stage_from, stage_to)`` of one message. Returns per rank
    the end of its last backward and the end of its last action. F of stage s needs F of s-1; B of s needs B of
    s+1 (and F of s, earlier on the same rank); messages on one link go in order (the plan's send stream)."""
    p = len(actions)
    done: dict[tuple, float] = {}
    link_free: dict[tuple, float] = {}
    ready_at = [0.0] * p
    pos = [0] * p
    last_b = [0.0] * p
    remaining = sum(len(a) for a in actions)
    while remaining:
        moved = False
        for r in range(p):
            while pos[r] < len(actions[r]):
                a = actions[r][pos[r]]
                src = a.stage - 1 if a.kind == "F" else a.stage + 1
                start = ready_at[r]
                if 0 <= src < p:
                    key = ("F" if a.kind == "F" else "B", src, a.mb)
                    if key not in done:
                        break
                    link = (src, a.stage)
                    begin = max(done[key], link_free.get(link, 0.0))
                    if on_demand:
                        begin = max(begin, ready_at[r])
                    arrive = begin + message_s(src, a.stage)
                    link_free[link] = arrive
                    start = max(start, arrive)
                end = start + duration(a)
                done[("F" if a.kind == "F" else "B", a.stage, a.mb)] = end
                ready_at[r] = end
                if a.kind == "B":
                    last_b[r] = end
                pos[r] += 1
                remaining -= 1
                moved = True
        if not moved:
            raise ValueError("pipeline schedule deadlocked in the estimate")
    return last_b, ready_at
