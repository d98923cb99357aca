"""The real run of lesson 14: two jobs of two gloo ranks each on this machine, alone and at once.

    two_jobs_here()   # {"alone_ms": {"a": .., "b": ..}, "shared_ms": {...}, "slowdown": {...}, "nbytes": ..,
                      #  "background": other processes' CPU during the run (runtime/measure/trust.py Watch), "cores": ..}

Four ranks start once: ranks 0 and 1 are job a, ranks 2 and 3 job b, each job a process group of its own that
all-reduces a buffer again and again. Job a runs alone (b waits at a barrier), then b alone, then both at once;
the median time of one all_reduce in each phase gives each job's slowdown. On one machine what the jobs share is
the CPU cores and the memory bus (gloo reduces on the CPU and copies through loopback TCP), not a spine link; the
effect is the same in kind: a job's time depends on its neighbour.
"""
from __future__ import annotations

import statistics
import time

from distlab.runtime.lessons.common import fewer, run_on_ranks


def two_jobs_here(nbytes: int = 1 << 20, iters: int = 20) -> dict:
    """Run the experiment of the module docstring; times in milliseconds (medians over ``iters``)."""
    import os

    from distlab.runtime.measure.trust import Watch
    watch = Watch()
    out = run_on_ranks("distlab.runtime.lessons.shared:_task", {"numel": nbytes // 4, "iters": fewer(iters, 4)},
                       nproc=4)
    background = watch.stop()
    alone = {"a": out[0]["alone"], "b": out[2]["alone"]}
    shared = {"a": out[0]["shared"], "b": out[2]["shared"]}
    return {"nbytes": nbytes, "alone_ms": alone, "shared_ms": shared,
            "slowdown": {k: shared[k] / alone[k] for k in alone}, "background": background,
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()}


def _task(ctx, payload):
    import torch
    import torch.distributed as dist
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = groups[ctx.rank // 2]
    x = torch.ones(payload["numel"])

    def times(n):
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            dist.all_reduce(x, group=mine)
            out.append(time.perf_counter() - t0)
        return statistics.median(out) * 1e3

    result = {}
    for phase in ("a", "b", "both"):
        dist.barrier()
        if phase == "both":
            times(1)                                   # warm-up together
            result["shared"] = times(payload["iters"])
        elif phase == ("a" if ctx.rank < 2 else "b"):
            times(2)
            result["alone"] = times(payload["iters"])
    dist.barrier()
    return result
