"""Step 5 of sim/parallel/parallelize.py for each kind of program: the data-parallel step (FSDP2, DDP) or the
pipeline, around the layer programs of steps 2-4 (sim/parallel/layers.py).

    plan = sharded(model, Mesh({"dp_shard": 4, "tp": 2}), Parallelisms(tp=TPOptions(), fsdp=FSDPOptions()))

- ``sharded``: FSDP2 / HSDP / ZeRO (sim/parallel/fsdp/step.py) over dp_shard (with cp: torchtitan's flattened
  dp_shard_cp, every rank of a cp group holding the same shard of a different sequence piece);
- ``replicated``: DDP x TP (sim/parallel/ddp/step.py);
- ``pipelined``: the pipeline's schedule (sim/parallel/pipeline/plan.py) with each action's layers from the
  layer programs, and inside each stage FSDP2 (sim/parallel/fsdp/stage.py) or nothing (dp then replicates the
  pipeline: each stage's gradients all-reduced after its last backward).
Names and metadata follow the builders these cases replaced (fsdp_tp, ddp_tp, pp_tp, cp), so their plans stay
byte-identical (tests/test_golden_compose.py); new compositions are named by their steps (``pp_fsdp_tp``).
"""
from __future__ import annotations

from distlab.sim.mesh import Mesh
from distlab.sim.parallel.fsdp.step import data_parallel_mesh
from distlab.sim.parallel.layers import dtensor_optimizer, layers_factory, local_models, sizes
from distlab.sim.plan import Plan


def sharded(model, mesh: Mesh, par, only, where: str) -> Plan:
    """FSDP2 (x TP) (x CP) without a pipeline."""
    from distlab.sim.parallel.fsdp.step import fsdp_ranks, partial_units
    local, shard = local_models(model, mesh, par)
    tp = par.tp is not None
    units = partial_units(model, shard, par.tp.sequence_parallel) if tp else {}
    ranks, base = fsdp_ranks(model, shard, mesh, data_parallel_mesh(mesh, where), par.fsdp,
                             layers_factory(local, mesh, par), units, dtensor_optimizer(model, par), where, only)
    n = sizes(mesh)
    if par.cp is not None:
        c, o = model.config, par.cp
        meta = {**({"tp": n["tp"]} if tp else base.meta), "builder": "cp", "cp": n["cp"],
                "rotate_method": o.rotate_method, "load_balance": o.load_balance, "recompute": o.recompute,
                "seq_len": c["seq_len"], "local_tokens": c["micro_batch"] * c["seq_len"] // n["cp"]}
        return Plan(ranks, name=f"cp{n['cp']}-{o.rotate_method}-{model.name}", meta=meta)
    if not tp:
        return Plan(ranks, name=base.name, meta=base.meta)
    meta = {**base.meta, "builder": "fsdp_tp", "tp": n["tp"], "sequence_parallel": par.tp.sequence_parallel}
    return Plan(ranks, name=f"fsdp{n['dp_shard']}-tp{n['tp']}-{model.name}", meta=meta)


def replicated(model, mesh: Mesh, par, where: str) -> Plan:
    """DDP x TP."""
    from distlab.sim.parallel.ddp.step import ddp_ranks
    from distlab.sim.parallel.tp.rules import local_numel, partial_grad_params
    opts = par.ddp.validate(where)
    local, shard = local_models(model, mesh, par)
    partial = [q.name for q in partial_grad_params(model, par.tp.sequence_parallel)][::-1]
    n_local = local_numel(model, mesh.size("tp"))
    ranks, buckets = ddp_ranks(model, mesh, opts, layers_factory(local, mesh, par), shard, partial, n_local, where)
    tp = mesh.size("tp")
    meta = {"builder": "ddp_tp", "model": model.name, "tp": tp, "dp": mesh.size("dp"),
            "sequence_parallel": par.tp.sequence_parallel, "local_params": n_local,
            "buckets": [{"index": k, "bytes": b.bytes, "params": len(b.params)} for k, b in enumerate(buckets)]}
    mode = "tp-sp" if par.tp.sequence_parallel else "tp"
    return Plan(ranks, name=f"ddp{mesh.size('dp')}-{mode}{tp}-{model.name}", meta=meta)


def pipelined(model, mesh: Mesh, par, only, overhead: float, where: str) -> Plan:
    """The pipeline with each action's layers from the layer programs; FSDP2 inside each stage (dp_shard),
    or dp replicas of the whole pipeline."""
    from distlab.sim.parallel.pipeline.plan import PipelineSpec
    from distlab.sim.parallel.pipeline.stages import pipeline_program, pipeline_spec
    o = par.pipeline
    spec = o if isinstance(o, PipelineSpec) else pipeline_spec(o, model, mesh, f"{where}: pipeline")
    return pipeline_program(model, mesh, par, spec, only, overhead, where)
