"""CPU cores shared by the ranks of one node: compute ops under processor sharing.

When a node runs more ranks than it has cores (CPU ranks on a laptop, ``cpu_cores`` in the cluster), a fair
OS scheduler gives each of the k ranks that want a core min(1, cores / k) of one. The fluid version of that is
processor sharing, round robin in the limit of small time slices (L. Kleinrock, "Time-shared systems: a
theoretical treatment", J. ACM 14(2), 1967): every running compute op advances
at rate min(1, cores / k) seconds of work per second, recomputed whenever an op starts or ends. An op of w
seconds alone takes w; k > cores ops started together take w x k / cores. Ranks blocked in a receive or a
collective hold no core (gloo waits on a condition variable). Left out: time slices and cache effects.

Interference (the cluster's ``interference`` = I): while a collective is in flight on a rank, that rank's
compute advances I times slower (rate share / I; gloo's threads take cores, NCCL's kernels SMs and HBM
bandwidth), recomputed when the collective starts and ends. The two effects are separate: the share counts
compute ops competing with each other, I the communication threads that this sharing leaves out, and I is
calibrated as compute with vs without an all_reduce in flight with every rank computing in both
(runtime/compute_probe.py), so the sharing is in both terms of the ratio and is not counted twice.
``cores=None``: no sharing (each op has its own core or GPU), only interference.
"""
from __future__ import annotations

import itertools
import math

EPS = 1e-12     # seconds of work below which an op counts as done (float error of the updates)


class SharedCores:
    """The cores of one node (or one rank's GPU, ``cores=None``). ``run(seconds, rank)`` is a simpy generator:
    the caller resumes when its op is done; ``communicating(rank, +1 / -1)`` marks a collective of that rank
    starting / ending."""

    def __init__(self, env, cores: float | None, interference: float = 1.0):
        self.env, self.cores, self.interference = env, cores, interference
        self.remaining: dict[int, float] = {}      # op id -> seconds of work left
        self.rank_of: dict[int, object] = {}       # op id -> its rank
        self.in_flight: dict[object, int] = {}     # rank -> collectives in flight
        self.done: dict[int, object] = {}          # op id -> event that resumes its stream
        self.updated = 0.0
        self.version = 0
        self.ids = itertools.count()

    def rate(self) -> float:
        """Seconds of work per second of each op from core sharing alone: min(1, cores / running ops)."""
        if self.cores is None or not self.remaining:
            return 1.0
        return min(1.0, self.cores / len(self.remaining))

    def op_rate(self, op: int, share: float) -> float:
        """``share``, divided by the interference while a collective of the op's rank is in flight."""
        return share / self.interference if self.in_flight.get(self.rank_of[op]) else share

    def run(self, seconds: float, rank=None):
        self._advance()
        op = next(self.ids)
        self.remaining[op] = seconds
        self.rank_of[op] = rank
        self.done[op] = ev = self.env.event()
        self._finish_and_reschedule()
        yield ev

    def communicating(self, rank, delta: int) -> None:
        """A collective of ``rank`` starts (+1) or ends (-1): that rank's running compute changes speed."""
        self._advance()
        self.in_flight[rank] = self.in_flight.get(rank, 0) + delta
        self._finish_and_reschedule()

    def _advance(self) -> None:
        """Take the work done since the last update off every running op."""
        elapsed, share = self.env.now - self.updated, self.rate()
        if elapsed > 0:
            for op in self.remaining:
                self.remaining[op] -= elapsed * self.op_rate(op, share)
        self.updated = self.env.now

    def _finish_and_reschedule(self) -> None:
        # work that would end within a few ulps of the clock cannot be waited for (now + it == now): done
        done_below = max(EPS, 4 * math.ulp(self.env.now) * self.rate())
        for op in [op for op, left in self.remaining.items() if left <= done_below]:
            del self.remaining[op], self.rank_of[op]
            self.done.pop(op).succeed()
        self.version += 1
        if self.remaining:
            share = self.rate()
            wake = self.env.timeout(min(left / self.op_rate(op, share) for op, left in self.remaining.items()))
            wake.callbacks.append(lambda _, version=self.version: self._wake(version))

    def _wake(self, version: int) -> None:
        if version == self.version:           # no op started or ended since this wake-up was set
            self._advance()
            self._finish_and_reschedule()
