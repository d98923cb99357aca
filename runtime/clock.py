"""One timeline for all ranks.

Ranks on one host share time.perf_counter() (CLOCK_MONOTONIC), so their offset is 0. Across hosts the offset
to rank 0 is estimated from barriers: after each of several barriers every rank reads its clock, and the
offset is the median of (own reading - rank 0's reading); error about one barrier's exit skew (tens of us
on TCP), which is fine for ms-scale collectives (CUDA events are used for the durations on GPUs).
"""
from __future__ import annotations

import socket
import statistics
import time


def clock_offset(ctx, rounds: int = 8) -> float:
    """Seconds to subtract from this rank's perf_counter() to get rank 0's."""
    import torch.distributed as dist
    hosts = [None] * ctx.world_size
    dist.all_gather_object(hosts, socket.gethostname())
    if len(set(hosts)) == 1:
        return 0.0
    diffs = []
    for _ in range(rounds):
        dist.barrier()
        now = [None] * ctx.world_size
        dist.all_gather_object(now, time.perf_counter())
        diffs.append(now[ctx.rank] - now[0])
    return statistics.median(diffs)


def start_barrier(ctx, offset: float) -> float:
    """Barrier, then this rank's clock (on rank 0's timeline) as it left it. The earliest reading is time zero
    of the run; it is applied when the ranks' records are merged, so nothing is exchanged before the run."""
    import torch.distributed as dist
    dist.barrier()
    return time.perf_counter() - offset
