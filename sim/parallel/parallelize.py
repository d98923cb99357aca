"""Any composition of parallelisms on one device mesh, built as torchtitan applies them.

    mesh = Mesh({"pp": 2, "dp_shard": 2, "tp": 2})
    par = Parallelisms(pipeline=PipelineOptions(microbatches=4), tp=TPOptions(), fsdp=FSDPOptions())
    plan = parallelize(model, mesh, par)              # FSDP2 x TP inside each of 2 pipeline stages

The steps, in torchtitan's order (torchtitan/models/llama3/infra/pipeline.py ``pipeline_llama``: split the model
into stages, then ``parallelize_llama`` on each stage's module: ``apply_tp``, ``apply_cp``, ``apply_ac``,
``apply_fsdp`` or ``apply_ddp``; experts are sharded with TP, ``apply_moe_ep_tp``):

1. pipeline (mesh dim ``pp``): the blocks are split into stages (sim/parallel/pipeline/split.py: even, or
   torchtitan's first and last stage with fewer blocks), the schedule orders each rank's actions, stages
   exchange the boundary tensor (sim/parallel/pipeline/plan.py);
2. TP (``tp``; + SP, loss parallel): every layer becomes its TP segment (sim/parallel/tp/plan.py);
3. CP (``cp``): attention becomes ring attention over the sequence shards (sim/parallel/cp/ring.py);
4. activation checkpointing: the recompute of TP's ``recompute`` and CP's ``recompute`` options, inside the
   rewritten blocks (sim/parallel/layers.py);
5. data parallelism around each stage's module: FSDP2 / HSDP / ZeRO-1-2 (``dp_shard``, ``dp_replicate``; with
   cp over torchtitan's flattened dp_shard_cp; sim/parallel/fsdp/step.py, inside a pipeline
   sim/parallel/fsdp/stage.py) or DDP (``dp``: sim/parallel/ddp/step.py; with a pipeline the replicas
   all-reduce each stage's gradients, sim/parallel/pipeline/plan.py);
6. EP (``ep``): the mixture-of-experts workload (sim/parallel/ep/plan.py) on its own mesh (pp, dp, ep); it is
   not composed with TP, CP or FSDP2 here.

Steps 2-4 rewrite the program of each layer (sim/parallel/layers.py); step 5 places those layers into the
rank's program (FSDP2's units, DDP's buckets, the pipeline's actions) and adds its collectives. Each step
touches only its own mesh dimensions, so any subset on any mesh composes. The builders that came before
(tp/compose.py ``fsdp_tp_plan``, tp/ddp.py ``ddp_tp_plan``, tp/pipeline.py ``pp_tp_plan``, cp/plan.py
``cp_plan``) are cases of this one; their plans are unchanged (tests/test_golden_compose.py).

Mesh: dimensions outermost first, any order torch's ``init_device_mesh`` takes; torchtitan's is ``pp,
dp_replicate, dp_shard, cp, tp`` (``MESH_ORDER``; tp innermost keeps its groups inside a node).
"""
from __future__ import annotations

from dataclasses import dataclass

from distlab.sim.errors import ConfigError
from distlab.sim.mesh import Mesh

STEPS = ("pipeline", "tp", "cp", "fsdp", "ddp")
DIMS = {"pipeline": ("pp",), "tp": ("tp",), "cp": ("cp",), "fsdp": ("dp_replicate", "dp_shard"), "ddp": ("dp",)}
MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "dp", "cp", "tp")


@dataclass
class Parallelisms:
    """The options of each parallelism applied (None: not applied), as the scenario sections give them."""
    pipeline: object = None          # PipelineOptions (sim/parallel/pipeline/plan.py), or a PipelineSpec
    tp: object = None                # TPOptions (sim/parallel/tp/plan.py)
    cp: object = None                # CPOptions (sim/parallel/cp/local.py)
    fsdp: object = None              # FSDPOptions (sim/parallel/fsdp/plan.py)
    ddp: object = None               # DDPOptions (sim/parallel/ddp/plan.py)

    def names(self) -> list[str]:
        return [s for s in STEPS if getattr(self, s) is not None]


