"""A published run (sim/reproduce/runs.py) as a scenario: its model, mesh and parallelism section (sim/scenario.py).

    >>> from distlab.sim.reproduce.runs import load_runs
    >>> from distlab.sim.reproduce.scenario import scenario_of
    >>> scenario_of(load_runs()[0][0])["tp"]["microbatches"]         # SC21's 1.7B: global 512 / (dp 32 x 16)
    1

pp x tp x dp runs become the ``tp`` workload on mesh {dp, pp, tp} with the run's sequence parallelism, recompute,
schedule, micro-batches, virtual stages, split and TP communication overlap (``tp_comm_overlap``: Megatron's
--tp-comm-overlap, sim/parallel/tp/overlap.py); ZeRO 2/3 runs (FSDP2) the same workload on mesh {dp_shard, tp},
and with pipeline stages or gradient accumulation the composition PP x FSDP2 x TP on mesh {pp, dp_shard, tp} (sim/parallel/parallelize.py:
FSDP2 inside each stage, not resharded after forward as torch's multi-stage runtime needs; an interleaved
schedule with one stage per rank is 1F1B), simulated with one rank per stage (sim/parallel/shifts.py).
The scenario is validated as any scenario is; sim/reproduce/plans.py builds the step from its parts.
"""
from __future__ import annotations


def model_dtype(run) -> str:
    return "float16" if run.precision == "float16" else "bfloat16"


def grad_dtype(run) -> str:
    """float32 for bf16 training (Megatron accumulates and reduces in fp32), else the model's dtype."""
    return "float16" if run.precision == "float16" else "float32"


def scenario_of(run) -> dict:
    """The run as a scenario dict (validated by sim/scenario.py)."""
    from distlab.sim import scenario as sc
    L = run.layout
    tp = {"sequence_parallel": bool(run.sequence_parallel and L["tp"] > 1), "recompute": "none" if run.recompute == "op" else run.recompute,
          "schedule": run.schedule, "microbatches": run.microbatches, "virtual_stages": L["virtual_stages"],
          "split": L["split"], "comm_overlap": bool(run.tp_comm_overlap and L["tp"] > 1)}
    mesh = {"dp_shard": L["dp"], "tp": L["tp"]} if L["zero"] >= 2 else {"dp": L["dp"], "pp": L["pp"], "tp": L["tp"]}
    extra = {}
    if L["zero"] >= 2:
        tp = {k: tp[k] for k in ("sequence_parallel", "recompute", "comm_overlap")}
    if L["zero"] >= 2 and (L["pp"] > 1 or run.microbatches > 1):   # PP x FSDP2 x TP (sim/parallel/parallelize.py);
        #  pp 1 with micro-batches: FSDP2 with gradient accumulation, one stage (as the planner builds it,
        #  sim/planner/layouts.py ``pipelined``), gradients reduce-scattered once after the last backward
        mesh = {"pp": L["pp"], "dp_shard": L["dp"], "tp": L["tp"]}
        v = L["virtual_stages"]
        schedule = "1f1b" if run.schedule == "interleaved" and v == 1 else run.schedule   # one stage per rank
        extra = {"pipeline": {"schedule": schedule, "microbatches": run.microbatches, "virtual_stages": v,
                              "split": L["split"]},
                 "fsdp": {"reshard_after_forward": False, "param_dtype": model_dtype(run),
                          "reduce_dtype": grad_dtype(run)}}
    d = {"name": run.name, "model": {**run.model_spec, "micro_batch": run.micro_batch, "dtype": model_dtype(run)},
         "mesh": mesh, "tp": tp, **extra, "cluster": run.cluster, "world_size": run.gpus}
    return sc.validate(d, f"run {run.name}")


def parts(run):
    """(model, mesh, TPOptions) of the run's scenario, parsed once (sim/scenario/parse.py)."""
    from distlab.sim import scenario as sc
    from distlab.sim.models import model_from_spec
    s = sc.from_dict(scenario_of(run), f"run {run.name}")
    return (model_from_spec(s.model_spec(), f"run {run.name}: model"), s.device_mesh(f"run {run.name}: mesh"),
            s.parallelisms["tp"])
