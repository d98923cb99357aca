"""The network's steps without a simpy event per step: every collective's steps advanced in one loop, exactly as
step by step.

sim/kernel/network.py's reference path moves each step of a collective as a batch in simpy: the step waits its latency
(a timer), joins the network, its flows share the links max-min fairly with every other batch's, the rates are
recomputed whenever a flow ends or a batch joins, and the collective's process issues the next step when the
batch ends. Here the network owns each collective's remaining steps (``StepLoop.run``: one simpy event when the
last step ends) and advances all of them in one loop over the same events (a batch joining after its latency, a
flow ending; ``_advance``), with the same arithmetic: at each event every active flow's remaining bytes drop by
rate x elapsed time, and a flow ends when no bytes are left, or fewer than the clock's float resolution would
move (Network._run's tolerance).

Simpy only sees the collectives' ends: nothing else can start a transfer before the next event in simpy's queue
(``env.peek()``), so the loop advances every network event up to that instant at once, and sleeps until its next
own event or until a transfer starts (``_kick``). A step alone on the network is one loop iteration per phase, so
this also runs a collective alone at once (what sim/kernel/solo.py did with profiles).

Flows of a step that have the same size and have had the same rate at every event so far have the same bytes left:
the loop keeps one number per such group (sim/kernel/flowgroups.py; a ring step is one group), split when their rates
differ. Rates per set of active groups and their ended groups are cached.
The times are the step-by-step run's up to rounding (tests/test_netloop.py, tests/test_solo.py: 1e-9 relative).
"""
from __future__ import annotations

import numpy as np

from distlab.sim.kernel.flowgroups import INF, Groups, initial, wide_move, wide_time

class _Sequence:
    __slots__ = ("steps", "k", "done")

    def __init__(self, steps: list, done):
        self.steps, self.k, self.done = steps, 0, done


class _Batch:
    """A step on the network: its sequence, groups, and per group: bytes left, rate, the end test's threshold
    (1e-9 x max(size, 1), Network._run's); ended groups (bit mask)."""
    __slots__ = ("seq", "groups", "left", "threshold", "rates", "done", "flows")

    def __init__(self, seq, start: tuple, flows: int):
        self.seq, self.flows, self.rates = seq, flows, None
        self.groups, self.threshold, left, self.done = start
        self.left = left.copy()