def choose(mesh: Mesh, given: dict | None = None, where: str = "mesh") -> Parallelisms:
    """The parallelisms a mesh asks for: each dimension names one (pp -> pipeline, tp, cp, dp_shard and
    dp_replicate -> fsdp, dp -> ddp); ``given`` {name: options} overrides the defaults (a section whose
    dimensions the mesh lacks is an error). CP shards the parameters with FSDP2 over dp_shard x cp
    (torchtitan), so cp brings fsdp along."""
    from distlab.sim.parallel.cp.local import CPOptions
    from distlab.sim.parallel.ddp.plan import DDPOptions
    from distlab.sim.parallel.fsdp.plan import FSDPOptions
    from distlab.sim.parallel.pipeline.plan import PipelineOptions
    from distlab.sim.parallel.tp.plan import TPOptions
    defaults = {"pipeline": PipelineOptions, "tp": TPOptions, "cp": CPOptions, "fsdp": FSDPOptions,
                "ddp": DDPOptions}
    given = dict(given or {})
    for dim in mesh.names:
        if not any(dim in dims for dims in DIMS.values()):
            raise ConfigError(f"unknown mesh dimension {dim!r} for a composition; allowed: {', '.join(MESH_ORDER)}",
                              where)
    par = Parallelisms()
    for name, dims in DIMS.items():
        if any(d in mesh for d in dims) or name == "fsdp" and "cp" in mesh:
            setattr(par, name, given.pop(name, None) or defaults[name]())
    for name in given:
        raise ConfigError(f"the {name} section needs mesh dimension {' or '.join(DIMS[name])}; this mesh has "
                          f"{', '.join(mesh.names)}", where)
    return par


def check(model, mesh: Mesh, par: Parallelisms, where: str = "mesh") -> None:
    """What no step allows: DDP with FSDP2 or CP (torchtitan: "DDP has not supported > 1D parallelism" beyond TP),
    ZeRO-1/2 or split-backward schedules with TP or CP inside a pipeline."""
    if par.ddp is not None and (par.fsdp is not None or par.cp is not None) and "dp" in mesh:
        raise ConfigError(f"dp (DDP) composes with tp and pp only, not with {'cp' if par.cp else 'dp_shard'} "
                          "(torchtitan applies DDP only without FSDP2 and CP); allowed: dp_replicate with dp_shard "
                          "for HSDP", where)
    if par.fsdp is not None and par.fsdp.zero != 3 and (par.tp is not None or par.cp is not None):
        raise ConfigError(f"FSDP2 with TP or CP is built for ZeRO-3 (fully_shard) only; got zero {par.fsdp.zero}",
                          f"{where}: fsdp.zero")


def parallelize(model, mesh: Mesh, par: Parallelisms, cluster=None, only: list[int] | None = None,
                overhead: float = 0.0, where: str = "mesh"):
    """The plan of one training step of ``model`` on ``mesh`` with ``par``, built in torchtitan's order
    (module docstring). With ``cluster``, where the layout allows (sim/parallel/shifts.py), only one rank per
    class is built and the others are its renamings; ``only``: just these ranks (a plan of them, in that
    order, not validated). ``overhead``: seconds of the pipelining runtime's own work after each action."""
    from distlab.sim.parallel import steps
    check(model, mesh, par, where)
    model, par = without_unit_tp(model, mesh, par)
    if cluster is not None and only is None:
        from distlab.sim.kernel.relabel import relabelled
        from distlab.sim.parallel.shifts import composed_shifts
        shifts = composed_shifts(mesh, cluster, par)
        if shifts is not None:
            return relabelled(lambda reps: parallelize(model, mesh, par, None, reps, overhead, where), shifts)
    if par.pipeline is not None:
        plan = steps.pipelined(model, mesh, par, only, overhead, where)
    elif par.fsdp is not None:
        plan = steps.sharded(model, mesh, par, only, where)
    elif par.ddp is not None and par.tp is not None:
        plan = steps.replicated(model, mesh, par, where)
    elif par.ddp is not None:
        from distlab.sim.parallel.ddp.plan import ddp_plan
        plan = ddp_plan(model, mesh, par.ddp)[0]
    elif par.tp is not None:
        from distlab.sim.parallel.layers import segments
        from distlab.sim.parallel.tp.plan import tp_plan
        plan = tp_plan(model, mesh, par.tp, where=where, make_segments=segments)
    else:
        raise ConfigError("nothing to parallelize: the mesh names none of pp, dp_replicate, dp_shard, dp, cp, tp",
                          where)
    return plan if only is not None else plan.validate()


