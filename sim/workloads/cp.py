"""The ``cp`` workload: context parallelism over mesh dimension ``cp`` as torch 2.13's ``context_parallel``
runs it (ring attention, sim/parallel/cp/ring.py), in torchtitan's layout (FSDP2 over dp_shard x cp, HSDP replicas over
dp_replicate, TP + SP inside with tp; sim/parallel/cp/plan.py, sim/parallel/cp/compose.py).
Reports the ring per layer (rotations, bytes, per-step work), the per-rank memory (sim/parallel/cp/memory.py) and flags
what does not fit.
Process groups (sim/kernel/communicators.py): the cp group (named "cp": the ring's all_gathers; its send/recv
rotations on pair communicators), FSDP2's dp_shard x cp group (all-gathers and reduce-scatters, one at a time;
with dp_shard 1 the same ranks as cp, still another group), dp_replicate (HSDP) and tp (TP + SP) groups."""
from __future__ import annotations

from distlab.sim.parallel.cp.plan import CPOptions, cp_plan
from distlab.sim.workloads.base import Workload


def build(model, mesh, opts: CPOptions, cluster):
    from dataclasses import replace
    from distlab.sim.models.activations import effective_recompute, require_structure
    require_structure(model, "context parallelism")
    opts = replace(opts, recompute=effective_recompute(model, opts.recompute, "cp.recompute"))
    plan = cp_plan(model, mesh, opts, cluster=cluster)
    return plan, {"cp": plan.meta}


def report(result) -> dict:
    from distlab.sim.parallel.cp.ring import step_kind
    from distlab.sim.plan import Collective, Send
    o, cp = result.options, result.mesh.size("cp")
    ops = [x for x in result.plan.ranks[0] if getattr(x, "name", "").startswith("cp ")
           and isinstance(x, (Collective, Send))]
    counts: dict = {}
    for x in ops:
        op = x.op if isinstance(x, Collective) else "all_to_all (send to next)"
        what = x.name.rsplit(" ", 2)[-2] + " " + x.name.rsplit(" ", 1)[-1]
        n, b = counts.get((op, what), (0, 0))
        counts[(op, what)] = (n + 1, b + x.bytes)
    table = {"title": "ring attention collectives per step (rank 0, all layers)",
             "columns": ["collective", "buffer", "count", "MiB"],
             "rows": [[op, w, n, f"{b / 2**20:.3f}"] for (op, w), (n, b) in counts.items()],
             "notes": ["kv: cat(K, V) of the local tokens in the model dtype; dkv: their gradients in float32",
                       "all_gather bytes: the gathered output (nccl-tests); all_to_all: what one rank sends"]}
    kinds = [step_kind(cp - 1, cp, i, o.load_balance) for i in range(cp)]
    from distlab.sim.models.activations import effective_recompute
    from distlab.sim.parallel.memory import memory_section
    rc = effective_recompute(result.model, o.recompute)
    mem = memory_section(result)
    rows = [["cp group size", cp], ["tokens per rank", f"{result.model.config['seq_len'] // cp} of "
                                                       f"{result.model.config['seq_len']}"],
            ["rotate method", o.rotate_method], ["load balanced", o.load_balance], ["recompute", rc],
            [f"ring steps of rank {cp - 1}", ", ".join(kinds)]]
    rows += mem["rows"]
    warnings = mem["warnings"]
    return {"rows": rows, "tables": [table], "warnings": warnings,
            "json": {"cp": cp, "rotate_method": o.rotate_method, "load_balance": o.load_balance,
                     "ring_steps_last_rank": kinds,
                     "collectives": [{"op": op, "buffer": w, "count": n, "bytes": b}
                                     for (op, w), (n, b) in counts.items()],
                     "memory": mem["json"]}}


WORKLOAD = Workload(
    name="cp", help="context parallelism over cp: sequence sharded (head-tail load balancing), ring attention "
                    "rotating K/V (allgather or alltoall) as torch's context_parallel; FSDP2 over dp_shard x cp, "
                    "HSDP with dp_replicate, TP + SP with tp (torchtitan's layout)",
    dims=("dp_replicate", "dp_shard", "cp", "tp"), required_dims=("cp",), fill_dim="dp_shard", options=CPOptions,
    build=build, report=report, dim_words={"cp": "context-parallel ranks", "dp_shard": "FSDP2 shard group size "
                                           "(with cp)", "dp_replicate": "HSDP replicas", "tp": "tensor-parallel ranks"})
