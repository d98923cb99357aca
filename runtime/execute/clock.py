"""One timeline for all ranks: every rank's clock offset to rank 0, measured NTP-style.

Ranks on one node share time.perf_counter() (CLOCK_MONOTONIC), so their offset is exactly 0. A node is a host
and, under torchrun, its agent's GROUP_RANK (the node rank), so two torchrun agents on one machine count as two
nodes (as in tests, and harmless in production: their measured offset is ~0 within its uncertainty).

Every rank not on rank 0's node measures its offset by ping-pong with rank 0 over a Gloo group (the default
group on Gloo, a Gloo side group on NCCL), ``rounds`` times. One exchange (NTP's on-wire protocol, RFC 5905
section 8): this rank sends at t1 (its clock), rank 0 receives at t2 and replies at t3 (rank 0's clock), this
rank receives at t4:

    offset = ((t1 - t2) + (t4 - t3)) / 2          this rank's clock minus rank 0's
    delay  = (t4 - t1) - (t3 - t2)                round trip minus rank 0's turnaround

Queueing only ever adds delay, so, as NTP's clock filter does (RFC 5905 section 10), the sample with the
minimum delay is kept (over all ranks of the node: they share one clock): its offset is off by at most delay / 2 (if the whole round trip was spent on one leg),
which is the reported uncertainty. Measured before and after a run, the change of the offset is the drift of
the two clocks over the run; times between are aligned by linear interpolation (``Alignment``).

Test hook: DISTLAB_TEST_CLOCK_SHIFT_S=S shifts time.perf_counter() of the process by S seconds (set it on one
node only, to emulate a host whose clock is S seconds ahead; the alignment must recover S).
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import asdict, dataclass

SHIFT_ENV = "DISTLAB_TEST_CLOCK_SHIFT_S"
_GLOO: dict = {}


@dataclass
class ClockSync:
    """One measurement on one rank: subtract ``offset_s`` from its perf_counter() to get rank 0's."""
    offset_s: float = 0.0
    uncertainty_s: float = 0.0      # half the minimum round trip (0 on rank 0's node: same clock)
    min_rtt_s: float = 0.0
    at_s: float = 0.0               # this rank's clock when measured (the best sample's t1..t4 midpoint)
    rounds: int = 0                 # exchanges made (0: same node as rank 0)
    node: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def install_test_shift() -> float:
    """Apply DISTLAB_TEST_CLOCK_SHIFT_S (a test hook) to this process's perf_counter(); returns the shift."""
    shift = float(os.environ.get(SHIFT_ENV, "0") or 0)
    if shift and not getattr(time.perf_counter, "distlab_shift", None):
        real = time.perf_counter

        def shifted() -> float:
            return real() + shift
        shifted.distlab_shift = shift
        time.perf_counter = shifted
    return shift


def node_key() -> str:
    """This rank's node: host name, plus torchrun's node rank (GROUP_RANK) when there is one."""
    group = os.environ.get("GROUP_RANK")
    return socket.gethostname() + (f"/node{group}" if group is not None else "")


def _gloo_group(ctx):
    """The group the pings use: Gloo (CPU tensors, no device sync in the timed path)."""
    import torch.distributed as dist
    if ctx.backend == "gloo":
        return None
    if "group" not in _GLOO:
        _GLOO["group"] = dist.new_group(backend="gloo")
    return _GLOO["group"]


