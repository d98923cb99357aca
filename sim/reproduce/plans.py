"""One training step of a published run (sim/reproduce/runs.py) as a plan: the run as a scenario, built by the TP
builders, with what Megatron-LM adds around them.

    >>> from distlab.sim.reproduce.runs import load_runs
    >>> from distlab.sim.reproduce.scenario import scenario_of
    >>> scenario_of(load_runs()[0][0])["mesh"]
    {'dp': 32, 'pp': 1, 'tp': 1}

The scenario (sim/scenario.py) is the run's model, a mesh dp x pp x tp and a ``tp:`` section (sequence
parallelism, recompute, schedule, micro-batches, virtual stages, split); it is validated as any scenario is, and
its options drive the builders (sim/parallel/tp/): the compositions the scenario machinery gains make more rows
expressible. Around them:
- pp = 1: every rank runs its micro-batches (gradient accumulation) of TP segments, then the dp gradient
  reduction in buckets: with ``overlap_grad_reduce`` (torch DDP; Megatron's --overlap-grad-reduce) each bucket is
  reduced as soon as the last micro-batch's backward has produced it, buckets of max(40M, 1M x dp) elements
  (megatron/core/distributed/distributed_data_parallel.py, core_r0.8.0, lines 47-57), else one reduction after
  the backward. Gradients are reduced in float32 for bf16 training (megatron/training/arguments.py, core_r0.8.0,
  lines 299-305), else in the model's dtype. ZeRO 1 (Megatron's distributed optimizer) reduce-scatters them and
  steps 1/dp of the optimizer state; its parameter all-gather runs behind the next forward
  (--overlap-param-gather) and is not in the step.
- pp > 1: the pipeline of sim/parallel/tp/pipeline.py, each stage's gradients all-reduced over dp after its last
  backward (Megatron's local DDP of 2021); simulated on data-parallel replica 0 only (``replicas``), each such
  all-reduce a fixed-duration op of the time it takes on the whole cluster beside the other stages' (every
  replica runs the same program at the same times, so replica 0's timeline is every replica's;
  tests/test_reproduce.py compares it with the full simulation), then AdamW.
- AdamW: a memory-bound pass over the rank's parameters (ADAM_BYTES per element, sim/parallel/tp/plan.py).
- ZeRO 2/3 (FSDP2, pp = 1): the scenario's own plan (mesh dp_shard x tp: sim/parallel/tp/compose.py; with
  gradient accumulation a one-stage pipeline of the micro-batches, sim/reproduce/scenario.py); with
  float8, the blocks' all-gathers carry float8 weights (torchao's enable_fsdp_float8_all_gather: 1 byte for the
  linears, whose norms' few bf16 parameters are neglected; the root unit, with the output layer torchtitan's
  float8 converter skips, stays bf16).
- ``recompute: op`` (torchtitan's per-op selective activation checkpointing, ``selective_ac_option = "op"``:
  torchtitan/models/llama3/parallelize_llama.py ``_save_list`` and ``_custom_policy`` at e7c0cae and 54ef422):
  every output of an op in its save list is kept (mm, SDPA's flash and efficient attention, reduce-scatter, max)
  except every second mm of the block, the rest recomputed. So the backward of a block re-runs its 2nd, 4th, ...
  forward matmul (Llama: wk, wo, w3; the attention part has an even count, q k v o or qkv o, so the MLP's count
  continues the parity) and no attention: the scenario is built without recompute and each block's backward op
  gains those forward GEMMs.
- ``attention: flash2``: the attention calls as PyTorch's SDPA runs them (FlashAttention-2, sim/compute/gpus.py
  FA2_H100; torchtitan's SDPA module prefers FLASH_ATTENTION except on sm100, where cuDNN's is first).
- ``attention: unfused`` (Megatron 2021): attention kernels as batched GEMMs plus softmax and dropout passes;
  ``precision: float8``: every GEMM op's dtype float8_e4m3fn, priced with the run's ``fp8_recipe``
  (sim/compute/fp8.py: Transformer Engine's delayed, current, blockwise and MXFP8 scaling, torchao's tensorwise
  and rowwise Float8Linear; default torchao tensorwise); FP8 all-gathers only where the recipe has them;
  ``compile``: torch.compile fuses the elementwise kernels the model already prices as fused and leaves GEMMs and
  attention to their extern kernels: no change; an eager torch-native run (``compile: false`` with SDPA's
  ``attention: flash2``, unfused elementwise kernels) pays TORCH_COMPILE_SPEEDUP (sim/compute/kernels.py) on
  every compute op.
"""
from __future__ import annotations