def without_unit_tp(model, mesh: Mesh, par: Parallelisms) -> tuple:
    """(model, par) with a tp dimension of size 1 not applied when another step is (torchtitan applies TP only
    when ``parallel_dims.tp_enabled``, tp > 1): its recompute becomes the model's (the layers' kernels and
    activations, sim/parallel/layers.py ``kernel_layers``), so ``tp: 1`` with DDP, FSDP2, CP or a pipeline is the
    same plan as no tp section (DDP then overlaps its buckets with the backward, as torch does without DTensor)."""
    from dataclasses import replace
    if par.tp is None or "tp" not in mesh or mesh.size("tp") != 1 or not (par.pipeline or par.fsdp or par.ddp
                                                                           or par.cp):
        return model, par
    if (model.config or {}).get("kind") in ("gpt", "moe"):
        from distlab.sim.parallel.tp.rules import tp_local_model
        rc = par.tp.recompute
        model = tp_local_model(model, 1, replace(par.tp, sequence_parallel=False, loss_parallel=False))
        model = replace(model, config={**model.config, "recompute": rc})
    return model, replace(par, tp=None)


def action_programs(model, mesh: Mesh, par, ranks: list[int], where: str = "mesh") -> tuple[dict, dict]:
    """What some ranks of a pipelined composition run, piece by piece, for an estimate that times the pieces
    and schedules them (sim/planner/estimate.py ``streams_makespan``) instead of simulating every rank.
    Returns ({rank: {piece: ops}}, the plan's pipeline metadata: ``boundary_bytes`` per rank and stage,
    ``stage_to_rank``, ``layers_per_stage``, ...). Pieces: ("F" or "B", stage, micro-batch): the action's ops (TP
    segments, ring attention, FSDP2's all-gathers); ("reduce", stage): the gradient synchronisation after the
    stage's last backward (FSDP2's reduce-scatters, HSDP's all-reduces); ("optimizer",): AdamW (ZeRO-1/2: and
    its all-gathers). A rank's plan (``parallelize(..., only=[rank])``) is its pieces in schedule order with the
    pipeline's sends, receives and events between; a Wait in a piece may name an event an earlier piece
    recorded (FSDP2's prefetch). Needs a pipeline with tp, cp or fsdp inside its stages (a bare pipeline's
    action is one Compute of its stage's FLOPs; PP x DDP's all-reduce: sim/parallel/pipeline/plan.py)."""
    from distlab.sim.parallel.pipeline.plan import PipelineSpec
    from distlab.sim.parallel.pipeline.stages import pipeline_program, pipeline_spec
    check(model, mesh, par, where)
    if par.pipeline is None or par.tp is None and par.cp is None and par.fsdp is None:
        raise ConfigError("action_programs needs a pipeline with tp, cp or fsdp inside its stages; got "
                          f"{', '.join(par.names()) or 'nothing'}", where)
    o = par.pipeline
    spec = o if isinstance(o, PipelineSpec) else pipeline_spec(o, model, mesh, f"{where}: pipeline")
    pieces: dict = {}
    plan = pipeline_program(model, mesh, par, spec, only=list(ranks), where=where, pieces=pieces)
    out: dict = {r: {} for r in ranks}
    for key, ops in pieces.items():
        out[key[0]][key[1:]] = ops
    return out, plan.meta["pipeline"]
