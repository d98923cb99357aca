"""A job's steps one after another: its plan repeated, and where each step ends in a trace.

    plan3 = repeat(plan, 3)          # ops of step 1: step 0's, events renamed "name@1"; a barrier in between
    ends = step_ends(trace, plan, 3)  # [end of step 0, end of step 1, end of step 2] (seconds)

Between two steps each rank synchronizes its own streams: every stream records ``@step{k}:{stream}`` at the end
of step k, and every stream of step k + 1 first waits for the other streams' records. So a rank starts step
k + 1 when it has finished step k on every stream, as a training loop's next forward starts after its optimizer
step (which waits for the reduced gradients); ranks are not synchronized with each other beyond what the
collectives of the plan do. A step ends when its last op ends on any rank: step k's time is end_k - end_{k-1}
(end_{-1} = the job's start), so the steps' times sum to the job's span. A one-step job is the plan unchanged.
"""
from __future__ import annotations

from bisect import bisect_right

from distlab.sim.kernel.relabel import RelabelledRanks
from distlab.sim.plan import Plan, Record, Wait
from distlab.sim.trace import RankCopies


def repeat(plan: Plan, steps: int) -> Plan:
    """``plan`` run ``steps`` times on every rank (module docstring); programs shared between ranks stay shared."""
    if steps == 1:
        return plan
    done: dict = {}

    def program(ops):
        out = done.get(id(ops))
        if out is None or out[0] is not ops:
            out = done[id(ops)] = (ops, _repeated(ops, steps))
        return out[1]

    ranks = plan.ranks
    if isinstance(ranks, RelabelledRanks):
        new = RelabelledRanks({q: program(ops) for q, ops in ranks.programs.items()}, ranks.shifts)
    else:
        new = [program(ops) for ops in ranks]
    return Plan(new, name=plan.name, meta=dict(plan.meta))


def _repeated(ops: list, steps: int) -> list:
    streams = list(dict.fromkeys(op.stream for op in ops))
    renamed: dict = {}
    out: list = []
    for k in range(steps):
        if k:
            out += [Wait(f"@step{k - 1}:{other}", stream=s) for s in streams for other in streams if other != s]
        for op in ops:
            if isinstance(op, (Record, Wait)) and k:
                key = (type(op), op.event, op.stream, k)
                if key not in renamed:
                    renamed[key] = type(op)(f"{op.event}@{k}", stream=op.stream)
                op = renamed[key]
            out.append(op)
        if k < steps - 1:
            out += [Record(f"@step{k}:{s}", stream=s) for s in streams]
    return out


def _starts(length: int, streams: int, steps: int) -> list[int]:
    """Index of the first op of each step in a repeated program of ``length`` ops on ``streams`` streams."""
    waits, records = streams * (streams - 1), streams
    starts, at = [], 0
    for k in range(steps):
        starts.append(at)
        at += (waits if k else 0) + length + (records if k < steps - 1 else 0)
    return starts


def step_ends(trace, plan: Plan, steps: int) -> list[float]:
    """When each step ends (the latest end over ranks of that step's ops); ``plan`` is the plan before repeat."""
    records = trace.ops.records if isinstance(trace.ops, RankCopies) else trace.ops
    ends = [float("-inf")] * steps
    layout: dict = {}
    for o in records:
        starts = layout.get(o.rank)
        if starts is None:
            ops = plan.ranks[o.rank]
            starts = layout[o.rank] = _starts(len(ops), len({op.stream for op in ops}), steps)
        k = bisect_right(starts, o.index) - 1
        if o.end > ends[k]:
            ends[k] = o.end
    return ends
