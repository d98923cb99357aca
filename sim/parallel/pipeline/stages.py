"""The pipeline as step 1 of sim/parallel/parallelize.py, with what the later steps made of each stage.

    spec = pipeline_spec(PipelineOptions(microbatches=16), model, Mesh({"pp": 16, "dp_shard": 128, "tp": 8}))
    plan = pipeline_program(model, mesh, par, spec)

The schedule, stage placement, p2p order and sizes are the pipeline builder's (sim/parallel/pipeline/plan.py);
each forward (F) and backward (B) action runs its stage's layers through the rank's layer program
(sim/parallel/layers.py: TP segments, ring attention, recompute), once per micro-batch. Boundary tensors: each
rank sends what it holds of b·s·h·e: s/cp tokens of the sequence under CP, 1/tp of them under sequence
parallelism (torchtitan's stages exchange the TP-local, cp-local tensors; checked against torch pipelining with
parallelize_module'd stages: tests/test_tp_runtime.py). The data-parallel step inside the stages:
- FSDP2 / ZeRO over dp_shard (and dp_replicate): sim/parallel/fsdp/stage.py places each action's all-gathers,
  reduce-scatters each stage's gradients after its last backward, and adds AdamW at the end of the rank's step;
- dp (no FSDP2): replicas of the whole pipeline, each stage's gradients all-reduced after its last backward
  (sim/parallel/pipeline/plan.py); as the pipeline builders always had it, no optimizer is modelled then.
Schedules that split the backward (I and W actions: zbh1, zbv) are refused with TP, CP or FSDP2 inside.
"""
from __future__ import annotations

from distlab.sim.dtypes import compute_dtype
from distlab.sim.errors import ConfigError
from distlab.sim.plan import Compute, Plan

SINGLE_STAGE = ("gpipe", "1f1b")      # torch's PipelineScheduleSingle; the others run on _PipelineScheduleRuntime


def pipeline_spec(opts, model, mesh, where: str = "pipeline"):
    """The PipelineSpec of PipelineOptions ``opts`` on ``mesh``: stages = pp, replicas = dp, the blocks split as
    sim/parallel/pipeline/split.py says (even, or torchtitan's first and last stage with fewer blocks)."""
    return opts.spec(mesh, model)


def pipeline_program(model, mesh, par, spec, only: list[int] | None = None, overhead: float = 0.0,
                     where: str = "pipeline", pieces: dict | None = None) -> Plan:
    """One step on ``mesh`` (module docstring); ``spec`` from :func:`pipeline_spec` (or a PipelineSpec given).
    ``pieces`` (a dict, filled for the ranks built): (rank, "F" or "B", stage, micro-batch) -> the ops of that
    action, (rank, "reduce", stage) -> the gradient synchronisation after the stage's last backward, (rank,
    "optimizer") -> the optimizer; the rank's program is these in schedule order with the pipeline's sends,
    receives and their events between (the planner times the pieces: sim/parallel/parallelize.py ``action_programs``)."""
    from distlab.sim.parallel.pipeline.plan import boundary_bytes, pipeline_plan, stage_ranges
    from distlab.sim.parallel.fsdp.step import data_parallel_mesh
    from distlab.sim.parallel.layers import layers_factory, local_models, sizes
    if par.tp is None and par.cp is None and par.fsdp is None:
        return pipeline_plan(model, mesh, spec, only=only, overhead=overhead)      # the pipeline's own program
    n = sizes(mesh)
    local, shard = local_models(model, mesh, par)
    sp = par.tp is not None and par.tp.sequence_parallel
    per_rank = boundary_bytes(local, 0) // (n["tp"] if sp else 1)
    ranges = stage_ranges(model, spec.stages * spec.virtual_stages, spec.split)
    names = [L.name for L in model.layers]
    dtype = compute_dtype(model)         # without FSDP2's MixedPrecisionPolicy: the parameters' dtype
    make, programs = layers_factory(local, mesh, par), {}

    def layers(g: int):
        if g not in programs:
            programs[g] = make(g)
        return programs[g]

    fsdp, first_stages, started = None, {}, set()
    if par.fsdp is not None:
        fsdp = _stage_fsdp(model, shard, mesh, par, ranges, data_parallel_mesh(mesh, where), where)
        if spec.schedule not in SINGLE_STAGE:          # torch's runtime unshards stages ahead (fsdp/stage.py)
            if par.fsdp.reshard_after_forward is not False:
                raise ConfigError(f"{spec.schedule} runs on torch's multi-stage runtime, which unshards each stage "
                                  "itself: FSDP2 inside it needs reshard_after_forward false", f"{where}: fsdp")
            from distlab.sim.parallel.pipeline import schedules as S
            for r, acts in enumerate(S.build(spec.schedule, spec.stages, spec.microbatches, spec.virtual_stages)):
                first_stages[r] = list(dict.fromkeys(a.stage for a in acts))[:3]

    def one(a, g: int) -> list:
        if a.kind not in ("F", "B"):
            what = "FSDP2" if fsdp else "TP" if par.tp else "CP"
            raise ConfigError(f"PP x {what} runs schedules of forward and full backward actions only; "
                              f"{spec.schedule!r} splits the backward ({a.kind}); allowed: gpipe, 1f1b, "
                              "interleaved-1f1b", f"{where}: schedule")
        lp = layers(g)
        if fsdp is not None and first_stages and g not in started:
            started.add(g)
            fsdp.unshard(lp, first_stages[mesh.coords(g)["pp"]], g)
        if fsdp is not None:
            (fsdp.forward if a.kind == "F" else fsdp.backward)(lp, a.stage, g)
        elif a.kind == "F":
            for i in ranges[a.stage]:
                L = shard.layers[i]
                lp.forward(Compute(f"fwd {L.name}", flops=L.fwd_flops,
                                   bytes=L.activation_bytes + L.transient_bytes + L.param_bytes, dtype=dtype),
                           names[i])
        else:
            for i in reversed(ranges[a.stage]):
                L = shard.layers[i]
                lp.backward(Compute(f"bwd {L.name}", flops=L.bwd_flops + L.recompute_flops,
                                    bytes=2 * (L.activation_bytes + L.transient_bytes) + L.param_bytes, dtype=dtype),
                            names[i])
        out = list(lp.ops)
        del lp.ops[:]
        return out

    def action_ops(a, g: int, partner) -> list:
        ops = one(a, g) + (one(partner, g) if partner is not None else [])
        if pieces is not None:
            pieces[g, a.kind, a.stage, a.mb] = ops
        return ops

    def grad_ops(stage: int, g: int) -> list:
        ops = [] if fsdp.each_microbatch else fsdp.reduce(layers(g), stage, g)    # else in each B (fsdp/stage.py)
        if pieces is not None:
            pieces[g, "reduce", stage] = ops
        return ops

    base = pipeline_plan(shard, mesh, spec, p2p_bytes=per_rank, only=only, overhead=overhead, action_ops=action_ops,
                         grad_ops=None if fsdp is None else grad_ops)
    ranks = base.ranks
    if fsdp is not None:
        placement = base.meta["pipeline"]["stage_to_rank"]
        built = range(mesh.world_size) if only is None else only
        ranks = [ops + _optimizer(fsdp, layers(g), g, [s for s, r in enumerate(placement) if r == mesh.coords(g)["pp"]],
                                  pieces) for g, ops in zip(built, ranks)]
    return Plan(ranks, name=_name(model, mesh, par, spec), meta=_meta(base.meta, mesh, par, fsdp))


