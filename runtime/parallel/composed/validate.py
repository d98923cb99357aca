"""`distlab validate --scenario` for a composed scenario (sim/workloads/composed.py): run it for real as torchtitan
builds it, predict its step on a cluster calibrated in the same launch, compare.

    distlab validate --scenario scenarios/composed-cpu.yaml --nproc 8

The real run is runtime/parallel/tp/pipeline.py (a pipeline: each stage parallelized on the tp sub-mesh, ``fully_shard`` on
its blocks and on the stage, torch.distributed.pipelining's schedule, AdamW) or runtime/parallel/tp/run.py (FSDP2 x TP,
HSDP x TP without a pipeline). The calibration is runtime/parallel/tp/calibrate.py's, on the tp group (without tp: the
dp_shard group) at the plan's collective sizes; the prediction the composed plan with FSDP2 on one stream (gloo
blocks in every call) and the pipelining runtime's measured overhead per action (runtime/parallel/tp/validate.py
``compare``). Rows: the step predicted vs measured, one row per collective kind and size, and whether every
rank's collectives equal the plan's per mesh dimension, in order (sim/workloads/composed_report.py
``sequence_by_dim``).
"""
from __future__ import annotations

from distlab.sim.errors import ConfigError

DIMS = ("pp", "dp_replicate", "dp_shard", "tp")       # what the real run builds


def prepare(scenario, nproc: int):
    """(built scenario Result, the run's variant, calibration sizes); refuses what the real run does not build
    before starting ranks."""
    from distlab.runtime.parallel.tp.calibrate import plan_sizes
    from distlab.sim import scenario as sc
    from distlab.sim.workloads import composed
    s = sc.on_world(scenario, nproc)            # a Scenario as parsed (a mapping or a path: parsed here, once)
    if s.workload != composed.WORKLOAD.name:
        raise ConfigError("validate_composed needs a composed scenario (several sections, or a mesh of several "
                          "parallelisms)", "scenario")
    built = sc.build(s)
    par, mesh = built.options, built.mesh
    extra = [k for k in mesh.names if k not in DIMS]
    if extra or par.pipeline is None and "tp" not in mesh:
        raise ConfigError(f"the real composed run builds meshes of {', '.join(DIMS)} with pp or tp; got "
                          f"{', '.join(mesh.names)}", "mesh")
    if built.model.config.get("arch") != "llama":
        raise ConfigError("the real composed run builds llama-arch models (runtime/parallel/tp/model.py); got arch "
                          f"{built.model.config.get('arch')!r}", "model")
    tp = par.tp
    if tp is not None and (tp.recompute != "none" or tp.loss_parallel):
        raise ConfigError("the real run neither recomputes activations nor computes the loss in parallel; allowed: "
                          "recompute none, loss_parallel false", "tp")
    f = par.fsdp
    if f is not None and (f.zero != 3 or f.param_dtype or f.reduce_dtype or not isinstance(f.reshard_after_forward,
                                                                                              bool)):
        raise ConfigError("the real run is FSDP2 (zero 3) in the model's dtype, resharding after forward or not; "
                          "allowed: zero 3, param_dtype and reduce_dtype none, reshard_after_forward true/false",
                          "fsdp")
    pipe = built.plan.meta.get("pipeline")
    if pipe and (pipe["schedule"] not in ("gpipe", "1f1b") or pipe["virtual_stages"] != 1):
        raise ConfigError(f"the real run has one stage per rank under gpipe or 1f1b; got {pipe['schedule']} with "
                          f"{pipe['virtual_stages']} stages per rank", "pipeline.schedule")
    variant = {"model": built.model, "mesh": [[k, v] for k, v in mesh.as_dict().items()],
               "sequence_parallel": tp.sequence_parallel if tp else False,
               "loss_parallel": False, "schedule": pipe["schedule"] if pipe else "1f1b",
               "microbatches": pipe["microbatches"] if pipe else 1, "split": pipe["split"] if pipe else None,
               "reshard_after_forward": f.reshard_after_forward if f else True}
    return built, variant, plan_sizes(built.plan) if tp is not None else fsdp_sizes(built.plan)


def fsdp_sizes(plan) -> dict:
    """{op: sorted distinct bytes} of FSDP2's all-gathers and reduce-scatters, plus 8 x the largest."""
    from distlab.sim.plan import Collective
    out: dict = {}
    for o in plan.ranks[0]:
        if isinstance(o, Collective) and o.op in ("all_gather", "reduce_scatter"):
            out.setdefault(o.op, set()).add(o.bytes)
    return {op: sorted(v | {8 * max(v)}) for op, v in out.items()}


def sequences_match(built, results) -> bool:
    """Every rank's collectives and sends equal the plan's per mesh dimension, in order."""
    from distlab.runtime.parallel.tp.run import measured_sequence
    from distlab.sim.workloads.composed_report import dim_of, sequence_by_dim
    mesh = built.mesh
    for rank in range(mesh.world_size):
        got: dict = {}
        for kind, nbytes, dtype, group, phase in measured_sequence(results, 0, rank):
            if kind in ("send", "recv"):
                got.setdefault("pp", []).append((kind, nbytes, group[0]))
            else:
                got.setdefault(dim_of(mesh, group, rank), []).append((kind, nbytes, dtype, group, phase))
        if got != sequence_by_dim(built.plan, mesh, rank):
            return False
    return True


def validate_composed(scenario, nproc: int = 8, steps: int = 3, warmup: int = 1, timeout: float = 600.0) -> dict:
    """Run the scenario for real on ``nproc`` gloo ranks, calibrated in the same launch, and compare
    (runtime/parallel/tp/validate.py ``compare``, with the sequences checked per mesh dimension)."""
    from distlab.runtime.measure import load
    from distlab.runtime.parallel.composed.run import run
    from distlab.runtime.parallel.tp.validate import compare
    built, variant, sizes = prepare(scenario, nproc)
    before = load.sample()
    results = run([variant], world=nproc, steps=steps, warmup=warmup, timeout=timeout, calibrate=sizes)
    report = compare(built, results, before.effective_cores(nproc) if before else None)
    report["sequence_match"] = sequences_match(built, results)
    return report


def composed_cases(scenario, args) -> list[dict]:
    """`distlab validate --scenario composed.yaml` rows (runtime.measure.validation.case format), of the typed
    Scenario `validate` parsed."""
    from distlab.runtime.parallel.tp.validate import rows_as_cases
    nproc = max(int(str(getattr(args, "nproc", 8)).split(",")[0]), 2)
    r = validate_composed(scenario, nproc=nproc, steps=max(getattr(args, "iters", 5), 2),
                          warmup=max(getattr(args, "warmup", 1), 1))
    rows = rows_as_cases(r, nproc)
    for c in rows:
        c["kind"] = "composed scenario"
    return rows
