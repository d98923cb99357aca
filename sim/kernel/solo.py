"""A collective's steps run at once, alone on the network or overlapping others, exactly as step by step.

The engine hands a collective's steps (pairs, sizes, latency) to ``run_steps``. By default the network runs them
in its step loop (sim/kernel/netloop.py): every collective in flight advances in one loop over the network's events (a
step joining after its latency, a flow ending), one simpy event per collective, not per step; a collective alone
on the network is a few loop iterations per step (what this module did with per-step profiles until issue 17),
and collectives that overlap (FSDP's all-gathers and reduce-scatters, HSDP's replicate all-reduces) no longer
cost a simpy process and timer per step. With ``ENABLED = False`` (or a network recording every transfer) each
step is a simpy process and batch of sim/kernel/network.py: the reference the tests compare with (tests/test_solo.py,
tests/test_netloop.py: the same step times and trace summaries, 1e-9 relative).
"""
from __future__ import annotations

ENABLED = True       # False: every step a simpy process of the network (the reference); read by Network()


def run_steps(net, steps):
    """Generator for a simpy process: the steps (pairs, sizes, latency or None) one after another."""
    steps = steps if isinstance(steps, list) else list(steps)
    if net.loop is not None:
        yield net.loop.run(steps)
        return
    for step in steps:
        yield net.transfer(*step)
