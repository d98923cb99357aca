"""Simulate a published run (sim/reproduce/runs.py) and compare the predicted figure with the reported one.

The plan is PP x TP x DP (sim/parallel/tp/pipeline.py ``pp_tp_plan`` on the mesh {dp, pp, tp}: the pipeline schedule
with each forward/backward replaced by the TP segments of its layers, each stage's gradients all-reduced over
its dp replicas after its last backward), plain Megatron TP (all-reduces; sequence parallelism came later), then
the optimizer step: AdamW's memory-bound pass over the rank's parameters once the gradients are reduced
(ADAM_BYTES per element, sim/parallel/tp/plan.py). ``attention: unfused`` (Megatron 2021, before FlashAttention): the
attention kernels are timed as batched GEMMs over the whole score matrix plus the memory-bound softmax and
dropout (sim/compute.py).

The GPU gets its generation's fitted GEMM efficiency curve (runs.yaml ``generations``; sim/compute.py).
Model FLOPs are counted as the source counts them: ``megatron-eq3`` = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))
(Narayanan et al. 2021, eq. 3: forward, backward and the recomputed forward); ``6nd`` = 6 x parameters x tokens.
Predicted figures: tflops_per_gpu = FLOPs / (step time x GPUs), mfu = that / peak, tokens_per_s = B·s / step
time, iteration_s = step time.
"""
from __future__ import annotations

import time
from dataclasses import replace

from distlab.sim.cluster import PRESETS
from distlab.sim.compute import saturating_curve
from distlab.sim.mesh import Mesh
from distlab.sim.plan import Collective, Compute, Plan, Record, Wait


def model_flops(run) -> float:
    """FLOPs of one step as the run's source counts them (module docstring)."""
    model = build_model(run)
    m = model.config
    B, s, l, h, V = run.global_batch, m["seq_len"], m["layers"], m["hidden"], m["vocab"]
    if run.flops == "megatron-eq3":
        return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 6.0 * model.num_params * B * s


def build_model(run):
    """The run's model: any form sim/models/spec.py resolves (the builder's arguments, a preset, a config.json);
    written without a kind, a gpt."""
    from distlab.sim.models import model_from_spec
    spec = dict(run.model)
    if not any(k in spec for k in ("kind", "preset", "hf_config", "factory")):
        spec["kind"] = "gpt"
    return model_from_spec({**spec, "micro_batch": run.micro_batch, "dtype": run.precision, "name": run.name},
                           f"run {run.name}: model")


def cluster_for(run, generations: dict):
    """The run's cluster preset at its GPU count, its GPU carrying the generation's fitted GEMM curve."""
    preset = PRESETS[run.cluster]
    cluster = preset.with_world_size(run.gpus)
    gen = generations.get(preset.gpu.arch)
    if gen is None:
        return cluster
    gpu = replace(cluster.gpu, gemm_efficiency=saturating_curve(gen.peak_fraction, gen.half_flops))
    return replace(cluster, gpu=gpu)


