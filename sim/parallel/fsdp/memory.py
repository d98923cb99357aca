"""Per-GPU memory of data-parallel training: DDP, ZeRO 1/2/3 (= FSDP), static and over the simulated step.

Static bytes (ZeRO, Rajbhandari et al. 2019, arXiv 1910.02054, sec. 3 and fig. 1), Ψ parameters, shards of N:
  mixed-precision Adam (16-bit params): params 2Ψ, grads 2Ψ, optimizer KΨ with K = 12 (fp32 master, m, v);
  fp32 training (no master copy): 4Ψ, 4Ψ, K = 8 (m, v).
  DDP: (2 + 2 + K)Ψ;  ZeRO-1: 2Ψ + 2Ψ + KΨ/N;  ZeRO-2: 2Ψ + (2 + K)Ψ/N;  ZeRO-3/FSDP: (2 + 2 + K)Ψ/N.
  (Paper, 7.5B params on 64 GPUs: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.) Sharded terms use FSDP2's padded sizes:
  each parameter's dim 0 is padded to a multiple of N. HSDP shards over the shard group only.
Dynamic bytes from the plan's memory events (sim/parallel/fsdp/plan.py): unsharded units between their all-gather and
their reshard, unsharded gradients between backward and reduce-scatter, activations (model's activation_bytes,
sim/models/activations.py) from a layer's forward until its backward, and a layer's transient bytes (its
recomputed forward, its offloaded tensors brought back) while its backward runs. FSDP2 keeps sharded fp32 params and grads instead of ZeRO's 16-bit
copies plus fp32 master; the total per element (16 bytes) is the same.
"""
from __future__ import annotations

from distlab.sim.plan import DTYPE_BYTES

STATIC = ("params", "grads", "optimizer")
DYNAMIC = ("unsharded params", "unsharded grads", "activations")
STAGES = (0, 1, 2, 3)        # 0 = DDP (plain data parallel)


FSDP2_PRECISION = (4, 4, 8)   # fully_shard's sharded fp32 params, fp32 grads, AdamW m and v (fp32)


def precision(dtype: str, fsdp2: bool = False) -> tuple[int, int, int]:
    """(param bytes, grad bytes, optimizer bytes K) per parameter for Adam with params in ``dtype``: ZeRO's
    accounting, or with ``fsdp2`` (FSDP2 / ZeRO-3 fully_shard) what FSDP2 holds: the sharded parameters stay in
    their original dtype (fp32) while ``MixedPrecisionPolicy(param_dtype=bf16)`` gathers 16-bit copies, the
    reduced gradients are kept in the sharded parameter's dtype and AdamW's m and v follow it: 4 + 4 + 8, the
    same 16 bytes an element as ZeRO's 2 + 2 + 12 (torch.distributed.fsdp.MixedPrecisionPolicy: "FSDP ... keeps
    the high-precision sharded parameters in memory anyway ... The optimizer step uses the sharded parameter
    in the original dtype"). Every report of FSDP2 memory uses this split (the fsdp workload's report, the
    composition's, TP's and CP's with FSDP2); plans keep ZeRO's in their memory meta."""
    b = DTYPE_BYTES[dtype]
    if fsdp2:
        return FSDP2_PRECISION
    return b, b, (12 if b < 4 else 2 * b)


def fsdp2_split(parts: dict) -> dict:
    """``parts`` (ZeRO-3 accounting: params, grads, optimizer of n sharded elements, 16 bytes each) with those
    three split as FSDP2 holds them: 4n, 4n, 8n (``precision``); the other parts as they are."""
    total = parts["params"] + parts["grads"] + parts["optimizer"]
    n = total // 16 if isinstance(total, int) and total % 16 == 0 else total / 16
    p, g, k = FSDP2_PRECISION
    return {**parts, "params": n * p, "grads": n * g, "optimizer": n * k}


def static_bytes(model, world: int, zero: int, shard_size: int | None = None, dtype: str | None = None) -> dict:
    """Bytes per GPU of params, grads and optimizer state for ZeRO stage ``zero`` (0 = DDP), ZeRO's accounting
    (reports show FSDP2's split: ``fsdp2_split``)."""
    from distlab.sim.errors import ConfigError
    from distlab.sim.parallel.fsdp.units import model_dtype, padded_numel
    if zero not in STAGES or isinstance(zero, bool):
        raise ConfigError(f"unknown ZeRO stage {zero!r}; allowed: 0 (DDP), 1, 2, 3", "zero")
    S = shard_size or world
    if S < 1 or world % S:
        raise ConfigError(f"shard group size {S} must divide the world size {world}", "shard_size")
    p, g, k = precision(dtype or model_dtype(model))
    full = model.num_params
    shard = sum(padded_numel(q.shape, S) for q in model.params) // S
    return {"params": (shard if zero >= 3 else full) * p,
            "grads": (shard if zero >= 2 else full) * g,
            "optimizer": (shard if zero >= 1 else full) * k}


