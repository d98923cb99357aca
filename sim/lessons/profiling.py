"""Lesson 05's profile of a real run: read the Chrome traces ``torch.profiler`` wrote on each gloo rank
(runtime/lessons/training.py ``ddp_bucket_sweep(profile=...)``), summarise where each step's time went, and put
them next to distlab's prediction of the same step in one file that Perfetto (ui.perfetto.dev) opens.

    >>> table = profile_table(["work/profile/rank0.json", "work/profile/rank1.json"])      # doctest: +SKIP
    >>> merge_with_prediction(paths, predicted_trace, "work/profile-both.json")             # doctest: +SKIP

What a CPU profile of DDP on gloo holds (torch 2.13, torch/profiler; the names are the profiler's):

- on the main thread, the ops of the step: ``DistributedDataParallel.forward`` (user annotation), ``aten::``
  ops, autograd's ``...Backward0`` functions, the Reducer's ``c10d::allreduce_`` issue for each bucket (it
  returns at once: the collective runs elsewhere), ``Optimizer.step#Adam.step``;
- on gloo's own threads, ``gloo:all_reduce`` (and ``gloo:broadcast``, ``gloo:barrier``): the collectives as they
  run, beside the backward that issued them, which is DDP's overlap on a CPU;
- gaps on the main thread: time it spent in no op (waiting for a bucket before the optimizer, Python between
  ops, the barrier).

On a GPU with NCCL, the profiler's CUDA activity adds a stream per GPU with the kernels: NCCL's collectives show as
``ncclDevKernel_...`` kernels (e.g. ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``: op, reduction, type, algorithm,
protocol) on their own stream, beside the compute kernels; gaps there are the GPU idling.
"""
from __future__ import annotations

import json

from distlab.sim.lessons.helpers import Table

MAIN_MARK = "DistributedDataParallel.forward"
OPTIMIZER_MARK = "Optimizer.step"


def read_profile(path: str) -> list[dict]:
    """The complete events ("X") and metadata ("M") of one rank's Chrome trace."""
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") in ("X", "M")]


def _main_tid(events: list[dict]):
    marks = [e for e in events if e.get("ph") == "X" and e["name"] == MAIN_MARK]
    if not marks:
        raise ValueError(f"no {MAIN_MARK} in the trace: not a profile of DDP steps")
    return marks[0]["tid"]


def _union(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by ``intervals`` (µs)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def steps(events: list[dict]) -> list[tuple[float, float]]:
    """(start, end) µs of each DDP step on the main thread: from a forward to the end of the optimizer step
    that follows it."""
    tid = _main_tid(events)
    xs = sorted((e for e in events if e.get("ph") == "X" and e["tid"] == tid), key=lambda e: e["ts"])
    out, start = [], None
    for e in xs:
        if e["name"] == MAIN_MARK and start is None:
            start = e["ts"]
        elif e["name"].startswith(OPTIMIZER_MARK) and start is not None:
            out.append((start, e["ts"] + e["dur"]))
            start = None
    return out


def summary(events: list[dict]) -> dict:
    """The last step of one rank: its length, the main thread's busy time (the union of its ops) and gaps, the
    gloo collectives' time on gloo's threads inside it, and their count (ms)."""
    tid = _main_tid(events)
    start, end = steps(events)[-1]
    inside = [e for e in events if e.get("ph") == "X" and start <= e["ts"] and e["ts"] + e["dur"] <= end]
    busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in inside if e["tid"] == tid])
    gloo = [e for e in inside if e["name"].startswith("gloo:")]
    return {"step_ms": (end - start) / 1e3, "busy_ms": busy / 1e3, "gaps_ms": (end - start - busy) / 1e3,
            "collectives": len(gloo), "collective_ms": _union([(e["ts"], e["ts"] + e["dur"]) for e in gloo]) / 1e3,
            "start_us": start}


def profile_table(paths: list[str], predicted_s: float | None = None) -> Table:
    """Per rank, the last profiled step: length, main thread busy and idle, the gloo collectives (and the
    simulated step of the same cap beside it, when given)."""
    rows = []
    for r, path in enumerate(paths):
        s = summary(read_profile(path))
        rows.append([r, f"{s['step_ms']:.2f}", f"{s['busy_ms']:.2f}", f"{s['gaps_ms']:.2f}", s["collectives"],
                     f"{s['collective_ms']:.2f}"])
    title = "torch.profiler on each gloo rank, the last profiled step (ms)"
    if predicted_s is not None:
        title += f"; simulated step: {predicted_s * 1e3:.2f} ms"
    return Table(["rank", "step", "main thread busy", "main thread idle", "gloo collectives", "their time"], rows,
                 title)


def merge_with_prediction(paths: list[str], predicted, out: str) -> str:
    """One Chrome trace for Perfetto: each rank's profile as process "measured rank r" (its threads as the
    profiler named them), and distlab's predicted trace of the same step (a sim Trace) as processes
    "predicted rank r", shifted to start where rank 0's last profiled step starts. Returns ``out``."""
    from distlab.sim.chrome import chrome_events
    from distlab.sim.io import write_atomic
    events, first = [], None
    for r, path in enumerate(paths):
        evs = read_profile(path)
        start = summary(evs)["start_us"]
        first = start if first is None else first
        pid = 1000 + r
        for e in evs:
            if e.get("ph") == "M" and e["name"] in ("process_name", "process_labels", "process_sort_index"):
                continue
            events.append({**e, "pid": pid})
        events += [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"measured rank {r}"}},
                   {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": 2 * r + 1}}]
    for e in chrome_events(predicted):
        e = dict(e)
        rank = e.get("pid", 0)
        e["pid"] = 2000 + rank
        if "ts" in e:
            e["ts"] = e["ts"] + first
        if e.get("ph") == "M" and e["name"] == "process_name":
            e["args"] = {"name": f"predicted rank {rank}"}
        if e.get("ph") == "M" and e["name"] == "process_sort_index":
            e["args"] = {"sort_index": 2 * rank}
        events.append(e)
    write_atomic(out, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}).encode())
    return out
