"""Collectives that one stream hands to another and waits for at once, run by the waiting stream itself
(sim/kernel/engine.py): fewer simulation events per op, the same records.

The pattern (sim/parallel/tp/plan.py ``_Program.coll``: a TP collective on the critical path): on stream X the ops
Record(a), Wait(b) follow each other; on stream S the ops Wait(a), Collective, Record(b) follow each other;
event a is waited only there, b likewise. When every op of S belongs to such a pattern and each of its
collectives can start as soon as this rank issues it (``may_inline``: a representative alone in its class,
sim/kernel/subgroups.py), the engine runs the whole pattern in X's process. Exact, op by op, with t_a the time X
records a and c the end of S's previous op (0 at first): Record(a) at t_a; Wait(a) on S from c to t_a
(S reached it at c; c <= t_a since X waited for S's previous Record); the collective from t_a (launch and
end as the engine computes them; nothing else of S runs meanwhile); Record(b) at its end; Wait(b) on X from
t_a to that end. These are the times the two processes produce (the engine's rules for Record and Wait).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from distlab.sim.plan import Collective, Record, Wait


@dataclass(frozen=True)
class Inline:
    """One pattern, each op with its index in the rank's program."""
    stream: str                  # S, the stream whose ops X runs
    record_a: tuple
    wait_a: tuple
    collective: tuple
    record_b: tuple
    wait_b: tuple


def fuse(per_stream: dict[str, list], may_inline) -> dict[str, list]:
    """``per_stream``: stream -> [(index, op)] of one rank. Returns it with every stream made only of patterns
    removed and each pattern's Record(a), Wait(b) on X replaced by one (None, Inline) item."""
    waits = Counter(op.event for ops in per_stream.values() for _, op in ops if isinstance(op, Wait))
    record_at: dict = {}         # event -> (stream, position) of its Record
    for s, ops in per_stream.items():
        for k, (_, op) in enumerate(ops):
            if isinstance(op, Record):
                record_at[op.event] = (s, k)
    fused: dict = {}             # (stream X, position of Record(a)) -> Inline
    for s, ops in per_stream.items():
        found = _patterns(s, ops, per_stream, waits, record_at, may_inline)
        if found is not None:
            fused.update(found)
    if not fused:
        return per_stream
    gone = {p.stream for p in fused.values()}
    if any(x in gone for x, _ in fused):      # a stream both run by another and running one: leave it
        return per_stream
    out = {}
    for s, ops in per_stream.items():
        if s in gone:
            continue
        items, k = [], 0
        while k < len(ops):
            p = fused.get((s, k))
            if p is None:
                items.append(ops[k])
                k += 1
            else:
                items.append((None, p))
                k += 2
        out[s] = items
    return out


def _patterns(s, ops, per_stream, waits, record_at, may_inline) -> dict | None:
    """The patterns that make up all of stream ``s``, keyed by where X's Record(a) is; None if s is not such."""
    if not ops or len(ops) % 3:
        return None
    found = {}
    for k in range(0, len(ops), 3):
        wa, co, rb = ops[k], ops[k + 1], ops[k + 2]
        if not (isinstance(wa[1], Wait) and isinstance(co[1], Collective) and isinstance(rb[1], Record)):
            return None
        a, b = wa[1].event, rb[1].event
        if waits[a] != 1 or waits[b] != 1 or a not in record_at or not may_inline(co[0], co[1]):
            return None
        x, pos = record_at[a]
        other = per_stream[x]
        if x == s or pos + 1 >= len(other):
            return None
        nxt = other[pos + 1]
        if not (isinstance(nxt[1], Wait) and nxt[1].event == b):
            return None
        found[x, pos] = Inline(s, other[pos], wa, co, rb, nxt)
    return found