def memory_curve(plan, trace, rank: int = 0, span: tuple | None = None) -> tuple[list[float], list[int], list[dict]]:
    """Bytes on ``rank`` over the simulated step: (times, totals, dynamic bytes by category after each change).
    Starts and ends at the static level; frees at the same instant count before allocations."""
    mem = plan.meta["memory"]
    static = sum(mem["static"].values())
    when = {}
    for o in trace.for_rank(rank):
        when[o.index] = (o.start, o.end)
    changes = []
    for index, edge, delta, cat in mem["events"]:
        if index in when:
            t = when[index][0] if edge == "start" else when[index][1]
            changes.append((t, 0 if delta < 0 else 1, delta, cat))
    changes.sort(key=lambda c: (c[0], c[1]))
    t0, t1 = span or _span(trace)
    times, totals, parts = [t0], [static], [dict.fromkeys(DYNAMIC, 0)]
    cur = dict.fromkeys(DYNAMIC, 0)
    for t, _, delta, cat in changes:
        cur[cat] += delta
        times.append(t)
        totals.append(static + sum(cur.values()))
        parts.append(dict(cur))
    times.append(t1)
    totals.append(totals[-1])
    parts.append(dict(cur))
    return times, totals, parts


def peak(plan, trace, rank: int | None = None) -> dict:
    """Peak bytes (on ``rank``, or the highest rank) with the breakdown at that moment and its time."""
    ranks = range(plan.world_size) if rank is None else [rank]
    best, span = None, _span(trace)
    for r in ranks:
        times, totals, parts = memory_curve(plan, trace, r, span)
        i = max(range(len(totals)), key=totals.__getitem__)
        if best is None or totals[i] > best["total"]:
            best = {"rank": r, "time": times[i], "total": totals[i],
                    "breakdown": {**plan.meta["memory"]["static"], **parts[i]}}
    return best


def _span(trace) -> tuple[float, float]:
    """(first start, last end) of the trace's ops (once per peak, not per rank: O(ops), not O(ranks x ops))."""
    return min((o.start for o in trace.ops), default=0.0), max((o.end for o in trace.ops), default=0.0)


def fits(total: int, gpu_GiB: float) -> bool:
    return total <= gpu_GiB * 2**30


# What a prediction of the tensors' bytes leaves out, as a share of the GPU's memory: the CUDA context and the
# cuBLAS/NCCL workspaces, outside PyTorch's caching allocator (~1-2 GiB), and the allocator's fragmentation
# (torch.cuda.memory_reserved() above memory_allocated(): blocks cached but split, PyTorch's "CUDA semantics:
# memory management"). torchtitan's published runs reserve 20-35% above the live bytes predicted here
# (docs/models.md); 10% (8 GiB of 80) is the assumption: a total within it is "tight", an OOM risk.
HEADROOM_FRACTION = 0.10


def headroom_GiB(gpu_GiB: float) -> float:
    return HEADROOM_FRACTION * gpu_GiB


def fit_text(total: int, gpu_GiB: float) -> str:
    """'yes (80 GiB, keeping 8 GiB headroom)', 'tight: within the 8 GiB headroom of 80 GiB (allocator, CUDA
    context)' or 'NO: over 80 GiB'."""
    if not fits(total, gpu_GiB):
        return f"NO: over {gpu_GiB:g} GiB"
    room = headroom_GiB(gpu_GiB)
    if total > (gpu_GiB - room) * 2**30:
        return f"tight: within the {room:g} GiB headroom of {gpu_GiB:g} GiB (allocator, CUDA context)"
    return f"yes ({gpu_GiB:g} GiB, keeping {room:g} GiB headroom)"


def fit_word(total: int, gpu_GiB: float) -> str:
    """'yes', 'tight' (within the headroom) or 'NO': a table's cell."""
    return fit_text(total, gpu_GiB).split(" ")[0].rstrip(":")


def breakdown_line(breakdown: dict, total: int, gpu_GiB: float | None = None) -> str:
    """``params 1.2 GiB + grads ... = 13.4 GiB`` and, when over the GPU, ``DOES NOT FIT in 80 GiB``."""
    from distlab.sim.plan import format_bytes
    parts = " + ".join(f"{k} {format_bytes(v)}" for k, v in breakdown.items() if v)
    line = f"{parts} = {format_bytes(total)}"
    if gpu_GiB is not None and not fits(total, gpu_GiB):
        line += f"  DOES NOT FIT in {gpu_GiB:g} GiB"
    return line
