"""CPU cores shared by the ranks of one node: compute ops under processor sharing.

When a node runs more ranks than it has cores (CPU ranks on a laptop, ``cpu_cores`` in the cluster), a fair
OS scheduler gives each of the k ranks that want a core min(1, cores / k) of one. The fluid version of that is
processor sharing, round robin in the limit of small time slices (L. Kleinrock, "Time-shared systems: a
theoretical treatment", J. ACM 14(2), 1967): every running compute op advances
at rate min(1, cores / k) seconds of work per second, recomputed whenever an op starts or ends. An op of w
seconds alone takes w; k > cores ops started together take w x k / cores. Ranks blocked in a receive or a
collective hold no core (gloo waits on a condition variable). Left out: time slices, cache effects, and the
CPU time of the communication threads themselves.
"""
from __future__ import annotations

import itertools
import math

EPS = 1e-12     # seconds of work below which an op counts as done (float error of the updates)


class SharedCores:
    """The cores of one node. ``run(seconds)`` is a simpy generator: the caller resumes when its op is done."""

    def __init__(self, env, cores: int):
        self.env, self.cores = env, cores
        self.remaining: dict[int, float] = {}      # op id -> seconds of work left
        self.done: dict[int, object] = {}          # op id -> event that resumes its stream
        self.updated = 0.0
        self.version = 0
        self.ids = itertools.count()

    def rate(self) -> float:
        return min(1.0, self.cores / len(self.remaining)) if self.remaining else 1.0

    def run(self, seconds: float):
        self._advance()
        op = next(self.ids)
        self.remaining[op] = seconds
        self.done[op] = ev = self.env.event()
        self._finish_and_reschedule()
        yield ev

    def _advance(self) -> None:
        """Take the work done since the last update off every running op."""
        elapsed, rate = self.env.now - self.updated, self.rate()
        if elapsed > 0:
            for op in self.remaining:
                self.remaining[op] -= elapsed * rate
        self.updated = self.env.now

    def _finish_and_reschedule(self) -> None:
        # work that would end within a few ulps of the clock cannot be waited for (now + it == now): done
        done_below = max(EPS, 4 * math.ulp(self.env.now) * self.rate())
        for op in [op for op, left in self.remaining.items() if left <= done_below]:
            del self.remaining[op]
            self.done.pop(op).succeed()
        self.version += 1
        if self.remaining:
            wake = self.env.timeout(min(self.remaining.values()) / self.rate())
            wake.callbacks.append(lambda _, version=self.version: self._wake(version))

    def _wake(self, version: int) -> None:
        if version == self.version:           # no op started or ended since this wake-up was set
            self._advance()
            self._finish_and_reschedule()