def measure(ctx, rounds: int = 16, max_rounds: int = 400, good_rtt_s: float = 60e-6) -> ClockSync:
    """Every rank's offset to rank 0 (a collective: all ranks call it). Returns this rank's ClockSync.

    Each remote rank makes at least ``rounds`` exchanges and goes on, up to ``max_rounds``, until its best round
    trip is under ``good_rtt_s`` (on a busy machine a quiet moment comes sooner or later). Ranks of one node
    share a clock, so each takes the minimum-delay sample of all its node's ranks."""
    import torch
    import torch.distributed as dist
    group = _gloo_group(ctx)
    from distlab.runtime.execute.wire import all_gather_json
    nodes = all_gather_json(node_key())
    me = nodes[ctx.rank]
    remote = [r for r in range(ctx.world_size) if nodes[r] != nodes[0]]
    clock = time.perf_counter
    buf = torch.zeros(2, dtype=torch.float64)
    best = None                                  # (delay, offset, at, rounds)
    if ctx.rank == 0:
        for peer in remote:
            while True:
                dist.recv(buf, src=peer, group=group)
                t2 = clock()
                if buf[0] == 0:                  # the peer is done
                    break
                buf[0], buf[1] = t2, clock()
                dist.send(buf, dst=peer, group=group)
    elif ctx.rank in remote:
        n = 0
        while n < max_rounds and (n < rounds or best[0] > good_rtt_s):
            buf[0] = 1
            t1 = clock()
            dist.send(buf, dst=0, group=group)
            dist.recv(buf, src=0, group=group)
            t4 = clock()
            t2, t3 = float(buf[0]), float(buf[1])
            delay = (t4 - t1) - (t3 - t2)
            n += 1
            if best is None or delay < best[0]:
                best = (delay, ((t1 - t2) + (t4 - t3)) / 2, (t1 + t4) / 2, n)
        buf[0] = 0
        dist.send(buf, dst=0, group=group)
        best = (best[0], best[1], best[2], n)
    samples = all_gather_json(best)
    mine = [s for r, s in enumerate(samples) if nodes[r] == me and s is not None]
    if not mine:                                 # rank 0's node: the same clock as rank 0
        return ClockSync(at_s=clock(), node=me)
    delay, offset, _, _ = min(mine)
    delay = max(delay, 0.0)
    at = best[2] if best else clock()
    return ClockSync(offset, delay / 2, delay, at, best[3] if best else 0, me)


def clock_offset(ctx) -> float:
    """Seconds to subtract from this rank's perf_counter() to get rank 0's (see ``measure``)."""
    return measure(ctx).offset_s


class Alignment:
    """This rank's clock -> rank 0's, interpolating linearly between a measurement before and one after."""

    def __init__(self, before: ClockSync, after: ClockSync | None = None):
        self.before, self.after = before, after

    @property
    def drift_s(self) -> float:
        return 0.0 if self.after is None else self.after.offset_s - self.before.offset_s

    def offset_at(self, t: float) -> float:
        b, a = self.before, self.after
        if a is None or a.at_s <= b.at_s:
            return b.offset_s
        frac = min(max((t - b.at_s) / (a.at_s - b.at_s), 0.0), 1.0)
        return b.offset_s + frac * (a.offset_s - b.offset_s)

    def __call__(self, t: float) -> float:
        return t - self.offset_at(t)

    def report(self) -> dict:
        """What the trace keeps of this rank's alignment (seconds)."""
        worst = max(self.before.uncertainty_s, self.after.uncertainty_s if self.after else 0.0)
        return {"offset_s": self.before.offset_s, "offset_after_s": (self.after or self.before).offset_s,
                "drift_s": self.drift_s, "uncertainty_s": worst, "min_rtt_s": self.before.min_rtt_s,
                "rounds": self.before.rounds, "node": self.before.node}


def summarize(per_rank: dict) -> dict:
    """Trace meta ``clock`` from {rank: Alignment.report()}: per-rank lists and the worst case."""
    ranks = sorted(per_rank)
    out = {"method": "ping-pong with rank 0, minimum-delay sample (NTP), before and after the run",
           "reference_rank": 0}
    for key in ("offset_s", "drift_s", "uncertainty_s"):
        out[key] = [per_rank[r][key] for r in ranks]
    out["nodes"] = [per_rank[r]["node"] for r in ranks]
    out["max_uncertainty_s"] = max(out["uncertainty_s"], default=0.0)
    out["max_drift_s"] = max((abs(d) for d in out["drift_s"]), default=0.0)
    return out


def describe(clock: dict) -> str:
    """One line for the user: how well the ranks' clocks are aligned."""
    nodes = len(set(clock.get("nodes", [])))
    if nodes <= 1:
        return "clocks: one node, one clock (no alignment needed)"
    return (f"clocks: {nodes} nodes aligned to rank 0 within ±{clock['max_uncertainty_s'] * 1e6:.0f} us "
            f"(half the min round trip); drift over the run {clock['max_drift_s'] * 1e6:.0f} us")


def start_barrier(ctx, offset: float) -> float:
    """Barrier, then this rank's clock (on rank 0's timeline) as it left it. The earliest reading is time zero
    of the run; it is applied when the ranks' records are merged, so nothing is exchanged before the run."""
    import torch.distributed as dist
    dist.barrier()
    return time.perf_counter() - offset
