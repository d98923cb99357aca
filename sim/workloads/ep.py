"""The ``ep`` workload: expert parallelism for mixture-of-experts models (sim/moe/plan.py builds the plan):
routed experts sharded over mesh dimension ``ep`` (folded from the data-parallel ranks, as torchtitan does),
dispatch and combine all_to_alls with per-peer sizes, optionally inside a pipeline over ``pp`` (DualPipeV with
its F/B overlap) and replicated over ``dp``. The report shows the routing what-if: token copies and expert
time per ep rank of rank 0's group, and the slowest one."""
from __future__ import annotations

from distlab.sim.moe.plan import EPOptions, ep_plan
from distlab.sim.plan import Collective
from distlab.sim.workloads.base import Workload

SHOWN = 16       # ep ranks listed in the table (the slowest is always listed)


def build(model, mesh, opts: EPOptions, cluster):
    plan = ep_plan(model, mesh, opts, cluster)
    return plan, {"ep": {k: v for k, v in plan.meta.items() if k != "tokens"}}


def expert_seconds(trace, rank: int) -> float:
    """Time rank ``rank`` spent in its grouped expert GEMMs (compute ops named ``... .experts``)."""
    return sum(o.end - o.start for o in trace.for_rank(rank) if o.kind == "compute" and o.name.endswith(".experts"))


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
    return {"rows": rows, "tables": [table],
            "json": {"ep_group_size": len(group), "received_copies": received, "expert_time_s": times,
                     "slowest_ep_rank": slow, "slowest_global_rank": group[slow], "all_to_all_count": len(a2a)}}


WORKLOAD = Workload(
    name="ep", help="expert parallelism for mixture-of-experts models over ep: dispatch and combine all_to_all "
                    "with per-peer sizes, routing skew what-if; pipeline over pp (DualPipeV overlap), dp replicas",
    dims=("pp", "dp", "ep"), required_dims=("ep",), fill_dim="dp", options=EPOptions, build=build, report=report,
    dim_words={"ep": "expert-parallel ranks", "dp": "data-parallel replicas", "pp": "pipeline stages"})
