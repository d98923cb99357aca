"""The ``ep`` workload: expert parallelism for mixture-of-experts models (sim/parallel/ep/plan.py builds the plan):
routed experts sharded over mesh dimension ``ep`` (folded from the data-parallel ranks, as torchtitan does),
dispatch and combine all_to_alls with per-peer sizes, optionally inside a pipeline over ``pp`` (DualPipeV with
its F/B overlap) and replicated over ``dp``. The report shows the routing what-if: token copies and expert
time per ep rank of rank 0's group, and the slowest one.
Process groups (sim/kernel/communicators.py): the ep group (named "ep": the all_to_alls, one at a time), the dense
gradients' dp x ep group (with dp 1 the same ranks as ep, another group), the experts' dp group; pipeline
send/recv on pair communicators."""
from __future__ import annotations

from distlab.sim.parallel.ep.plan import EPOptions, ep_plan, virtual_stages
from distlab.sim.plan import Collective
from distlab.sim.workloads.base import Workload

SHOWN = 16       # ep ranks listed in the table (the slowest is always listed)


def build(model, mesh, opts: EPOptions, cluster):
    plan = ep_plan(model, mesh, opts, cluster)
    return plan, {"ep": {k: v for k, v in plan.meta.items() if k != "tokens"}}


def expert_seconds(trace, rank: int) -> float:
    """Time rank ``rank`` spent in its grouped expert GEMMs (compute ops named ``... .experts``)."""
    return sum(o.end - o.start for o in trace.for_rank(rank) if o.kind == "compute" and o.name.endswith(".experts"))


def memory(result) -> dict:
    """Per-GPU static memory of pipeline rank 0 (all layers without pp): dense parameters whole, routed experts
    E/ep of them; mixed-precision Adam (sim/parallel/fsdp/memory.py precision: 2 + 2 + 12 bytes per element for 16-bit
    params), the optimizer state sharded over the data-parallel ranks with ZeRO-1 (dense: dp x ep, experts: dp;
    Rajbhandari et al. 2019, arXiv 1910.02054), and the activations of its layers (sim/models/activations.py, the
    model's recompute and offload): one micro-batch's peak without pp; with pp, each block's stash times the
    most blocks' micro-batches it holds walking its schedule (F keeps, B or W frees: an upper bound for the
    zero-bubble schedules, whose I already frees part), plus the largest transient of its layers."""
    from distlab.sim.parallel.fsdp.memory import breakdown_line, fit_text, fits, precision
    mesh, model, o = result.mesh, result.model, result.options
    ep = mesh.size("ep")
    dp = mesh.size("dp") if "dp" in mesh else 1
    layers = range(len(model.layers))
    if "pp" in mesh and mesh.size("pp") > 1:
        from distlab.sim.parallel.pipeline.plan import stage_ranges
        from distlab.sim.parallel.pipeline.schedules import stage_to_rank
        v = virtual_stages(o.schedule)
        pp = mesh.size("pp")
        placement = stage_to_rank(o.schedule, pp, v)
        layers = [i for s, r in enumerate(stage_ranges(model, pp * v, o.split)) if placement[s] == 0 for i in r]
    acts = _activations(model, mesh, o, layers)
    params = [q for i in layers for q in model.layers[i].params]
    dense = sum(q.numel for q in params if ".moe.experts." not in q.name)
    expert = sum(q.numel for q in params if ".moe.experts." in q.name) // ep
    p, g, k = precision(model.config["dtype"])
    shard = (dense / (dp * ep) + expert / dp) if o.zero1 else dense + expert
    parts = {"params": int((dense + expert) * p), "grads": int((dense + expert) * g), "optimizer": int(shard * k),
             "activations": int(acts)}
    total, gpu = sum(parts.values()), result.cluster.gpu.memory_GiB
    ok = fits(total, gpu)
    rows = [["memory per GPU (params, grads, Adam, activations)", f"{total / 2**30:.3f} GiB"],
            ["fits the GPU", fit_text(total, gpu)]]
    return {"rows": rows, "warnings": [] if ok else ["does not fit: " + breakdown_line(parts, total, gpu)],
            "json": {"breakdown_bytes": parts, "total_bytes": total, "fits": ok, "gpu_memory_GiB": gpu}}


def _activations(model, mesh, o, layers) -> float:
    """Activation bytes of pipeline rank 0 (``memory``'s docstring)."""
    from distlab.sim.models.activations import activations
    acts = activations(model).layers
    if not ("pp" in mesh and mesh.size("pp") > 1):
        return activations(model).peak_bytes
    from distlab.sim.parallel.pipeline.plan import stage_ranges
    from distlab.sim.parallel.pipeline.schedules import build
    pp, v = mesh.size("pp"), virtual_stages(o.schedule)
    ranges = stage_ranges(model, pp * v, o.split)
    live = peak = 0.0
    for a in build(o.schedule, pp, o.microbatches, v)[0]:
        stash = sum(acts[i].saved for i in ranges[a.stage])
        live += stash if a.kind == "F" else -stash if a.kind in ("B", "W") else 0.0
        peak = max(peak, live)
    return peak + max((acts[i].transient for i in layers), default=0.0)


def report(result) -> dict:
    mesh, trace, meta = result.mesh, result.trace, result.info["ep"]
    group = mesh.group_of(0, "ep")
    received = meta["received"]
    times = [expert_seconds(trace, g) for g in group]
    slow = max(range(len(group)), key=lambda j: times[j])
    mean_t = sum(times) / len(times)
    shown = sorted(set(range(min(SHOWN, len(group)))) | {slow})
    table = {"title": "routing: token copies received and expert time per ep rank (rank 0's group)",
             "columns": ["ep rank", "global rank", "copies received", "expert time ms", "vs mean"],
             "rows": [[j, group[j], received[j], f"{times[j] * 1e3:.3f}",
                       f"{times[j] / mean_t:.2f}x" if mean_t else "-"] for j in shown],
             "notes": [f"skew {meta['skew']}: expert e gets a share (e+1)^-skew; experts sharded contiguously",
                       "the slowest rank holds the others at each combine all_to_all"]}
    a2a = [o for o in result.plan.ranks[0] if isinstance(o, Collective) and o.op == "all_to_all"]
    rows = [["ep group size", len(group)], ["routed experts per ep rank", result.model.config["experts"] // len(group)],
            ["slowest expert rank", f"ep rank {slow} (global {group[slow]}): {received[slow]} copies, "
                                    f"{times[slow] * 1e3:.3f} ms, {times[slow] / mean_t:.2f}x the mean"
             if mean_t else "-"],
            ["all_to_alls per step (rank 0)", f"{len(a2a)}, {sum(o.bytes for o in a2a) / 2**20:.3f} MiB "
                                              "(largest sender's bytes)"]]
    mem = memory(result)
    return {"rows": rows + mem["rows"], "tables": [table], "warnings": mem["warnings"],
            "json": {"ep_group_size": len(group), "received_copies": received, "expert_time_s": times,
                     "slowest_ep_rank": slow, "slowest_global_rank": group[slow], "all_to_all_count": len(a2a),
                     "memory": mem["json"]}}


WORKLOAD = Workload(
    name="ep", help="expert parallelism for mixture-of-experts models over ep: dispatch and combine all_to_all "
                    "with per-peer sizes, routing skew what-if; pipeline over pp (DualPipeV overlap), dp replicas",
    dims=("pp", "dp", "ep"), required_dims=("ep",), fill_dim="dp", options=EPOptions, build=build, report=report,
    dim_words={"ep": "expert-parallel ranks", "dp": "data-parallel replicas", "pp": "pipeline stages"})
