"""Lesson 04's own profile: a torch.profiler CPU trace of a small program on local gloo ranks, one file per rank.

    folder = profile_here("work/profile")      # rank-0.json, rank-1.json: what `distlab compare` reads
    plan = program_plan()                       # the distlab-plan/1 of one step of the same program

Each rank runs profiler steps of PER_STEP x (a MATMUL x MATMUL float32 matmul, then an all_reduce of
ALL_REDUCE_BYTES) under torch.profiler (CPU activity, record_shapes) with one warm-up step (it absorbs the ranks'
different start) and 3 active ones (ProfilerStep#N; the reader drops the last as HolisticTraceAnalysis does), and
exports rank-N.json. The plan is the same step: compute from the cluster's model, the all_reduce as issued.
"""
from __future__ import annotations

import os

from distlab.runtime.lessons.common import run_on_ranks

PER_STEP, MATMUL, ALL_REDUCE_BYTES = 2, 192, 1 << 20


def program_plan(nproc: int = 2) -> dict:
    """The distlab-plan/1 of one profiled step of every rank."""
    ops = []
    for _ in range(PER_STEP):
        ops += [{"kind": "compute", "name": "matmul", "flops": 2 * MATMUL ** 3, "bytes": 3 * 4 * MATMUL * MATMUL},
                {"kind": "collective", "op": "all_reduce", "bytes": ALL_REDUCE_BYTES, "dtype": "float32",
                 "stream": "compute"}]
    return {"format": "distlab-plan/1", "name": "profiled program", "world_size": nproc, "ranks": [ops] * nproc}


def profile_here(out: str, nproc: int = 2) -> str:
    """Profile the program on ``nproc`` gloo ranks into folder ``out`` (created); the folder."""
    from distlab.sim.files import make_folder
    make_folder(out, "out")                  # its parent must exist; checked as every output folder
    run_on_ranks("distlab.runtime.lessons.profile:_task", {"out": os.path.abspath(out)}, nproc=nproc)
    return out


def _task(ctx, payload):
    import torch
    import torch.distributed as dist
    a, b = torch.randn(MATMUL, MATMUL), torch.randn(MATMUL, MATMUL)
    t = torch.ones(ALL_REDUCE_BYTES // 4)
    dist.all_reduce(t)                                     # warm the connection outside the trace
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                schedule=schedule) as prof:
        for _ in range(4):
            for _ in range(PER_STEP):
                a @ b
                dist.all_reduce(t)
            prof.step()
    prof.export_chrome_trace(os.path.join(payload["out"], f"rank-{ctx.rank}.json"))
    return True