def build_plan(run, replicas: bool = True, cache: dict | None = None) -> Plan:
    """One training step of ``run`` (module docstring). ``replicas=True``: the ranks of data-parallel replica 0
    only, each stage's gradient all-reduce over dp replaced by its duration (``dp_allreduce_seconds``): every
    replica runs the same program at the same times, so replica 0's timeline is every replica's, exactly where
    the all-reduces of different stages do not share links (each stage on whole nodes: tp x pp a multiple of
    the node size, or one stage; tests/test_reproduce.py compares it with the full simulation)."""
    from distlab.sim.parallel.pipeline.plan import PipelineSpec
    from distlab.sim.parallel.tp.compose import tp_local_model
    from distlab.sim.parallel.tp.pipeline import pp_tp_plan
    from distlab.sim.parallel.tp.plan import ADAM_BYTES, TPOptions
    L = run.layout
    model = build_model(run)
    dp = min(L["dp"], 2) if replicas else L["dp"]            # 2: the plan carries the dp all-reduces to replace
    mesh = Mesh({"dp": dp, "pp": L["pp"], "tp": L["tp"]}, f"run {run.name}")
    spec = PipelineSpec(schedule=run.schedule, stages=L["pp"], microbatches=run.microbatches,
                        virtual_stages=L["virtual_stages"], data_parallel=dp)
    tp_opts = TPOptions(sequence_parallel=False, recompute=run.recompute)
    cache = cache if cache is not None else {"cluster": PRESETS[run.cluster].with_world_size(run.gpus)}
    one_tp_rank = replicas and L["tp"] > 1 and L["tp"] % cache["cluster"].gpus_per_node == 0
    keep = L["pp"] * L["tp"] if replicas else mesh.world_size
    needed = [g for g in range(keep) if not (one_tp_rank and g % L["tp"])]
    if replicas:
        plan = _pp_tp_ranks(model, mesh, spec, tp_opts, needed, run.name)
    else:
        plan = pp_tp_plan(model, mesh, spec, tp_opts, name=run.name, where=f"run {run.name}")
    local = tp_local_model(model, L["tp"])
    per_stage = plan.meta["pipeline"]["layers_per_stage"]
    stage_to_rank = plan.meta["pipeline"]["stage_to_rank"]
    ranks = []
    for g in range(keep):
        ops = plan.ranks[g]
        if g not in needed:
            ranks.append([])                          # TP rank 0 of the stage stands for the others
            continue
        if run.attention == "unfused":
            ops = [_unfused(op, cache) for op in ops]
        if replicas and dp > 1:
            ops = [_timed_allreduce(op, g, run, cache) for op in ops]
        if one_tp_rank:
            ops = [_timed_tp_collective(op, g, cache) for op in ops]
        layers = _layers_of(mesh.coords(g)["pp"], per_stage, stage_to_rank)
        n = sum(local.layers[i].param_bytes for i in layers) // _dtype_bytes(run)
        ops = ops + [Record("grads reduced", "comm"), Wait("grads reduced", "compute"),
                     Compute("optimizer", bytes=float(ADAM_BYTES * n), dtype=run.precision)]
        ranks.append(ops)
    return Plan(ranks, name=plan.name, meta=plan.meta)


def _pp_tp_ranks(model, mesh, spec, tp_opts, needed: list[int], name: str) -> Plan:
    """sim/parallel/tp/pipeline.py ``pp_tp_plan``'s programs for the ranks ``needed`` only (the others empty; tests/
    test_reproduce.py: the same step time as the full plan)."""
    from distlab.sim.parallel.tp.pipeline import pp_tp_plan
    built = pp_tp_plan(model, mesh, spec, tp_opts, name, only=list(needed))
    ranks = [[] for _ in range(mesh.world_size)]
    for g, ops in zip(needed, built.ranks):
        ranks[g] = ops
    return Plan(ranks, name=name, meta=built.meta)


def _timed_allreduce(op, rank: int, run, cache: dict):
    """A dp gradient all-reduce of replica 0's ``rank``, as a fixed-duration op on its stream."""
    if not isinstance(op, Collective) or not op.name.startswith("grad all_reduce stage"):
        return op
    seconds = dp_allreduce_seconds(run, rank, op.bytes, op.dtype, cache)
    return Compute(op.name, seconds=seconds, stream=op.stream)


def _timed_tp_collective(op, rank: int, cache: dict):
    """A TP collective of ``rank``, as a fixed-duration op on its stream: with tp a multiple of the node size,
    its group fills whole nodes and only it uses their NVLink/NVSwitch links (pipeline sends and dp all-reduces
    cross nodes on the NICs, sim/kernel/network.py routes), so its duration is that of the collective alone."""
    if not isinstance(op, Collective) or op.stream != "tp":
        return op
    from distlab.sim.kernel.engine import simulate_collective
    key = ("tp", op.op, op.bytes, op.algorithm, len(op.group))     # every node alike
    if key not in cache:
        trace, _ = simulate_collective(op.op, op.bytes, cache["cluster"], op.algorithm, group=op.group)
        cache[key] = trace.makespan
    return Compute(op.name, seconds=cache[key], stream=op.stream)


