"""Simulate a published run (sim/reproduce/runs.py) and compare the predicted figure with the reported one.

    >>> from distlab.sim.reproduce.runs import load_runs
    >>> from distlab.sim.reproduce.predict import model_flops
    >>> f"{model_flops(load_runs()[0][0]):.3e}"                    # eq. 3 for Megatron's 1.7B row
    '1.547e+16'

The step is the plan of sim/reproduce/plans.py simulated on the run's cluster preset, its GPU timed by the one
compute model (sim/compute/: measured kernel rates, the generation's fitted constants). Model FLOPs are counted as
the source counts them:
- ``megatron-eq3`` = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) (Narayanan et al. 2021, eq. 3: forward, backward and
  the recomputed forward);
- ``megatron-core-0.8`` = 12·B·s·l·h²·((1 + g/n + s/h)·p + f/h·u + V/(2·l·h)), g query groups of n heads,
  p the query projection over h, f the FFN size, u 3/2 with SwiGLU (megatron/training/training.py
  ``num_floating_point_operations``, core_r0.8.0, lines 73-120: forward and backward, no recomputation);
- ``6nd`` = 6 x parameters x tokens; ``palm`` = (6N + 12·l·h·s) x tokens (sim/compute/flops.py).
Predicted figures: tflops_per_gpu = FLOPs / (step x GPUs), mfu = that / the bf16 peak, tokens_per_s = B·s / step,
tokens_per_s_per_gpu = that / GPUs, iteration_s = step.
"""
from __future__ import annotations

import time
from dataclasses import replace

from distlab.sim.cluster import PRESETS


def model_flops(run) -> float:
    """FLOPs of one step as the run's source counts them (module docstring)."""
    model = build_model(run)
    m = model.config
    B, s, l, h, V = run.global_batch, m["seq_len"], m["layers"], m["hidden"], m["vocab"]
    if run.flops == "megatron-eq3":
        return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    if run.flops == "megatron-core-0.8":
        n = m["heads"]
        g, f = m.get("kv_heads") or n, m.get("ffn_hidden") or 4 * h
        u = 1.5 if m.get("mlp", "swiglu" if m.get("arch") == "llama" else "gelu") == "swiglu" else 1.0
        return 12.0 * B * s * l * h * h * ((1 + g / n + s / h) + f / h * u + V / (2 * l * h))
    if run.flops == "palm":
        from distlab.sim.compute.flops import model_flops_per_token
        return model_flops_per_token(model) * B * s
    return 6.0 * model.num_params * B * s


def build_model(run):
    """The run's model: any form sim/models/spec.py resolves (the builder's arguments, a preset, a config.json);
    written without a kind, a gpt."""
    from distlab.sim.models import model_from_spec
    from distlab.sim.reproduce.scenario import model_dtype
    spec = run.model_spec                    # the vocabulary padded as Megatron pads it (runs.py padded_vocab)
    if not any(k in spec for k in ("kind", "preset", "hf_config", "factory")):
        spec["kind"] = "gpt"
    return model_from_spec({**spec, "micro_batch": run.micro_batch, "dtype": model_dtype(run), "name": run.name},
                           f"run {run.name}: model")


def cluster_for(run, overrides: dict | None = None):
    """The run's cluster preset at its GPU count; ``overrides`` {generation: Fitted} replaces the generation's fitted
    constants (benchmarks/reproduce_accuracy.py --fit): sustained and elementwise passes on the GPU spec."""
    from distlab.sim.compute.fitted import constants
    from distlab.sim.compute.kernels import kernel_model
    cluster = PRESETS[run.cluster].with_world_size(run.gpus)
    model = kernel_model(cluster.gpu)
    f = (overrides or {}).get(model.generation) if model else None
    if f is None or f == constants(model.generation):
        return cluster
    gpu = replace(cluster.gpu, sustained=f.sustained, elementwise_passes=f.elementwise_passes)
    return replace(cluster, gpu=gpu)


def step_seconds(run, overrides: dict | None = None, replicas: bool = True) -> float:
    """Simulated seconds of one training step of ``run`` (``replicas``: sim/reproduce/pipeline.py)."""
    return step_breakdown(run, overrides, replicas)["step_s"]


