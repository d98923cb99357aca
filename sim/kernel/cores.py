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
(runtime/measure/compute_probe.py), so the sharing is in both terms of the ratio and is not counted twice.
Communication interference (the cluster's ``comm_interference`` = K, the reverse direction): while compute
runs on a pool (a node's cores; with ``cores=None`` the rank's GPU) that holds one of a collective's simulated
members, the collective progresses K times slower (rate 1/K; gloo's threads wait for cores the compute ranks
hold, NCCL kernels for SMs). ``CommSlowdown``: the network part of the collective runs as before (t_net of
network time); the time it could not progress, L = (1 - 1/K) x (seconds during it with compute running), is
then still owed and runs at 1/K while compute runs, 1 otherwise, so the collective ends when the integral of
its rate reaches t_net (the fluid model, exact for a collective alone on its links; a collective sharing links
with others keeps its network share as computed without the slowdown). K is calibrated as an all_reduce's
time with every rank computing over its time alone (runtime/measure/compute_probe.py), in the same rounds that
measure I: the probe's overlapped phase has compute at 1/I and communication at 1/K, which is what the
simulator then applies, each factor to one side, and neither counts core sharing between compute ops
(the all_reduce alone has no compute; compute is shared in both of its rates).
``cores=None``: no sharing (each op has its own core or GPU), only interference.

Communication CPU work (the cluster's ``comm_cpu_s`` = a and ``comm_cpu_s_per_byte`` = b; CPU clusters only):
a gloo collective's own threads (gloo's pair/IO threads that copy, reduce and move the buffers) burn
w = a + b x bytes seconds of one core on each member rank, while that rank's main thread is blocked and holds
no core. The engine runs w as one more job per member on its node's SharedCores, under the same processor
sharing as the compute ops (so it takes cores the other ranks' compute then lacks), beside the collective's
network part; the collective ends when both are done. The job is not slowed by I (it is not the rank's compute)
and counts as running work for K. Calibrated per call as process CPU minus main-thread CPU around the collective
(``time.process_time() - time.thread_time()``: gloo's threads only; runtime/parallel/tp/calibrate.py), a robust median,
a least-squares line over the sizes (runtime/parallel/tp/fit.py). Not counted twice: I and K are the probe-fitted lumped
form of the same effect (runtime/measure/compute_probe.py: validate's overlap case, DDP); a cluster fitted with a, b (the
TP calibration) keeps I = K = 1, and one with I or K from the probe keeps a = b = 0. A send/recv carries the same
w on both ends (gloo's threads move it too; calibrated on collectives only: an assumption).
"""
from __future__ import annotations

import itertools
import math

EPS = 1e-12     # seconds of work below which an op counts as done (float error of the updates)


def comm_cpu_seconds(cluster, nbytes: float) -> float:
    """CPU seconds of one core that a collective of ``nbytes`` costs each member rank: comm_cpu_s +
    comm_cpu_s_per_byte x nbytes (module docstring; 0 on the presets)."""
    return cluster.comm_cpu_s + cluster.comm_cpu_s_per_byte * nbytes


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
        self.listeners: set = set()                # CommSlowdowns of collectives in flight on this pool

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
        for listener in list(self.listeners):
            listener.update()
        self.version += 1
        if self.remaining:
            share = self.rate()
            wake = self.env.timeout(min(left / self.op_rate(op, share) for op, left in self.remaining.items()))
            wake.callbacks.append(lambda _, version=self.version: self._wake(version))

    def _wake(self, version: int) -> None:
        if version == self.version:           # no op started or ended since this wake-up was set
            self._advance()
            self._finish_and_reschedule()


class CommSlowdown:
    """One collective in flight under communication interference ``factor`` (K, module docstring): created when
    it starts, with the pools of its simulated members; ``finish()`` (a simpy generator, after its network
    part) waits for the time it lost while compute ran on any of them."""

    def __init__(self, env, pools: list, factor: float):
        self.env, self.pools, self.factor = env, pools, factor
        self.lost = 0.0                     # seconds of network time not done: (1 - 1/K) x busy seconds
        self.since = env.now
        self.busy = any(p.remaining for p in pools)
        self.changed = env.event()          # succeeds when compute starts on idle pools or ends on all of them
        for p in pools:
            p.listeners.add(self)

    def update(self) -> None:
        """A pool's op started or ended: book the time since the last update, then note the new state."""
        if self.busy:
            self.lost += (1 - 1 / self.factor) * (self.env.now - self.since)
        self.since = self.env.now
        busy = any(p.remaining for p in self.pools)
        if busy != self.busy:
            self.busy = busy
            event, self.changed = self.changed, self.env.event()
            event.succeed()

    def finish(self):
        self.update()
        left = self.lost
        while left > max(EPS, 4 * math.ulp(self.env.now)):      # below that, now + left == now: done
            rate = 1 / self.factor if self.busy else 1.0
            t0 = self.env.now
            yield self.env.any_of([self.env.timeout(left / rate), self.changed])
            left -= (self.env.now - t0) * rate
        for p in self.pools:
            p.listeners.discard(self)