def dp_allreduce_seconds(run, rank: int, nbytes: int, dtype: str, cache: dict) -> float:
    """Seconds of the dp all-reduce of replica-0 rank ``rank``'s stage, simulated on the whole cluster together
    with the concurrent all-reduces of the other TP ranks of that stage (each over its own dp group)."""
    from distlab.sim.kernel.engine import simulate
    L, cluster = run.layout, cache["cluster"]
    per_replica = L["pp"] * L["tp"]
    first = rank - rank % L["tp"]                       # the stage's TP ranks in replica 0: first .. first+tp-1
    whole_nodes = per_replica % cluster.gpus_per_node == 0 and L["tp"] % cluster.gpus_per_node == 0
    key = ("dp", nbytes, dtype, None if whole_nodes else first)
    if key not in cache:
        ops: list = [[] for _ in range(run.gpus)]
        for t in range(L["tp"]):
            group = tuple(d * per_replica + first + t for d in range(L["dp"]))
            for g in group:
                ops[g] = [Collective("all_reduce", nbytes, dtype, group, name="dp grad all_reduce")]
        trace = simulate(Plan(ops, name="dp all_reduce").validate(), cluster, record_transfers=False, check=False)
        cache[key] = trace.makespan
    return cache[key]


def _dtype_bytes(run) -> int:
    from distlab.sim.dtypes import DTYPE_BYTES
    return DTYPE_BYTES[run.precision]


def _layers_of(pp_rank: int, layers_per_stage: list, stage_to_rank: list) -> list[int]:
    """Layer indices held by pipeline rank ``pp_rank`` (its stages, stage s on rank stage_to_rank[s])."""
    out, start = [], 0
    for s, n in enumerate(layers_per_stage):
        if stage_to_rank[s] == pp_rank:
            out += range(start, start + n)
        start += n
    return out


def _unfused(op, cache: dict):
    """The attention kernel of ``op`` as unfused attention (sim/compute.py), the op shared across ranks."""
    if not isinstance(op, Compute) or op.attention is None:
        return op
    hit = cache.get(id(op))
    if hit is None:
        hit = cache[id(op)] = (op, replace(op, attention_kernel="unfused"))
    return hit[1]


def predicted_figure(name: str, step_s: float, run, peak_tflops: float) -> float:
    tflops = model_flops(run) / (step_s * run.gpus) / 1e12
    return {"tflops_per_gpu": tflops, "mfu": tflops / peak_tflops,
            "tokens_per_s": run.global_batch * run.model["seq_len"] / step_s, "iteration_s": step_s}[name]


def step_seconds(run, generations: dict, replicas: bool = True) -> float:
    """Simulated seconds of one training step of ``run`` (``replicas``: see build_plan)."""
    from distlab.sim.kernel.engine import simulate
    cluster = cluster_for(run, generations)
    plan = build_plan(run, replicas, {"cluster": cluster})
    return simulate(plan, cluster, record_transfers=False, check=False).makespan


def predict(run, generations: dict, replicas: bool = True) -> dict:
    """Simulate ``run``: its predicted and reported figure, the relative error, step time and wall time."""
    t0 = time.perf_counter()
    cluster = cluster_for(run, generations)
    step_s = step_seconds(run, generations, replicas)
    figure, reported = run.figure
    predicted = predicted_figure(figure, step_s, run, cluster.gpu.tflops)
    gen = generations.get(cluster.gpu.arch)
    return {"name": run.name, "source": run.source, "world_size": run.gpus, "figure": figure,
            "reported": reported, "predicted": predicted, "error": (predicted - reported) / reported,
            "step_time_s": step_s, "fitted": bool(gen and run.name in gen.fitted_on),
            "wall_s": time.perf_counter() - t0}