def step_breakdown(run, overrides: dict | None = None, replicas: bool = True) -> dict:
    """The simulated step of ``run`` and where rank 0 spends it: ``compute_s`` (its kernels: forward, backward,
    optimizer), ``exposed_comm_s`` (communication it waits for: data moving, no kernel running, including the
    fixed-duration dp reductions of sim/reproduce/pipeline.py) and ``idle_s`` (neither: pipeline bubble, waiting for
    a peer stage)."""
    from distlab.sim.kernel.engine import simulate
    from distlab.sim.kernel.spans import union
    from distlab.sim.reproduce.plans import build_plan
    cluster = cluster_for(run, overrides)
    plan = build_plan(run, cluster, replicas, {"cluster": cluster})
    trace = simulate(plan, cluster, record_transfers=False, check=False)
    ops = trace.for_rank(0)
    comm_names = ("dp ", "grad all_reduce", "tp ")              # fixed-duration communication ops (Compute)
    busy = union([(o.start, o.end) for o in ops if o.kind == "compute" and not o.name.startswith(comm_names)])
    moving = union([(o.start if getattr(o, "launch", None) is None else o.launch, o.end) for o in ops
                    if o.kind in ("collective", "send", "recv") or (o.kind == "compute" and
                                                                    o.name.startswith(comm_names))])
    compute = sum(e - s for s, e in busy)
    exposed = union([(s, e) for s, e in moving])
    from distlab.sim.kernel.spans import overlap
    exposed_s = sum(e - s for s, e in exposed) - overlap(exposed, busy)
    return {"step_s": trace.makespan, "compute_s": compute, "exposed_comm_s": exposed_s,
            "idle_s": max(0.0, trace.makespan - compute - exposed_s)}


def predicted_figure(name: str, step_s: float, run, peak_tflops: float) -> float:
    tflops = model_flops(run) / (step_s * run.gpus) / 1e12
    tokens = run.global_batch * run.model["seq_len"] / step_s
    return {"tflops_per_gpu": tflops, "mfu": tflops / peak_tflops, "tokens_per_s": tokens,
            "tokens_per_s_per_gpu": tokens / run.gpus, "iteration_s": step_s}[name]


def predict(run, overrides: dict | None = None, replicas: bool = True) -> dict:
    """Simulate ``run``: its predicted and reported figure, the relative error, step time, MFU (model FLOPs as
    sim/compute/flops.py counts them) and wall time; an inexpressible run: the reason instead."""
    from distlab.sim.compute.fitted import constants
    from distlab.sim.compute.kernels import kernel_model
    from distlab.sim.reproduce.runs import not_expressible
    figure, reported = run.figure
    cluster = PRESETS[run.cluster]
    generation = kernel_model(cluster.gpu).generation if kernel_model(cluster.gpu) else cluster.gpu.arch
    fitted_on = (overrides or {}).get(generation, constants(generation)).fitted_on
    precision = {"bfloat16": "bf16", "float16": "fp16", "float8": "fp8"}[run.precision]
    base = {"name": run.name, "source": run.source, "table": run.table, "gpu": run.gpu, "generation": generation,
            "precision": precision, "generation_precision": f"{generation} {precision}",
            "fp8_recipe": (run.fp8_recipe or "torchao-tensorwise") if run.precision == "float8" else None,
            "world_size": run.gpus, "figure": figure, "reported": reported, "fitted": run.name in fitted_on,
            "assumed": list(run.assumed)}
    reason = not_expressible(run)
    if reason is not None:
        return {**base, "expressible": False, "reason": reason}
    t0 = time.perf_counter()
    parts = step_breakdown(run, overrides, replicas)
    step_s = parts["step_s"]
    predicted = predicted_figure(figure, step_s, run, cluster.gpu.tflops)
    from distlab.sim.compute.flops import model_flops_per_token
    tokens = run.global_batch * run.model["seq_len"]
    mfu = model_flops_per_token(build_model(run)) * tokens / (step_s * run.gpus * cluster.gpu.tflops * 1e12)
    from distlab.sim.reproduce.scenario import memory
    mem = memory(run)["breakdown_bytes"]
    return {**base, "expressible": True, "predicted": predicted, "error": (predicted - reported) / reported,
            "step_time_s": step_s, "mfu": mfu, "tokens_per_s_per_gpu": tokens / step_s / run.gpus,
            "compute_s": parts["compute_s"], "exposed_comm_s": parts["exposed_comm_s"], "idle_s": parts["idle_s"],
            "memory_per_gpu_bytes": mem, "memory_total_bytes": sum(mem.values()),
            "wall_s": time.perf_counter() - t0}
