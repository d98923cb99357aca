"""A collective's steps run at once while nothing else is on the network, exactly as step by step.

sim/network.py moves each step of a collective as one batch: the step waits its latency, then its flows share
the links max-min fairly, their rates recomputed whenever one of them ends. A batch alone on the network (no
other batch active) follows a course that depends on the batch alone: phases of constant rates, each ending
when a flow finishes (``profile``: the same arithmetic as Network._run, made once per distinct step). So
while no other batch is active, a collective's remaining steps end at t + sum over steps of (latency + the
sum of its phases), and the engine need not run them one by one (one timer instead of thousands of events
for a 1024-rank ring).

Another batch starting interrupts this (sim/network.py ``_start`` fires ``net._solo``): at that instant the
state of the full simulation is rebuilt from the profiles (the steps before the current one ended; the
current one still waiting its latency, or in phase p with remaining = remaining at p's start - rates_p x
time since) and the current step joins the network as an ordinary batch, first in the active list (it
started before the newcomer); the steps after it run as before. The times are the step-by-step simulation's
up to rounding (sums of the same terms in another order, and the end-of-flow tolerance of Network._run taken
at the profile's time: tests/test_solo.py, 1e-9 relative).
"""
from __future__ import annotations

from bisect import bisect_right

import numpy as np

ENABLED = True       # tests/test_solo.py compares with the step-by-step run (False)


def profile(net, pairs, sizes: np.ndarray):
    """(duration, phases) of one step's flows alone on the network after its latency; phases: (start offset,
    rates, remaining at that start). None if a flow could never finish (then the step runs step by step)."""
    key = (id(pairs), sizes.tobytes())
    hit = net._profiles.get(key)
    if hit is not None and hit[0] is pairs:
        return hit[1]
    remaining = sizes.copy()
    done = sizes <= 0
    phases, t = [], 0.0
    while not done.all():
        rates = net._rates([(pairs, remaining > 0)])[0]
        dt = float(np.min(np.where(rates > 0, remaining / np.where(rates > 0, rates, 1), np.inf)))
        if not np.isfinite(dt):
            net._profiles[key] = (pairs, None)
            return None
        phases.append((t, rates, remaining))
        remaining = remaining - rates * dt
        t += dt
        tol = max(net.env.now + t, 1e-9) * 1e-12          # Network._run's end-of-flow tolerance
        just = ~done & ((remaining <= 1e-9 * np.maximum(sizes, 1.0)) | (remaining <= rates * tol))
        remaining[just] = 0.0
        done = done | just
    out = (t, phases)
    if len(net._profiles) > 4096:
        net._profiles.clear()
    net._profiles[key] = (pairs, out)
    return out


def run_steps(net, steps):
    """Generator for a simpy process: the steps (pairs, sizes, latency or None) one after another, at once
    while the network is otherwise idle (module docstring), else as batches of the network. The steps run at
    once are 2, 4, 8, ... while no other batch interrupts (2 again after one does), so the profiles made ahead
    are at most twice those used."""
    steps = steps if isinstance(steps, list) else list(steps)
    course = _Course()
    k, span = 0, 2
    while k < len(steps):
        if ENABLED and not net.record and not net._active and net._solo is None:
            if course.extend(net, steps, k + span) >= k + 2:      # two steps or more: else a batch costs less
                k, whole = yield from _alone(net, steps, course, k, k + span)
                span = 2 * span if whole else 2
                continue
        yield net.transfer(*steps[k])
        k += 1


class _Course:
    """Per step, while each has a profile: (sizes, profile, offset of its flows' start); ``ends``: offsets of
    the steps' ends; offsets counted from the first step's issue with every step alone on the network."""

    def __init__(self):
        self.steps, self.ends, self.complete = [], [], False

    def extend(self, net, steps: list, upto: int) -> int:
        """Courses of the steps up to ``upto`` (fewer where one has no profile); returns how many there are."""
        t = self.ends[-1] if self.ends else 0.0
        while not self.complete and len(self.steps) < min(upto, len(steps)):
            pairs, sizes, latency = steps[len(self.steps)]
            sizes = np.broadcast_to(np.asarray(sizes, dtype=float), (len(pairs),))
            prof = profile(net, pairs, sizes)
            if prof is None:
                self.complete = True
                break
            lat = pairs.latency if latency is None else latency
            active = t + lat if lat > 0 else t
            t = active + prof[0]
            self.steps.append((sizes, prof, active))
            self.ends.append(t)
        return len(self.steps)


def _alone(net, steps: list, course: _Course, k: int, upto: int):
    """Steps k..upto-1 (those with a course) at once until the network has other traffic; returns (the next
    step to run, whether all ran alone). The one in progress when another batch starts joins the network."""
    env, ends = net.env, course.ends
    upto = min(upto, len(ends))
    base = env.now - (ends[k - 1] if k else 0.0)      # the first step's issue time, as if alone from it
    net._solo = interrupt = env.event()
    yield env.timeout(max(base + ends[upto - 1] - env.now, 0.0)) | interrupt
    net._solo = None
    now = env.now
    j = upto if not interrupt.triggered else bisect_right(ends, now - base, k, upto)
    net.flows_done += sum(len(steps[i][0]) for i in range(k, j))
    if j == upto:
        return j, True
    pairs = steps[j][0]
    sizes, (_, phases), active = course.steps[j]
    if now < base + active:                 # still waiting its latency
        yield net.transfer(pairs, sizes, base + active - now)
    else:
        yield net.join(pairs, sizes, _remaining(phases, now - base - active), now)
    return j + 1, False


def _remaining(phases: list, elapsed: float) -> np.ndarray:
    """What is left of each flow ``elapsed`` after the step's flows started, alone on the network."""
    start, rates, remaining = phases[0]
    for phase in phases[1:]:
        if phase[0] > elapsed:
            break
        start, rates, remaining = phase
    return remaining - rates * (elapsed - start)