import re
from dataclasses import replace

from distlab.sim.plan import Collective, Compute, Plan, Record, Wait
from distlab.sim.reproduce.scenario import grad_dtype, model_dtype, parts, scenario_of  # noqa: F401

MEGATRON_BUCKET_ELEMENTS = 40_000_000      # max(40M, 1M x dp) elements per bucket (module docstring)


def build_plan(run, cluster, replicas: bool = True, cache: dict | None = None) -> Plan:
    """One training step of ``run`` on ``cluster`` (module docstring)."""
    cache = cache if cache is not None else {}
    cache.setdefault("cluster", cluster)
    from distlab.sim.reproduce.scenario import is_moe
    if run.layout["zero"] >= 2 or is_moe(run):       # FSDP2 and MoE (EP) runs: their scenario's plan
        from distlab.sim import scenario as sc
        plan = sc.build(scenario_of(run), f"run {run.name}").plan
    elif run.layout["pp"] == 1:
        plan = _data_parallel_plan(run, replicas, cache)
    else:
        from distlab.sim.reproduce.pipeline import pipeline_plan
        plan = pipeline_plan(run, replicas, cache)
    one_tp_rank = plan.meta.get("one_tp_rank")
    rewrite = run.attention != "flash" or run.precision == "float8" or run.recompute == "op"
    if not rewrite and not one_tp_rank:
        return plan                     # as built (a composed plan may hold one rank per stage: shifts.py)
    shared: dict = {}
    ranks = plan.ranks
    if rewrite:
        ranks = [[_as_run(op, run, cluster, shared) for op in ops] for ops in ranks]
    if one_tp_rank:                     # each block of a stage's local work one op (exact: blocks.py)
        from distlab.sim.reproduce.blocks import collapsed
        ranks = [collapsed(ops, cluster.gpu) for ops in ranks]
    return Plan(ranks, name=plan.name, meta=plan.meta)


