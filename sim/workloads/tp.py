"""The ``tp`` workload: tensor parallelism (+ sequence parallelism) over mesh dimension ``tp``, as torch 2.13's
``parallelize_module`` with torchtitan's Llama plan issues it (sim/parallel/tp/plan.py builds the plan); with a mesh
dimension ``dp_shard`` (outermost; it takes the ranks tp leaves) FSDP2 x TP as torchtitan composes them
(sim/parallel/tp/compose.py, FSDP2's defaults; with dp_replicate too, HSDP x TP on 3-D); with a mesh dimension ``dp`` DDP x TP (sim/parallel/tp/ddp.py, DDP's defaults);
with ``pp`` PP x TP (sim/parallel/tp/pipeline.py; dp then replicates the pipeline; ``pp: 1`` in the mesh with
microbatches > 1 is gradient accumulation: one stage, the dp all-reduce after the last micro-batch, as
Megatron-LM without overlap); with ``pp`` and ``dp_shard`` PP x FSDP2 x TP (FSDP2 inside each stage). All are
sim/parallel/parallelize.py; a scenario with a section per parallelism composes any of them (docs/parallelisms.md).
Reports the per-rank memory (local shards, the model family's activations; sim/parallel/tp/memory.py) in GB and GiB,
the tp collectives per step, and flags what does not fit.
Process groups (sim/kernel/communicators.py): the tp group (its all-gathers, reduce-scatters and all-reduces run
one at a time, in issue order); composed, the dp_shard (FSDP2), dp_replicate (HSDP) or dp (DDP) group beside it:
tp and data-parallel collectives overlap; PP x TP's activations on pair communicators."""
from __future__ import annotations

import math

from distlab.sim.errors import ConfigError
from distlab.sim.plan import Collective
from distlab.sim.parallel.tp.compose import fsdp_tp_plan
from distlab.sim.parallel.pipeline.plan import PipelineSpec
from distlab.sim.parallel.tp.ddp import ddp_tp_plan
from distlab.sim.parallel.tp.pipeline import pp_tp_plan
from distlab.sim.parallel.tp.plan import TPOptions, tp_plan
from distlab.sim.workloads.base import Workload


def build(model, mesh, opts: TPOptions, cluster):
    """TP alone, FSDP2 x TP (torchtitan's 2-D layout) when the mesh has dp_shard > 1, DDP x TP when dp > 1,
    PP x TP (x dp replicas of the pipeline) when pp > 1, PP x FSDP2 x TP with pp and dp_shard (FSDP2 inside each
    stage, not resharded after forward, as torchtitan does with pp): all sim/parallel/parallelize.py."""
    from dataclasses import replace
    from distlab.sim.models.activations import effective_recompute, require_structure
    require_structure(model, "tensor parallelism")
    opts = replace(opts, recompute=effective_recompute(model, opts.recompute, "tp.recompute"))
    dp, dp_shard, pp = (mesh.size(d) if d in mesh else 1 for d in ("dp", "dp_shard", "pp"))
    sharded = "dp_shard" in mesh or "dp_replicate" in mesh
    if dp > 1 and sharded:
        raise ConfigError(f"dp {dp} (DDP) with dp_shard or dp_replicate (FSDP2, HSDP) is not a layout torch "
                          "composes; allowed: dp_shard (and dp_replicate) with tp and pp, or dp with tp and pp",
                          "tp: mesh")
    if pp > 1 or "pp" in mesh and opts.microbatches > 1:    # pp 1 with m > 1: gradient accumulation
        spec = PipelineSpec(schedule=opts.schedule, stages=pp, microbatches=opts.microbatches, data_parallel=dp,
                            virtual_stages=opts.virtual_stages, split=opts.split)
        if sharded:
            from distlab.sim.parallel.fsdp.plan import FSDPOptions
            from distlab.sim.parallel.parallelize import Parallelisms, parallelize
            par = Parallelisms(pipeline=spec, tp=opts, fsdp=FSDPOptions(reshard_after_forward=pp == 1))
            plan = parallelize(model, mesh, par, cluster, where="tp")
        else:
            plan = pp_tp_plan(model, mesh, spec, opts, cluster=cluster)
    elif dp > 1:
        plan = ddp_tp_plan(model, mesh, tp_opts=opts)
    elif sharded:
        plan = fsdp_tp_plan(model, mesh, tp_opts=opts, cluster=cluster)
    else:
        from distlab.sim.parallel.layers import segments
        plan = tp_plan(model, mesh, opts, make_segments=segments)
    return plan, {"tp": plan.meta}


def memory(result) -> dict:
    """Per-GPU memory rows: sim/parallel/memory.py, the one model of every command."""
    from distlab.sim.parallel.memory import memory_section
    return memory_section(result)


