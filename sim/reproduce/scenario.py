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
schedule with one stage per rank is 1F1B), simulated with one rank per stage (sim/parallel/shifts.py). HSDP
(layout key ``dp_shard`` < dp under zero 3: MosaicML's HYBRID_SHARD) puts {dp_replicate, dp_shard} in dp_shard's
place. A MoE run is the ``ep`` workload (``ep_scenario``). The scenario is validated as any scenario is;
sim/reproduce/plans.py builds the step from its parts.
"""
from __future__ import annotations


def model_dtype(run) -> str:
    return "float16" if run.precision == "float16" else "bfloat16"


def grad_dtype(run) -> str:
    """float32 for bf16 training (Megatron accumulates and reduces in fp32), else the model's dtype."""
    return "float16" if run.precision == "float16" else "float32"


def is_moe(run) -> bool:
    """Whether the run's model has experts: its step is the EP builder's (``ep_scenario``), at any ep."""
    from distlab.sim.models import model_from_spec
    spec = run.model_spec
    if not any(k in spec for k in ("kind", "preset", "hf_config", "factory")):
        return False                                       # builder arguments without a kind: a gpt
    if "kind" in spec:
        return spec["kind"] == "moe"
    return (model_from_spec({**spec, "micro_batch": 1}, f"run {run.name}: model").config or {}).get("kind") == "moe"


EP_OPS_PER_BLOCK = 45        # ops per rank, micro-batch and MoE block (forward + backward), counted on built EP plans
EP_MAX_OPS = 400_000         # an EP row's plan at most: 184k ops (Mixtral 8x7B on 64 GB200): 18 s at load 5


def ep_plan_ops(run) -> int:
    """About how many ops the EP plan of ``run`` holds: every rank is built (EP plans have no symmetry classes),
    EP_OPS_PER_BLOCK per rank, micro-batch and block of its stage."""
    from distlab.sim.models import model_from_spec
    layers = model_from_spec({**run.model_spec, "micro_batch": 1}, f"run {run.name}: model").config["layers"]
    return EP_OPS_PER_BLOCK * run.gpus * run.microbatches * -(-layers // run.layout["pp"])


def ep_scenario(run) -> dict:
    """A MoE run as the ``ep`` workload: mesh {pp, dp, ep}, ep folded from the run's dp (Megatron's expert data
    parallelism, torchtitan's ExpertParallel), ZeRO-1 when the run shards the optimizer (zero 1), the run's
    micro-batches (with pp: the pipeline's; without: gradient accumulation), schedule and split; recompute on the
    model. Balanced routing (skew 0): what the runs' auxiliary-loss-free or aux-loss balancers aim at."""
    L = run.layout
    schedule = run.schedule if L["pp"] > 1 else "1f1b"
    ep = {"zero1": L["zero"] >= 1, "microbatches": run.microbatches, "schedule": schedule, "split": L["split"]}
    model = {**run.model_spec, "micro_batch": run.micro_batch, "dtype": model_dtype(run)}
    if run.recompute != "none":
        model["recompute"] = run.recompute
    return {"name": run.name, "model": model, "mesh": {"pp": L["pp"], "dp": L["dp"] // L["ep"], "ep": L["ep"]},
            "ep": ep, "cluster": run.cluster, "world_size": run.gpus}


def scenario_of(run) -> dict:
    """The run as a scenario dict (validated by sim/scenario.py); a MoE run: ``ep_scenario``."""
    from distlab.sim import scenario as sc
    if is_moe(run):
        return sc.validate(ep_scenario(run), f"run {run.name}")
    L = run.layout
    tp = {"sequence_parallel": bool(run.sequence_parallel and L["tp"] > 1), "recompute": "none" if run.recompute == "op" else run.recompute,
          "schedule": run.schedule, "microbatches": run.microbatches, "virtual_stages": L["virtual_stages"],
          "split": L["split"], "comm_overlap": bool(run.tp_comm_overlap and L["tp"] > 1)}
    shard = L.get("dp_shard") or L["dp"]      # HSDP (MosaicML's HYBRID_SHARD, torchtitan's dp_replicate x dp_shard)
    fsdp = {"dp_replicate": L["dp"] // shard, "dp_shard": shard} if shard < L["dp"] else {"dp_shard": L["dp"]}
    mesh = {**fsdp, "tp": L["tp"]} if L["zero"] >= 2 else {"dp": L["dp"], "pp": L["pp"], "tp": L["tp"]}
    extra = {}
    if L["zero"] >= 2:
        tp = {k: tp[k] for k in ("sequence_parallel", "recompute", "comm_overlap")}
    if L["zero"] >= 2 and (L["pp"] > 1 or run.microbatches > 1):   # PP x FSDP2 x TP (sim/parallel/parallelize.py);
        #  pp 1 with micro-batches: FSDP2 with gradient accumulation, one stage (as the planner builds it,
        #  sim/planner/layouts.py ``pipelined``), each micro-batch's gradients reduce-scattered (FSDP2's default)
        mesh = {"pp": L["pp"], **fsdp, "tp": L["tp"]}
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


def memory(run) -> dict:
    """{"pipeline_rank", "breakdown_bytes", "host_bytes"}: the run's memory per GPU as every command counts it
    (sim/parallel/memory.py ``memory_per_gpu`` on the run's scenario)."""
    from distlab.sim import scenario as sc
    from distlab.sim.parallel.memory import as_parallelisms, memory_per_gpu
    _, w, model, cluster, mesh, opts = sc.parts(scenario_of(run), f"run {run.name}")
    if w.name == "ep":                    # expert parallelism: its workload's own count, as simulate reports it
        from types import SimpleNamespace
        from distlab.sim.workloads.ep import memory as ep_memory
        parts = ep_memory(SimpleNamespace(model=model, mesh=mesh, options=opts, cluster=cluster))["json"]
        return {"pipeline_rank": 0, "breakdown_bytes": parts["breakdown_bytes"], "host_bytes": 0.0}
    return memory_per_gpu(model, mesh, as_parallelisms(mesh, opts))
