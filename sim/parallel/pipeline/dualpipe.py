"""DualPipeV and Looped BFS: per-rank steps in the order torch 2.13's ``ScheduleDualPipeV`` and
``ScheduleLoopedBFS`` (torch/distributed/pipelining/schedules.py) execute them.

A step is a tuple of actions: one action, or an (F, B) pair that torch marks ``OVERLAP_F_B`` (its sub-actions:
a forward of one microbatch beside the full backward of another, DualPipe's overlap, DeepSeek-V3 2412.19437
section 3.2.1). torch 2.13's runtime runs the pair's sub-actions one after the other, F then B, unless a custom
function is registered for OVERLAP_F_B; its lowering (``_add_send_recv``) starts the pair only when both inputs
have arrived and sends both outputs after the pair. ``schedules.build`` flattens the steps in that order.

- DualPipeV (torch ``ScheduleDualPipeV``, after deepseek-ai/DualPipe): two stages per rank in a V (rank r holds
  stages r and 2p-1-r), m >= 2p. Per rank, with s0 = r, s1 = 2p-1-r, in eight phases: 2(p-r-1) F(s0);
  r+1 x [F(s0) F(s1)]; p-r-1 x [I(s1) W(oldest pending) F(s1)]; m-2p+r+1 x [F(s0)+B(s1), F(s1)+B(s0)] (overlapped;
  the last rank's first pair runs plain); p-r-1 x [B(s1), F(s1)+B(s0)]; r+1 x [B(s1) B(s0)], switching to I at
  the middle one (s1 first on odd ranks, s0 first on even ones); p-r-1 x [W(pending), B or I (s0)]; r+1 x W.
- DualPipe's overlap (DeepSeek-V3 2412.19437 sec. 3.2.1, Figure 4), modelled where a chunk has communication
  of its own (expert parallelism's all-to-alls, sim/parallel/ep/plan.py): ``overlapped_ops`` runs the pair's chunks as
  alternating segments (a segment = compute, then the collectives that follow it): F.0, B.0, F.1, B.1, ... on
  the compute stream, each chunk's collectives on their own stream, so the all-to-all of one chunk runs while
  the other computes. With per-chunk segments compute c_k and communication a_k, the serial pair takes
  Σ c + Σ a; the overlapped pair Σ c when every a_k fits in the other chunk's next compute. The GPU's SMs are not
  shared out (DeepSeek gives 20 of 132 to communication; that slowdown is left out). ``serial_ops`` is the
  plain order: compute waits for each collective.
- Looped BFS (torch ``ScheduleLoopedBFS``, 2211.05953): v stages per rank in a loop (stage s on rank s % p); each
  rank runs all m forwards of its stages in increasing stage order, then all backwards of its stages in
  decreasing stage order, microbatches in reverse (m-1 first).
"""
from __future__ import annotations

from distlab.sim.parallel.pipeline.action import Action
from distlab.sim.plan import Collective, Record, Wait


def looped_bfs(r: int, p: int, m: int, v: int) -> list[tuple[Action, ...]]:
    """Looped BFS steps of rank r (torch ``ScheduleLoopedBFS._calculate_single_rank_operations``)."""
    stages = range(r, p * v, p)
    forwards = [(Action(s, "F", i),) for s in stages for i in range(m)]
    return forwards + [(Action(s, "B", i),) for s in reversed(stages) for i in reversed(range(m))]


