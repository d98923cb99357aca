"""Collectives of one process group issued in plan order from several threads (runtime/execute/executor.py on CPU, where
each plan stream is a thread).

Gloo matches collectives by the order they are issued on a group (ProcessGroupGloo's tags count them), so two
threads issuing on one group must issue in the same order on every rank: the plan's. The n-th collective of a
group waits until the (n-1)-th was issued (not finished: the group's own worker threads run them, at most two at
once, sim/kernel/communicators.py).

    order = IssueOrder(timeout=60.0)
    work = order.issue(lambda: dist.all_reduce(t, group=g, async_op=True), comm, n)
"""
from __future__ import annotations

import threading
from collections import defaultdict


class IssueOrder:
    """Per process group (any hashable key with a ``label()``): the n-th collective waits until the (n-1)-th was
    issued. ``reset()`` before each run of the plan."""

    def __init__(self, timeout: float):
        self.cond = threading.Condition()
        self.next: dict = defaultdict(int)
        self.timeout = timeout

    def reset(self) -> None:
        self.next.clear()

    def issue(self, start, comm, n: int):
        with self.cond:
            if not self.cond.wait_for(lambda: self.next[comm] >= n, self.timeout):
                raise TimeoutError(f"waited more than {self.timeout:g} s to issue collective #{n} on group "
                                   f"{comm.label()}")
        try:
            return start()
        finally:
            with self.cond:
                self.next[comm] = n + 1
                self.cond.notify_all()