def first_stage_memory(result, whole: dict) -> dict:
    """PP x TP: the fullest pipeline rank: its stages' share of the parameters, gradients and optimizer state
    (TP-local), and its stages' activations at the most micro-batches it keeps in flight, found by walking its
    schedule (each F adds its stage's blocks' activations, each B frees them: 1F1B keeps min(pp, m) on rank 0,
    GPipe m; Narayanan et al. 2021, arXiv 2104.04473, sec. 2.2; interleaved: v chunks each with its own count).
    With an even split and one stage per rank this is stage 0 (1F1B and GPipe keep the most there)."""
    from distlab.sim.parallel.pipeline import schedules as S
    from distlab.sim.parallel.pipeline.plan import stage_ranges
    model, o, pp, tp = result.model, result.options, result.mesh.size("pp"), result.mesh.size("tp")
    v, split = getattr(o, "virtual_stages", 1), getattr(o, "split", None)
    ranges = stage_ranges(model, pp * v, split)
    numel = layer_numels(model, tp)
    total = sum(numel)
    shares = [sum(numel[i] for i in r) / total for r in ranges]
    blocks = tuple(sum(1 for i in r if model.layers[i].name.startswith("h.")) for r in ranges)
    ranks = [0] if v == 1 and split is None else range(pp)      # else: the fullest rank
    peaks = peak_blocks(S.build(o.schedule, pp, o.microbatches, v), blocks, ranks)
    return fullest_rank(whole, shares, peaks, pp, model.config["layers"])


def layer_numels(model, tp: int) -> list[int]:
    """TP-local elements of each layer's parameters (sim/parallel/tp/rules.py local shapes)."""
    from distlab.sim.parallel.tp.rules import local_shape
    return [sum(math.prod(local_shape(q, tp)) for q in layer.params) for layer in model.layers]


def peak_blocks(schedule: list, blocks: tuple, ranks) -> dict:
    """Rank -> the most blocks' activations it holds at once walking its actions (F adds, B frees)."""
    out = {}
    for r in ranks:
        live = peak = 0
        for a in schedule[r]:
            live += blocks[a.stage] if a.kind == "F" else -blocks[a.stage] if a.kind == "B" else 0
            peak = max(peak, live)
        out[r] = peak
    return out


def fullest_rank(whole: dict, shares: list, peaks: dict, pp: int, layers: int) -> dict:
    """The parts of the rank (of ``peaks``) with the most bytes: static parts by its stages' ``shares``
    (stage s on rank s % pp), activations = the whole model's per block x its peak blocks."""
    best = None
    for r, peak in peaks.items():
        share = sum(shares[s] for s in range(r, len(shares), pp))
        parts = {k: val * share for k, val in whole.items() if k != "activations"}
        parts["activations"] = whole["activations"] / layers * peak
        if best is None or sum(parts.values()) > sum(best.values()):
            best = parts
    return best


def report(result) -> dict:
    from distlab.sim.parallel.tp.compose import collective_sequence
    counts: dict = {}
    seq = collective_sequence(result.plan, 0)
    ops = [o for o in result.plan.ranks[0] if isinstance(o, Collective)]
    for o, (op, nbytes, _, _, phase) in zip(ops, seq):
        dim = "tp" if o.name.startswith("tp ") else "dp" if o.name.startswith(("dp ", "grad all_reduce")) else \
            "dp_replicate" if o.name.startswith("all_reduce ") else "dp_shard"
        key = (dim, op, phase)
        n, b = counts.get(key, (0, 0))
        counts[key] = (n + 1, b + nbytes)
    table = {"title": "collectives per step (rank 0)", "columns": ["mesh dim", "collective", "phase", "count", "MiB"],
             "rows": [[d, op, ph, n, f"{b / 2**20:.3f}"] for (d, op, ph), (n, b) in counts.items()],
             "notes": ["bytes as nccl-tests count them (all_gather: output, reduce_scatter: input)"]}
    mem = memory(result)
    rows = [["tp group size", result.mesh.size("tp")], ["sequence parallel", result.options.sequence_parallel]]
    if "dp_shard" in result.mesh:
        rows.append(["FSDP2 shard group size (dp_shard)", result.mesh.size("dp_shard")])
    if "dp_replicate" in result.mesh:
        rows.append(["HSDP replicas (dp_replicate)", result.mesh.size("dp_replicate")])
    if "dp" in result.mesh:
        rows.append(["DDP replicas (dp)", result.mesh.size("dp")])
    if "pp" in result.mesh:
        rows.append(["pipeline stages (pp)", f"{result.mesh.size('pp')} ({result.options.schedule}, "
                                             f"{result.options.microbatches} micro-batches)"])
    rows += mem["rows"]
    return {"rows": rows, "tables": [table], "warnings": mem["warnings"],
            "json": {"collectives": [{"mesh_dim": d, "op": op, "phase": ph, "count": n, "bytes": b}
                                     for (d, op, ph), (n, b) in counts.items()], "memory": mem["json"]}}


WORKLOAD = Workload(
    name="tp", help="tensor parallelism (+ sequence parallelism) over tp: linears sharded column- and row-wise as "
                    "torchtitan's Llama plan; FSDP2 x TP with a dp_shard dimension, DDP x TP with dp",
    dims=("dp", "dp_replicate", "dp_shard", "pp", "tp"), required_dims=("tp",), fill_dim="dp_shard", options=TPOptions, build=build,
    report=report, dim_words={"tp": "tensor-parallel ranks", "dp_shard": "FSDP2 shard group size",
                                  "dp": "DDP replicas", "pp": "pipeline stages", "dp_replicate": "HSDP replicas"})
