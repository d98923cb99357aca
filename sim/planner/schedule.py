"""The planner's one walk of a pipeline schedule: its actions list-scheduled with given durations.

    c = compiled_schedule("1f1b", p=4, m=8)                   # the order, recorded once per schedule shape
    seconds = [1.0 if kind == "F" else 2.0 for kind, stage, mb in c.actions]
    last_b, ends = run_schedule(c, seconds, [0.0] * len(c.actions))
    max(ends)                                                 # (m + p - 1)(F + B) = 33.0 s (1F1B, free messages)

The rule (the builders' structure, sim/parallel/pipeline/plan.py; torch's ``PipelineScheduleSingle`` and
``PipelineScheduleMulti`` run each rank's actions in order): an action starts when its rank is free and its input
has arrived; F of stage s takes the output of F of s - 1, B of s the gradient of B of s + 1. A message between
two ranks starts when the producing action ends and the previous message on that link (sender rank, receiver
rank) has been delivered; under GPipe and 1F1B the receiver posts its receive when it reaches the action (the
message starts no earlier than that), interleaved 1F1B posts its receives early. A stage runs on the rank whose
action list holds it (interleaved: stage s on rank s % p). The order the list schedule visits the actions does
not depend on their durations, so it is recorded once per (schedule, p, m, v) and replayed with each layout's
durations (sim/planner/step.py: per stage; sim/planner/composed.py: per action, from the rank's own program).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Compiled:
    """A schedule's list-scheduling order: per action (rank, the index of the action whose output it receives or
    -1, the index of its link or -1) in ``order`` and its (kind, stage, micro-batch) in ``actions``; ``links``:
    (src rank, dst rank); ``last_b``: per stage the index of its last backward; ``placement``: stage -> rank;
    ``rows``: per action in order (rank, dep, link, slot), slot = 2 x stage + (kind is B), its index in a flat
    (F, B) per stage list of durations."""
    order: tuple
    actions: tuple
    links: tuple
    last_b: tuple
    placement: tuple
    ranks: int
    on_demand: bool
    rows: tuple = ()


@lru_cache(maxsize=512)
def built_schedule(schedule: str, p: int, m: int, v: int = 1) -> tuple:
    """sim/parallel/pipeline/schedules.py ``build`` as tuples (its actions are immutable), built once per shape:
    a search asks for the same shapes for memory (the peak of live blocks) and for time."""
    from distlab.sim.parallel.pipeline import schedules as S
    return S.built(schedule, p, m, v)


@lru_cache(maxsize=512)
def compiled_schedule(schedule: str, p: int, m: int, v: int = 1) -> Compiled:
    """The order :func:`run_schedule` evaluates (receives on demand for gpipe and 1f1b, early otherwise, as
    sim/parallel/pipeline/plan.py posts them with recv auto)."""
    from distlab.sim.parallel.pipeline import schedules as S
    per_rank = built_schedule(schedule, p, m, v)
    n_stages, on_demand = p * v, S.normalise(schedule) in ("gpipe", "1f1b")
    placement = [0] * n_stages
    for r, acts in enumerate(per_rank):
        for a in acts:
            placement[a.stage] = r
    index: dict[tuple, int] = {}           # action (stage, kind, mb) -> its place in the order
    links: dict[tuple, int] = {}
    order, actions, last_b = [], [], [0] * n_stages
    pos = [0] * p
    remaining = sum(len(a) for a in per_rank)
    while remaining:
        moved = False
        for r in range(p):
            acts, i, n = per_rank[r], pos[r], len(per_rank[r])
            while i < n:
                a = acts[i]
                stage, kind, mb = a
                src = stage - 1 if kind == "F" else stage + 1
                dep = link = -1
                if 0 <= src < n_stages:
                    d = index.get((src, kind, mb))
                    if d is None:
                        break
                    if placement[src] != r:
                        dep, link = d, links.setdefault((placement[src], r), len(links))
                k = index[a] = len(order)
                if kind == "B":
                    last_b[stage] = k
                order.append((r, dep, link))
                actions.append((kind, stage, mb))
                i += 1
            if i > pos[r]:
                remaining -= i - pos[r]
                pos[r] = i
                moved = True
        if not moved:
            raise ValueError("pipeline schedule deadlocked in the estimate")
    return Compiled(tuple(order), tuple(actions), tuple(sorted(links, key=links.get)), tuple(last_b),
                    tuple(placement), p, on_demand,
                    tuple((*o, 2 * s + (kind == "B")) for o, (kind, s, _) in zip(order, actions)))


def run_stages(c: Compiled, durations: list, hops: list) -> tuple[list, list]:
    """:func:`run_schedule` with one duration per stage and kind (``durations[slot]``: F and B of each stage in
    turn) and one per link (``hops[link]``), read in place instead of listed per action: the same sums in the
    same order (sim/planner/step.py walks every pipeline layout so)."""
    done: list = []
    finish = done.append
    ready = [0.0] * c.ranks
    link_free = [0.0] * len(c.links)
    on_demand = c.on_demand
    for r, dep, link, slot in c.rows:
        start = ready[r]
        if dep >= 0:
            begin = done[dep]
            free = link_free[link]
            if free > begin:
                begin = free
            if on_demand and start > begin:
                begin = start
            arrive = link_free[link] = begin + hops[link]
            if arrive > start:
                start = arrive
        end = ready[r] = start + durations[slot]
        finish(end)
    return [done[i] for i in c.last_b], ready


def run_schedule(c: Compiled, seconds: list, message_s: list, after_s: dict | None = None) -> tuple[list, list]:
    """The schedule ``c`` with ``seconds[i]`` for action i (``c.actions[i]``) and ``message_s[i]`` for the message
    it receives (read where it receives one); ``after_s[i]``: seconds its rank stays busy after action i without
    delaying its output (a stage's gradient reduction after its last backward, run in line). Returns (per stage
    the end of its last backward, per rank the end of its last action)."""
    done = [0.0] * len(c.order)
    ready = [0.0] * c.ranks
    link_free = [0.0] * len(c.links)
    on_demand = c.on_demand
    after_s = after_s or {}
    for i, (r, dep, link) in enumerate(c.order):
        start = ready[r]
        if dep >= 0:
            begin = done[dep]
            if link_free[link] > begin:
                begin = link_free[link]
            if on_demand and start > begin:
                begin = start
            arrive = link_free[link] = begin + message_s[i]
            if arrive > start:
                start = arrive
        done[i] = ready[r] = start + seconds[i]
        if i in after_s:
            ready[r] += after_s[i]
    return [done[i] for i in c.last_b], ready
