"""The GPU path of the executor: plan streams are CUDA streams, every op is bracketed by CUDA events.

The host issues the rank's ops in plan order without blocking: each op on its stream between two timing
events; a collective is issued with async_op=True and ``work.wait()`` makes the stream wait for NCCL's own
stream; Record is cudaEventRecord, Wait is cudaStreamWaitEvent (a Wait before any Record is a no-op, as in
CUDA). After one synchronize, event times are read relative to a reference event recorded when the GPU was
idle at a known host time, which puts them on the host's perf_counter() timeline.
(Wall clock around a NCCL call measures only the enqueue: ../shared/REFERENCES.md, "Timing on GPUs".)
"""
from __future__ import annotations

import time


def run_cuda(ex) -> list[tuple[int, float, float]]:
    import torch
    streams = {name: torch.cuda.Stream(device=ex.ctx.device) for name in ex.steps}
    events: dict[str, object] = {}
    marks = []                                   # (index, start event, end event)
    order = sorted((i, name, kind, fn, event, need)
                   for name, steps in ex.steps.items() for i, kind, fn, event, need, _ in steps)
    torch.cuda.synchronize(ex.ctx.device)
    ref = torch.cuda.Event(enable_timing=True)
    t_ref = time.perf_counter()
    ref.record()
    for i, name, kind, fn, event, need in order:
        s = streams[name]
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(s):
            e0.record(s)
            if fn is not None:
                work = fn()
                if work is not None:
                    work.wait()
            elif kind == "record":
                events[event] = torch.cuda.Event()
                events[event].record(s)
            elif event in events:
                s.wait_event(events[event])
            e1.record(s)
        marks.append((i, e0, e1))
    torch.cuda.synchronize(ex.ctx.device)
    ex.partial = {}
    return [(i, t_ref + ref.elapsed_time(a) / 1e3, t_ref + ref.elapsed_time(b) / 1e3) for i, a, b in marks]
