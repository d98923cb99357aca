"""Test helper: a torch.profiler CPU trace of 2 gloo ranks, one file per rank (``python tests/gloo_profile.py DIR``).

Each rank runs profiler steps of PER_STEP x (a MATMUL x MATMUL float32 matmul, then an all_reduce of
ALL_REDUCE_BYTES) under torch.profiler (CPU activity, record_shapes) with a schedule of one warm-up step (it
absorbs the ranks' different start) and 3 active ones (ProfilerStep#N), and exports rank-N.json: the trace
`distlab compare PLAN DIR` reads (tests/test_ingest_cpu_profile.py) for ``plan()``, one step of the same program.
"""
from __future__ import annotations

import os
import sys

PER_STEP, MATMUL, ALL_REDUCE_BYTES = 2, 192, 1 << 20


def plan() -> dict:
    """The distlab-plan/1 of one step of each rank (compute from the cluster's model, the all_reduce as issued)."""
    ops = []
    for _ in range(PER_STEP):
        ops += [{"kind": "compute", "name": "matmul", "flops": 2 * MATMUL ** 3, "bytes": 3 * 4 * MATMUL * MATMUL},
                {"kind": "collective", "op": "all_reduce", "bytes": ALL_REDUCE_BYTES, "dtype": "float32",
                 "stream": "compute"}]
    return {"format": "distlab-plan/1", "name": "gloo profile", "world_size": 2, "ranks": [ops, ops]}


def make(out: str) -> None:
    """Both ranks forked from this process (torch already imported: no interpreter start-up), reaped here."""
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_rank, args=(r, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        if p.is_alive():
            p.kill()
            p.join()
    if os.path.exists(os.path.join(out, ".store")):
        os.remove(os.path.join(out, ".store"))
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"gloo profile ranks exited {[p.exitcode for p in procs]}")


def _rank(rank: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/.store", rank=rank, world_size=2)
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
    prof.export_chrome_trace(os.path.join(out, f"rank-{rank}.json"))
    dist.destroy_process_group()
    os._exit(0)                   # a forked child: no atexit of the parent's (pytest's) handlers


if __name__ == "__main__":
    make(sys.argv[1])