def dualpipe_v(r: int, p: int, m: int) -> list[tuple[Action, ...]]:
    """DualPipeV steps of rank r (torch ``ScheduleDualPipeV._calculate_single_rank_operations``). A full B
    advances the stage's I and W counters both; an I queues its W, and W's run oldest first."""
    s0, s1 = r, 2 * p - 1 - r
    count: dict[tuple[int, str], int] = {}
    pending_w: list[Action] = []
    steps: list[tuple[Action, ...]] = []

    def make(stage: int, kind: str) -> Action:
        key = (stage, "I" if kind == "B" else kind)
        action = Action(stage, kind, count.get(key, 0))
        count[key] = action.mb + 1
        if kind == "I":
            pending_w.append(Action(stage, "W", action.mb))
        return action

    def one(stage: int, kind: str) -> None:
        steps.append((make(stage, kind),))

    def overlap(f_stage: int, b_stage: int) -> None:
        steps.append((make(f_stage, "F"), make(b_stage, "B")))

    def weight() -> None:
        if pending_w:
            steps.append((pending_w.pop(0),))

    for _ in range(2 * (p - r - 1)):
        one(s0, "F")
    for _ in range(r + 1):
        one(s0, "F"), one(s1, "F")
    for _ in range(p - r - 1):
        one(s1, "I"), weight(), one(s1, "F")
    for i in range(m - 2 * p + r + 1):
        if i == 0 and r == p - 1:          # torch: "we don't overlap these two chunks to further reduce bubble"
            one(s0, "F"), one(s1, "B")
        else:
            overlap(s0, s1)
        overlap(s1, s0)
    for _ in range(p - r - 1):
        one(s1, "B"), overlap(s1, s0)
    zero_bubble = False
    for i in range(r + 1):
        if i == (r + 1) // 2 and r % 2 == 1:
            zero_bubble = True
        one(s1, "I" if zero_bubble else "B")
        if i == (r + 1) // 2 and r % 2 == 0:
            zero_bubble = True
        one(s0, "I" if zero_bubble else "B")
    for _ in range(p - r - 1):
        weight(), one(s0, "I" if zero_bubble else "B")
    for _ in range(r + 1):
        weight()
    return steps


def serial_ops(items: list, tag: str) -> list:
    """A chunk's ops (Computes on ``compute``, Collectives on their own streams) with compute waiting for each
    collective: Record, Wait on the collective's stream, the collective, Record, Wait on compute."""
    ops = []
    for k, op in enumerate(items):
        if isinstance(op, Collective):
            ops += [Record(f"{tag} c{k}", "compute"), Wait(f"{tag} c{k}", op.stream), op,
                    Record(f"{tag} d{k}", op.stream), Wait(f"{tag} d{k}", "compute")]
        else:
            ops.append(op)
    return ops


def segments(items: list) -> list[tuple[list, list]]:
    """(computes, collectives that follow them) in order; a chunk that starts with a collective has an empty
    first compute."""
    out: list[tuple[list, list]] = []
    for op in items:
        if isinstance(op, Collective):
            if not out:
                out.append(([], []))
            out[-1][1].append(op)
        elif not out or out[-1][1]:
            out.append(([op], []))
        else:
            out[-1][0].append(op)
    return out


def overlapped_ops(f_items: list, b_items: list, f_tag: str, b_tag: str) -> list:
    """DualPipe's overlapped pair: segments of F and B alternate on the compute stream (F first); a segment's
    compute waits for its own chunk's previous collectives, not for the other chunk's."""
    ops, chunks = [], [(segments(f_items), f_tag), (segments(b_items), b_tag)]
    pending: dict[str, str | None] = {f_tag: None, b_tag: None}
    for k in range(max(len(chunks[0][0]), len(chunks[1][0]))):
        for segs, tag in chunks:
            if k >= len(segs):
                continue
            computes, colls = segs[k]
            if pending[tag]:
                ops.append(Wait(pending[tag], "compute"))
                pending[tag] = None
            ops += computes
            if colls:
                ops += [Record(f"{tag} c{k}", "compute"), Wait(f"{tag} c{k}", colls[0].stream)] + colls
                ops.append(Record(f"{tag} d{k}", colls[-1].stream))
                pending[tag] = f"{tag} d{k}"
    for tag in (f_tag, b_tag):
        if pending[tag]:
            ops.append(Wait(pending[tag], "compute"))
    return ops