class StepLoop:
    """The steps of every collective in flight on ``net`` (a sim.network.Network), advanced together."""

    def __init__(self, net):
        self.net, self.env = net, net.env
        self.now = net.env.now        # the time of the last network event
        self.batches: list[_Batch] = []
        self.pending: list[tuple[float, _Sequence]] = []     # steps waiting their latency: (join time, sequence)
        self.sequences = 0
        self.stale = True             # the rates need looking up
        self._starts: dict = {}       # (pairs, sizes) -> a step's groups and bytes at its start (see _start)
        self._partitions: dict = {}   # (pairs, grouping) -> its Groups
        self._rates: dict = {}        # active groups and their ended groups -> rates per group (and splits)
        self._kick = self.env.event()
        self.env.process(self._process())

    def run(self, steps: list):
        """Start ``steps`` ((pairs, sizes, latency or None), one after another) now; returns the event of the
        last one's end."""
        done = self.env.event()
        if not steps:
            done.succeed()
            return done
        seq = _Sequence(steps, done)
        self.sequences += 1
        ended = []
        self._issue(seq, max(self.env.now, self.now), ended)
        for s in ended:                # steps that move nothing and wait no latency end at once
            s.done.succeed()
        if not self._kick.triggered:
            self._kick.succeed()
        return done

    def _process(self):
        env = self.env
        while True:
            if not self.sequences:
                self._kick = env.event()
                yield self._kick
                continue
            ended = self._advance(env.peek())
            if ended:
                if self.now > env.now:
                    yield env.timeout(self.now - env.now)
                for s in ended:
                    s.done.succeed()
                continue
            t = self._next_event()
            self._kick = env.event()
            yield self._kick if t == INF else env.timeout(t - env.now) | self._kick

    def _issue(self, seq: _Sequence, t: float, ended: list) -> None:
        """Start seq's step k at ``t``: it joins after its latency (at once if none and the network's state is
        at ``t``; else the loop first moves the others' flows up to ``t``)."""
        pairs, sizes, latency = seq.steps[seq.k]
        latency = pairs.latency if latency is None else latency
        if latency > 0 or t > self.now:
            self.pending.append((t + latency, seq))
        else:
            self._join(seq, ended)

    def _join(self, seq: _Sequence, ended: list) -> None:
        pairs, sizes, _ = seq.steps[seq.k]
        b = _Batch(seq, self._start(pairs, sizes), len(pairs))
        if b.done == b.groups.all_done:          # nothing to move
            self._finish(b, ended)
        else:
            self.batches.append(b)
            self.stale = True

    def _finish(self, b: _Batch, ended: list) -> None:
        self.net.flows_done += b.flows
        seq = b.seq
        seq.k += 1
        if seq.k == len(seq.steps):
            self.sequences -= 1
            ended.append(seq)
        else:
            self._issue(seq, self.now, ended)

    def _next_event(self) -> float:
        """The time of the next network event: a flow's end at the current rates, or a step joining."""
        if self.stale:
            self._lookup()
        t = self.now + min([wide_time(b.left, b.rates) if b.groups.wide else
                            min([x / r for x, r in zip(b.left, b.rates) if r > 0], default=INF)
                            for b in self.batches], default=INF)
        return min([t] + [p[0] for p in self.pending])

    def _advance(self, horizon: float) -> list:
        """Every network event up to ``horizon``, stopping after one where a sequence ends; returns those that
        ended (at self.now)."""
        ended: list = []
        batches, pending = self.batches, self.pending
        now = self.now
        while batches or pending:
            if self.stale:
                self._lookup()
            dt = INF
            for b in batches:
                if b.groups.wide:
                    x = wide_time(b.left, b.rates)
                    if x < dt:
                        dt = x
                    continue
                for x, r in zip(b.left, b.rates):
                    if r > 0:
                        x = x / r
                        if x < dt:
                            dt = x
            t = now + dt
            joins = INF
            for p in pending:
                if p[0] < joins:
                    joins = p[0]
            if joins < t:
                t = joins
            if t > horizon or t == INF:
                break
            if t > now:                        # every flow moves rate x elapsed; those with nothing left end
                elapsed = t - now
                now = self.now = t
                tol = max(t, 1e-9) * 1e-12
                finished = None
                for b in batches:
                    if b.groups.wide:
                        done = wide_move(b, elapsed, tol)
                    else:
                        left, threshold, done, g = b.left, b.threshold, b.done, 0
                        for r in b.rates:
                            if r > 0:
                                x = left[g] = left[g] - r * elapsed
                                if x <= threshold[g] or x <= r * tol:
                                    left[g] = 0.0
                                    done |= 1 << g
                            g += 1
                    if done != b.done:
                        b.done = done
                        self.stale = True
                        if done == b.groups.all_done:
                            finished = [b] if finished is None else finished + [b]
                if finished:
                    for b in finished:
                        batches.remove(b)
                    for b in finished:
                        self._finish(b, ended)
            if joins <= t:                     # steps whose latency is over join
                if len(pending) == 1:
                    due = [pending.pop()]
                else:
                    due = [p for p in pending if p[0] <= t]
                    pending[:] = [p for p in pending if p[0] > t]
                for _, seq in due:
                    self._join(seq, ended)
            if ended:
                break
        return ended

    def _start(self, pairs, sizes) -> tuple:
        """(groups, thresholds, bytes left, ended groups) of a step at its start: flows grouped by size (one group
        where every flow moves the same bytes); cached per (pairs, sizes object): a collective's steps share their
        arrays. A step without flows ends when it joins."""
        if not len(pairs):
            return self._uniform(pairs, 0.0)
        if isinstance(sizes, (list, tuple)):
            sizes = np.asarray(sizes, dtype=float)
        if not isinstance(sizes, np.ndarray) or not sizes.ndim:
            return self._uniform(pairs, float(sizes))
        hit = self._starts.get(("array", id(pairs), id(sizes)))
        if hit is not None and hit[0] is pairs and hit[1] is sizes:
            return hit[2]
        flat = np.broadcast_to(sizes.astype(float, copy=False), (len(pairs),))
        if (flat == flat[0]).all():
            start = self._uniform(pairs, float(flat[0]))
        else:                                  # the same sizes in another array (a protocol's stretch): one start
            key = ("bytes", id(pairs), flat.tobytes())
            hit = self._starts.get(key)
            if hit is not None and hit[0] is pairs:
                start = hit[2]
            else:
                values, gid = np.unique(flat, return_inverse=True)
                start = initial(self._groups(pairs, gid.astype(np.int64).reshape(-1), len(values)), values.tolist())
                self._remember(key, (pairs, None, start))
        self._remember(("array", id(pairs), id(sizes)), (pairs, sizes, start))
        return start

    def _uniform(self, pairs, size: float) -> tuple:
        """The start of a step whose flows all move ``size`` bytes: one group."""
        groups = self._groups(pairs, None, 1)
        if groups.wide:
            return initial(groups, [size])
        return groups, [1e-9 * max(size, 1.0)], [max(size, 0.0)], 1 if size <= 0 else 0

    def _groups(self, pairs, gid, n: int) -> Groups:
        """One Groups object per (pairs, grouping) for the whole run (``gid`` None: one group): the cached rates
        are keyed on it."""
        key = (id(pairs), None if gid is None else gid.tobytes())
        hit = self._partitions.get(key)
        if hit is not None and hit.pairs is pairs:
            return hit
        if len(self._partitions) > 65536:
            self._partitions.clear()           # safe: the rate cache holds the groups its keys name
        groups = self._partitions[key] = Groups(pairs, np.zeros(len(pairs), dtype=np.int64) if gid is None else gid,
                                                n)
        return groups

    def _remember(self, key, value) -> None:
        if len(self._starts) > 4096:
            self._starts.clear()
        self._starts[key] = value

    def _lookup(self) -> None:
        """The rate of every active group (Network._rates on the flows alive), splitting groups whose flows got
        different rates; cached per (groups, ended groups) of the active batches."""
        batches = self.batches
        if not batches:
            self.stale = False
            return
        key = tuple([(id(b.groups), b.done) for b in batches]) if len(batches) > 1 else \
            (id(batches[0].groups), batches[0].done)
        hit = self._rates.get(key)
        if hit is None:
            rates = self.net._rates([(b.groups.pairs, b.groups.alive(b.done)) for b in batches])
            splits = [b.groups.split(r, b.done) for b, r in zip(batches, rates)]
            hit = ([b.groups for b in batches],                  # held: their ids stay theirs
                   splits, any(parent is not None for _, parent, _, _ in splits))
            if len(self._rates) > 4096:
                self._rates.clear()
            self._rates[key] = hit
        if hit[2]:                             # groups split: the next look-up is for the new groups
            for b, (groups, parent, done, rates) in zip(batches, hit[1]):
                if parent is not None:
                    left, threshold = b.left, b.threshold
                    if groups.wide:
                        b.left, b.threshold = np.asarray(left)[parent], np.asarray(threshold)[parent]
                    else:
                        b.left, b.threshold = [left[p] for p in parent], [threshold[p] for p in parent]
                    b.groups, b.done = groups, done
                b.rates = rates
            return
        for b, split in zip(batches, hit[1]):
            b.rates = split[3]
        self.stale = False
