"""The ``ddp`` workload: DistributedDataParallel over mesh dimension ``dp`` (sim/parallel/ddp/plan.py builds the plan).
Reports the per-bucket table (ready, launch by DDP's rule, data moving, end) on rank 0.
Process groups (sim/kernel/communicators.py): one, the dp group: the buckets' all-reduces run one at a time, in
bucket order."""
from __future__ import annotations

from distlab.sim.parallel.ddp.plan import DDPOptions, bucket_rows, ddp_plan
from distlab.sim.workloads.base import Workload


def build(model, mesh, opts: DDPOptions, cluster):
    return ddp_plan(model, mesh, opts)


def report(result) -> dict:
    rows = bucket_rows(result.trace, result.info)
    ms = lambda t: "-" if t is None else f"{t * 1e3:.3f}"  # noqa: E731
    table = {"title": "buckets (rank 0; times in ms)",
             "columns": ["bucket", "MiB", "params", "first .. last", "ready", "launch", "start", "end"],
             "rows": [[r["index"], f"{r['bytes'] / 2**20:.2f}", r["params"], f"{r['first']} .. {r['last']}",
                       ms(r["ready_s"]), ms(r["ddp_launch_s"]), ms(r["launch_s"]), ms(r["end_s"])] for r in rows],
             "notes": ["ready: the bucket's last gradient is computed; launch: DDP's rule, max(ready, launch of the "
                       "bucket before) (Reducer::mark_bucket_ready); start: its all-reduce's data starts moving "
                       "(all ranks there, stream free); end: the all-reduce is done; '-': never"]}
    mem = memory(result)
    return {"tables": [table], "rows": mem["rows"], "warnings": mem["warnings"],
            "json": {"buckets": rows, "memory": mem["json"]}}


def memory(result) -> dict:
    """Per-GPU memory rows: sim/parallel/memory.py, the one model of every command (`distlab memory --zero ddp`
    gives the same bytes)."""
    from distlab.sim.parallel.memory import memory_section
    return memory_section(result)


def sweep_row(result) -> dict:
    return {"buckets": len(result.info.get("buckets", []))}


WORKLOAD = Workload(
    name="ddp", help="DistributedDataParallel: every rank holds the model; gradient buckets all-reduced over dp",
    dims=("dp",), fill_dim="dp", default_dim="dp", options=DDPOptions, build=build, report=report, sweep_row=sweep_row,
    dim_words={"dp": "data-parallel ranks"})