def _as_run(op, run, cluster, shared: dict):
    """The op as the run ran it: unfused attention, float8 GEMMs, FSDP2's float8 all-gather of the blocks,
    torch.compile's documented speed-up of the compute (one new op per distinct op: the builders make every
    micro-batch's ops anew, equal in value, and pricing each again took a quarter of a 64-GPU float8 row)."""
    from distlab.sim.compute.fp8 import recipe
    if isinstance(op, Collective) and run.precision == "float8" and op.op == "all_gather" \
            and op.name.startswith("all_gather h.") and recipe(run.fp8_recipe).fp8_all_gather:
        return replace(op, bytes=op.bytes // 2)
    if not isinstance(op, Compute) or op.seconds is not None:
        return op
    key = (op, type(op.flops), type(op.bytes))      # Compute is a frozen dataclass: equal ops, one key
    if key not in shared:
        new = op
        if run.attention != "flash" and op.attention is not None:
            new = replace(new, attention_kernel=run.attention)
        if run.recompute == "op" and op.gemms and _BLOCK_BACKWARD.match(op.name):
            new = replace(new, gemms=_every_second_forward(op.gemms) + op.gemms)
        from distlab.sim.compute.kernels import TORCH_COMPILE_SPEEDUP, op_seconds
        if run.precision == "float8" and op.gemms:
            new = replace(new, dtype="float8_e4m3fn")
            if run.fp8_recipe:                      # priced with the run's recipe (sim/compute/fp8.py)
                new = replace(new, seconds=op_seconds(new, cluster.gpu, run.fp8_recipe))
        if run.attention == "flash2" and not run.compile:        # eager torch: unfused elementwise kernels
            new = replace(new, seconds=op_seconds(new, cluster.gpu) * TORCH_COMPILE_SPEEDUP)
        shared[key] = (op, new)
    return shared[key][1]


_BLOCK_BACKWARD = re.compile(r"bwd h\.\d+\.(attn|mlp)$")


def _every_second_forward(backward: tuple) -> tuple:
    """The forward GEMMs (M, N, K) at even positions (2nd, 4th, ...) of a block part whose backward GEMMs are
    ``backward`` (each forward GEMM's data gradient (M, K, N) then weight gradient (K, N, M), in forward order)."""
    forward = [(M, N, K) for M, K, N in backward[::2]]
    return tuple(g for i, g in enumerate(forward) if i % 2 == 1)


def _data_parallel_plan(run, replicas: bool = False, cache: dict | None = None) -> Plan:
    """pp = 1: micro-batches of TP segments, bucketed dp gradient reduction, AdamW (module docstring); with
    ``replicas`` only replica 0's TP ranks, each bucket's reduction a fixed-duration op on its stream."""
    from distlab.sim.reproduce.pipeline import dp_allreduce_seconds
    from distlab.sim.dtypes import DTYPE_BYTES
    from distlab.sim.parallel.tp.compose import tp_local_model
    from distlab.sim.parallel.layers import segments
    from distlab.sim.parallel.tp.plan import ADAM_BYTES, ADAM_FLOPS, _Program
    from distlab.sim.parallel.tp.rules import local_numel, partial_grad_params
    model, mesh, opts = parts(run)
    L, tp = run.layout, run.layout["tp"]
    local = tp_local_model(model, tp)
    gbytes, zero1 = DTYPE_BYTES[grad_dtype(run)], L["zero"] == 1
    buckets = _buckets(local, L["dp"] if run.overlap_grad_reduce else None)
    partial = [q.name for q in partial_grad_params(model, opts.sequence_parallel)][::-1]
    n_local = local_numel(model, tp)
    ranks = []
    for r in range(tp if replicas else mesh.world_size):
        p = _Program(mesh.group_of(r, "tp"), model.config["dtype"])
        seg = segments(model, opts, p, r)
        for m in range(run.microbatches):
            for layer in model.layers:
                seg.forward(layer.name)
            for layer in reversed(model.layers):
                seg.backward(layer.name)
                if m == run.microbatches - 1:
                    p.ops.append(Record(f"grads {layer.name}", "compute"))
        seg.partial_grads(partial, 1, "backward")
        group = mesh.group_of(r, "dp")
        if len(group) > 1:
            for k, (last, numel) in enumerate(buckets):
                op = "reduce_scatter" if zero1 else "all_reduce"
                c = Collective(op, numel * gbytes, grad_dtype(run), group, name=f"dp {op} bucket {k}", stream="dp")
                if replicas:
                    c = Compute(c.name, seconds=dp_allreduce_seconds(run, r, c.bytes, c.dtype, cache, op),
                                stream="dp")
                p.ops += [Wait(f"grads {last}", "dp"), c]
            p.ops += [Record("reduced", "dp"), Wait("reduced", "compute")]
        n = n_local // (L["dp"] if zero1 else 1)
        p.ops.append(Compute("optimizer", flops=ADAM_FLOPS * n, bytes=ADAM_BYTES * n, dtype=model.config["dtype"]))
        ranks.append(p.ops)
    plan = Plan(ranks, name=run.name, meta={"builder": "reproduce dp x tp", "buckets": len(buckets)})
    return plan if replicas else plan.validate()


def _buckets(local, dp: int | None) -> list[tuple[str, int]]:
    """(last layer to finish its backward, elements) per gradient bucket, in reduction order: the layers from the
    last to the first, cut every max(40M, 1M x dp) elements; ``dp`` None = one bucket (no overlap)."""
    cap = max(MEGATRON_BUCKET_ELEMENTS, 1_000_000 * dp) if dp is not None else float("inf")
    out, size = [], 0
    for layer in reversed(local.layers):
        size += sum(q.numel for q in layer.params)
        if size >= cap:
            out.append((layer.name, size))
            size = 0
    if size:
        out.append((local.layers[0].name, size))
    return out