def _optimizer(fsdp, layers, g: int, stages: list[int], pieces) -> list:
    ops = fsdp.optimizer(layers, g, stages)
    if pieces is not None:
        pieces[g, "optimizer"] = ops
    return ops


def _stage_fsdp(model, shard, mesh, par, ranges, dp_mesh, where):
    from distlab.sim.parallel.fsdp.stage import StageFSDP
    from distlab.sim.parallel.fsdp.step import partial_units
    partial = partial_units(model, shard, par.tp.sequence_parallel) if par.tp is not None else {}
    from distlab.sim.parallel.layers import dtensor_optimizer
    n_params = len(model.params) if dtensor_optimizer(model, par) else None
    return StageFSDP(shard, dp_mesh, par.fsdp, ranges, partial, n_params,
                     f"{where}: fsdp")


def _name(model, mesh, par, spec) -> str:
    parts = [f"pp{spec.stages}"]
    for name, dim in (("fsdp", "dp_shard"), ("hsdp", "dp_replicate"), ("cp", "cp")):
        if dim in mesh:
            parts.append(f"{name}{mesh.size(dim)}")
    if par.tp is not None:
        parts.append(f"{'tp-sp' if par.tp.sequence_parallel else 'tp'}{mesh.size('tp')}")
    return "-".join(parts + [model.name])


def _meta(base: dict, mesh, par, fsdp) -> dict:
    """The pipeline's metadata and what the other steps add; a PP x TP plan keeps the keys it had."""
    steps = ["pp"] + [s for s in ("fsdp", "cp", "tp") if getattr(par, s) is not None]
    meta = {**base, "builder": "_".join(steps)}
    if par.tp is not None:
        meta.update(tp=mesh.size("tp"), sequence_parallel=par.tp.sequence_parallel)
    if par.cp is not None:
        meta.update(cp=mesh.size("cp"), rotate_method=par.cp.rotate_method)
    if fsdp is not None:
        meta["fsdp"] = {"zero": par.fsdp.zero, "shard_size": fsdp.S, "reshard_after_forward":
                        par.fsdp.reshard_after_forward, "param_dtype": fsdp.pdt, "reduce_dtype": fsdp.rdt,
                        "units": [[[u.name, u.numel(), u.numel(fsdp.S)] for u in units] for units in fsdp.units]}
    return meta
