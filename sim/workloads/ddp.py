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
    """Per-GPU memory as `distlab memory --zero ddp` counts it (sim/parallel/fsdp/memory.py estimate: params, grads,
    Adam state, activations of one micro-batch) against the GPU's memory."""
    from distlab.sim.parallel.fsdp.memory import breakdown_line, estimate, fit_text, fits
    est = estimate(result.model, result.plan.world_size, 0)
    total, gpu = sum(est.values()), result.cluster.gpu.memory_GiB
    ok = fits(total, gpu)
    rows = [["memory per GPU (params + grads + Adam + activations)", f"{total / 2**30:.3f} GiB"],
            ["fits the GPU", fit_text(total, gpu)]]
    warnings = [] if ok else ["does not fit: " + breakdown_line(est, total, gpu)]
    return {"rows": rows, "warnings": warnings,
            "json": {"breakdown_bytes": est, "total_bytes": total, "fits": ok, "gpu_memory_GiB": gpu}}


def sweep_row(result) -> dict:
    return {"buckets": len(result.info.get("buckets", []))}


WORKLOAD = Workload(
    name="ddp", help="DistributedDataParallel: every rank holds the model; gradient buckets all-reduced over dp",
    dims=("dp",), fill_dim="dp", default_dim="dp", options=DDPOptions, build=build, report=report, sweep_row=sweep_row,
    dim_words={"dp": "data-parallel ranks"})
