"""The ``fsdp`` workload: FSDP2 / ZeRO 1-2-3 over mesh dimension ``dp_shard``, HSDP replicas over
``dp_replicate`` (sim/parallel/fsdp/plan.py builds the plan; sim/parallel/fsdp/report.py the memory report and figure).
Process groups (sim/kernel/communicators.py): the dp_shard group carries the all-gathers and reduce-scatters, one
at a time (``separate_reduce_scatter_group``: the reduce-scatters on a second group over the same ranks, so they
overlap); HSDP's all-reduces run on the dp_replicate group."""
from __future__ import annotations

from distlab.sim.parallel.fsdp.plan import FSDPOptions, fsdp_plan
from distlab.sim.parallel.fsdp.report import figure_of, report
from distlab.sim.workloads.base import Workload


def build(model, mesh, opts: FSDPOptions, cluster):
    return fsdp_plan(model, mesh, opts, cluster=cluster), {}


def sweep_row(result) -> dict:
    """Peak memory, and how long rank 0's backward all-gathers and reduce-scatters moved data at once (0 on one
    process group: separate_reduce_scatter_group)."""
    from distlab.sim.analysis import collective_overlap_s
    pk = result.report["json"]["peak_memory"]
    return {"peak_memory_bytes": pk["total_bytes"],
            "ag_rs_overlap_s": collective_overlap_s(result.trace, 0, "backward", "reduce_scatter")}


WORKLOAD = Workload(
    name="fsdp", help="FSDP2 / ZeRO: parameters, gradients and optimizer state sharded over dp_shard; HSDP "
                      "all-reduces across dp_replicate",
    dims=("dp_replicate", "dp_shard"), required_dims=("dp_shard",), fill_dim="dp_replicate", default_dim="dp_shard",
    options=FSDPOptions, build=build, report=report, figure=figure_of, sweep_row=sweep_row,
    dim_words={"dp_shard": "shard group size", "dp_replicate": "replica count"},
    legacy_keys={"shard_size": "dp_shard"}, intra_node_dims=("dp_shard",))
