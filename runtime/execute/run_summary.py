"""What `distlab run` reports about a measured trace: per rank and stream, and the --json object."""
from __future__ import annotations


def summary(trace) -> list[dict]:
    """Per (rank, stream): op count, busy time, first start and last end."""
    rows = []
    for rank, stream in sorted({(o.rank, o.stream) for o in trace.ops}):
        ops = [o for o in trace.ops if o.rank == rank and o.stream == stream and o.kind not in ("record", "wait")]
        if not ops:
            continue
        rows.append({"rank": rank, "stream": stream, "ops": len(ops), "busy_s": trace.busy_time(rank, stream),
                     "start_s": min(o.start for o in ops), "end_s": max(o.end for o in ops)})
    return rows


def run_json(trace, out: str) -> dict:
    """`distlab run --json`'s object for a torchrun run (runtime/commands/run.py's keys, plus the clocks)."""
    from distlab.sim.cli import with_schema
    return with_schema({"trace": out, "perfetto": None, "world_size": trace.meta.get("world_size"),
                        "makespan_s": trace.makespan, "backend": trace.meta.get("backend"),
                        "clock": trace.meta.get("clock"), "streams": summary(trace)}, "run")
