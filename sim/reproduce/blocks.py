"""A TP rank's local work between pipeline events as one op each: exact, and thousands of times fewer ops.

    >>> from distlab.sim.plan import Compute, Record, Wait
    >>> from distlab.sim.reproduce.blocks import exits
    >>> ops = [Compute("a", seconds=2.0), Record("e", "compute"), Wait("e", "tp"), Compute("b", seconds=1.0,
    ...        stream="tp"), Record("f", "tp"), Wait("f", "compute")]
    >>> exits(ops, gpu=None)                     # compute entered at 0: compute and tp leave at 3 s
    {'compute': 3.0, 'tp': 3.0, 'tp_recv': -inf}

The rule. The one TP rank that stands for a pipeline stage (sim/reproduce/pipeline.py, its ring exchanges already
fixed-duration ops) runs, between one pipeline event and the next, only ops of its own three streams ("compute",
"tp", "tp_recv"): Compute, Record, Wait on events recorded there. Such a block is a max-plus linear map of the
times its streams enter it: each stream leaves it at exit[s] = max over j of (A[s][j] + entry[j]), where A[s][j]
is when s leaves when only j entered at 0 (``exits``: the engine's rules, an op starts when its stream is free
and its waits are met, its duration that of sim/compute). When every A[s][j] <= A[compute][compute] (no stream
outlasts compute, none delays it beyond its own work) and every block of the rank has that property, the streams
"tp" and "tp_recv" are idle whenever compute enters a block (by induction from the step's start, where all are
0), so each block leaves compute exactly A[compute][compute] after it entered: one fixed-duration op on compute
replaces the block, and the "tp" streams vanish. A rank where one block lacks the property, or with a pipeline
event on a "tp" stream, keeps its ops (``collapsed`` returns them unchanged). Nothing else on the rank changes
its compute's speed here: the engine slows compute only while a collective is in flight on the rank
(sim/kernel/hosts.py), and the replica-0 plans of sim/reproduce/ have their collectives as fixed-duration ops;
tests/test_reproduce.py compares the step with the full simulation's.
"""
from __future__ import annotations

from distlab.sim.plan import Compute, Record, Wait

STREAMS = ("compute", "tp", "tp_recv")


def collapsed(ops: list, gpu) -> list:
    """``ops`` with each block of local work one fixed-duration op (module docstring), or ``ops`` itself."""
    blocks = _blocks(ops, [_is_local(op) for op in ops])
    inside = {i for s, e in blocks for i in range(s, e)}
    if any(op.stream in STREAMS[1:] for i, op in enumerate(ops) if i not in inside):
        return ops                               # a "tp" stream's time would matter outside the blocks
    out, done, cache = [], 0, {}
    for start, end in blocks:
        out += ops[done:start]
        block = ops[start:end]
        key = _signature(block)
        if key not in cache:
            a = {s: exits(block, gpu, s) for s in STREAMS}
            own = a["compute"]["compute"]
            ok = all(v <= own for row in a.values() for v in row.values())
            cache[key] = own if ok else None
        if cache[key] is None:
            return ops
        name = next((op.name for op in block if isinstance(op, Compute)), "block")
        out.append(Compute(f"block: {name}", seconds=cache[key], stream="compute"))
        done = end
    return out + ops[done:]


def _is_local(op) -> bool:
    return isinstance(op, (Compute, Record, Wait)) and op.stream in STREAMS


def _blocks(ops: list, local: list) -> list[tuple[int, int]]:
    """(start, end) of the blocks: runs of local ops, cut before a Wait whose event is not recorded earlier in the
    same block and around a Record waited outside its block, until no cut moves."""
    waits: dict = {}
    recorded: dict = {}
    for i, op in enumerate(ops):
        if local[i] and isinstance(op, Wait):
            waits.setdefault(op.event, []).append(i)
        elif isinstance(op, Record):
            recorded[op.event] = recorded.get(op.event, 0) + 1
    for i, op in enumerate(ops):              # a wait on an event recorded outside the local ops: never inside
        if not local[i] and isinstance(op, Wait):
            waits.setdefault(op.event, []).append(-1)
    pinned = {i for i, op in enumerate(ops) if isinstance(op, Record) and recorded[op.event] > 1}
    while True:
        blocks, owner, start, seen = [], {}, None, set()
        for i, op in enumerate(ops):
            inside = local[i] and i not in pinned and not (isinstance(op, Wait) and op.event not in seen)
            if not inside:
                if start is not None:
                    blocks.append((start, i))
                start, seen = None, set()
                continue
            if start is None:
                start = i
            if isinstance(op, Record):
                seen.add(op.event)
                owner[i] = len(blocks)
        if start is not None:
            blocks.append((start, len(ops)))
        more = set()
        for i, b in owner.items():
            s, e = blocks[b]
            if any(not s <= w < e for w in waits.get(ops[i].event, ())):
                more.add(i)
        if not more:
            return blocks
        pinned |= more


def exits(block: list, gpu, entered: str = "compute") -> dict:
    """When each stream leaves ``block`` if only stream ``entered`` entered it at time 0 (the others at -inf):
    the engine's rules (an op starts when its stream is free and, for a Wait, its event recorded)."""
    from distlab.sim.compute import op_seconds
    inf = float("-inf")
    clock = {s: (0.0 if s == entered else inf) for s in STREAMS}
    events: dict = {}
    for op in block:
        s = op.stream
        if isinstance(op, Compute):
            if clock[s] > inf:                   # a stream not entered stays at -inf (max-plus)
                clock[s] += op_seconds(op, gpu)
        elif isinstance(op, Record):
            events[op.event] = clock[s]
        else:
            clock[s] = max(clock[s], events[op.event])
    return clock


def _signature(block: list) -> tuple:
    """What the block's timing depends on: its ops with event names numbered in order of first use."""
    names: dict = {}
    key = []
    for op in block:
        if isinstance(op, Compute):
            key.append(op)
        else:
            key.append((type(op).__name__, op.stream, names.setdefault(op.event, len(names))))
    return tuple(key)
