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
- Looped BFS (torch ``ScheduleLoopedBFS``, 2211.05953): v stages per rank in a loop (stage s on rank s % p); each
  rank runs all m forwards of its stages in increasing stage order, then all backwards of its stages in
  decreasing stage order, microbatches in reverse (m-1 first).
"""
from __future__ import annotations

from distlab.sim.pipeline.action import Action


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
