"""Where the time went: computing, waiting for peers in collectives, moving data; and who waited for whom."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from distlab.sim.kernel.spans import overlap, union, union_length
from distlab.sim.plan import Collective, Plan
from distlab.sim.trace import Trace


@dataclass
class RankTime:
    rank: int
    compute_s: float      # union of compute-op intervals
    waiting_s: float      # in collectives and p2p, before the data could move (peers not there yet)
    transfer_s: float     # moving data
    span_s: float         # first start to last end


def time_breakdown(trace: Trace) -> list[RankTime]:
    out = []
    for rank in sorted({o.rank for o in trace.ops}):
        ops = trace.for_rank(rank)
        compute = union_length(((o.start, o.end) for o in ops if o.kind == "compute"))
        comm = [o for o in ops if o.launch is not None]
        waiting = sum(o.launch - o.start for o in comm)
        transfer = union_length(((o.launch, o.end) for o in comm))
        span = max(o.end for o in ops) - min(o.start for o in ops) if ops else 0.0
        out.append(RankTime(rank, compute, waiting, transfer, span))
    return out


@dataclass
class Wait:
    name: str
    group: tuple
    late_rank: int        # the last to arrive: everyone else waited for it
    waited_s: dict        # rank -> seconds it waited for late_rank


def who_waited(trace: Trace) -> list[Wait]:
    """Each collective instance (same op, group and launch time) with the rank that arrived last."""
    instances = defaultdict(list)
    for o in trace.ops:
        if o.kind == "collective" and o.launch is not None:
            instances[(o.op, o.group, round(o.launch, 12), o.name)].append(o)
    waits = []
    for (op, group, _, name), recs in sorted(instances.items(), key=lambda kv: kv[0][2]):
        late = max(recs, key=lambda o: (o.start, o.rank))
        waited = {o.rank: o.launch - o.start for o in recs if o.rank != late.rank and o.launch > o.start}
        if waited:
            waits.append(Wait(name or op, group, late.rank, waited))
    return waits


def straggler_report(trace: Trace, top: int = 3) -> list[str]:
    """Lines like 'rank 3 held up others for 12.30 ms in total (8 collectives)'."""
    held = defaultdict(lambda: [0.0, 0])
    for w in who_waited(trace):
        held[w.late_rank][0] += max(w.waited_s.values())
        held[w.late_rank][1] += 1
    ranked = sorted(held.items(), key=lambda kv: -kv[1][0])[:top]
    return [f"rank {r} arrived last and held up its peers for {t * 1e3:.2f} ms in total ({n} collective"
            f"{'s' if n != 1 else ''})" for r, (t, n) in ranked if t > 0]


def in_flight_by_communicator(plan: Plan, trace: Trace, rank: int) -> dict:
    """Per process group ``rank`` uses (plan.communicator_of: ranks and name): the most of its collectives that
    moved data at the same moment on this rank (launch to end; spans that only touch do not count). NCCL runs
    one at a time, Gloo at most its two worker threads' worth (sim/kernel/communicators.py)."""
    spans: dict = defaultdict(list)
    ops = plan.ranks[rank]
    for o in trace.for_rank(rank):
        op = ops[o.index]
        if isinstance(op, Collective) and o.launch is not None:
            spans[plan.communicator_of(op)].append((o.launch, o.end))
    most = {}
    for comm, s in spans.items():
        # ends before starts at one instant: a collective starting as the previous one ends never overlaps it
        points = sorted([(a, 1) for a, b in s if b > a] + [(b, -1) for a, b in s if b > a])
        running = peak = 0
        for _, step in points:
            running += step
            peak = max(peak, running)
        most[comm] = peak
    return most


def collective_overlap_s(trace: Trace, rank: int, first: str, second: str) -> float:
    """Seconds during which a collective matching ``first`` and one matching ``second`` both moved data on
    ``rank`` (launch to end). A pattern matches a collective (``all_gather``) or a part of an op's name
    (``backward``: FSDP's backward all-gathers). E.g. FSDP's backward all-gathers against its reduce-scatters:
    0 when they share the shard group's communicator, the overlap the option buys when they do not
    (separate_reduce_scatter_group, sim/parallel/fsdp/plan.py)."""
    def spans(pattern):
        return union((o.launch, o.end) for o in trace.for_rank(rank)
                     if o.kind == "collective" and o.launch is not None and (o.op == pattern or pattern in o.name))
    return overlap(spans(first), spans(second))
