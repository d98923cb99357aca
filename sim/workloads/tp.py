"""The ``tp`` workload: tensor parallelism (+ sequence parallelism) over mesh dimension ``tp``, as torch 2.13's
``parallelize_module`` with torchtitan's Llama plan issues it (sim/tp/plan.py builds the plan). Reports the
per-rank memory (local shards, Korthikanti et al. 2022 Table 2 activations; sim/tp/memory.py) in GB and GiB,
the tp collectives per step, and flags what does not fit."""
from __future__ import annotations

from distlab.sim.plan import Collective
from distlab.sim.tp.plan import TPOptions, tp_plan
from distlab.sim.workloads.base import Workload


def build(model, mesh, opts: TPOptions, cluster):
    plan = tp_plan(model, mesh, opts)
    return plan, {"tp": plan.meta}


def memory(result) -> dict:
    from distlab.sim.fsdp.memory import breakdown_line, fits
    from distlab.sim.tp.memory import tp_memory
    o = result.options
    parts = tp_memory(result.model, result.mesh.size("tp"), o.sequence_parallel, o.recompute)
    total, gpu = sum(parts.values()), result.cluster.gpu.memory_GiB
    ok = fits(total, gpu)
    rows = [[f"memory per GPU: {k}", f"{v / 1e9:.3f} GB = {v / 2**30:.3f} GiB"] for k, v in parts.items()]
    rows += [["memory per GPU (total)", f"{total / 1e9:.3f} GB = {total / 2**30:.3f} GiB"],
             ["fits the GPU", f"yes ({gpu:g} GiB)" if ok else f"NO: over {gpu:g} GiB"]]
    return {"rows": rows, "warnings": [] if ok else ["does not fit: " + breakdown_line(parts, total, gpu)],
            "json": {"breakdown_bytes": parts, "total_bytes": total, "fits": ok, "gpu_memory_GiB": gpu,
                     "activations": "Korthikanti et al. 2022 (arXiv 2205.05198) Table 2, recompute "
                                    f"{o.recompute}"}}


def report(result) -> dict:
    cols = [o for o in result.plan.ranks[0] if isinstance(o, Collective)]
    counts: dict = {}
    for o in cols:
        phase = o.name.rsplit(" ", 1)[-1]
        key = (o.op, phase)
        n, b = counts.get(key, (0, 0))
        counts[key] = (n + 1, b + o.bytes)
    table = {"title": "tp collectives per step (rank 0)", "columns": ["collective", "phase", "count", "MiB"],
             "rows": [[op, ph, n, f"{b / 2**20:.3f}"] for (op, ph), (n, b) in counts.items()],
             "notes": ["bytes as nccl-tests count them (all_gather: output, reduce_scatter: input)"]}
    mem = memory(result)
    rows = [["tp group size", result.mesh.size("tp")], ["sequence parallel", result.options.sequence_parallel],
            ["parameters per rank (local shards)", f"{result.plan.meta['local_params'] / 1e6:.1f} M"]] + mem["rows"]
    return {"rows": rows, "tables": [table], "warnings": mem["warnings"],
            "json": {"collectives": [{"op": op, "phase": ph, "count": n, "bytes": b}
                                     for (op, ph), (n, b) in counts.items()], "memory": mem["json"]}}


WORKLOAD = Workload(
    name="tp", help="tensor parallelism (+ sequence parallelism) over tp: linears sharded column- and row-wise as "
                    "torchtitan's Llama plan",
    dims=("tp",), required_dims=("tp",), options=TPOptions, build=build, report=report,
    dim_words={"tp": "tensor-parallel ranks"})
