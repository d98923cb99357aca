"""A profile's compute kernels matched to a plan's compute ops, by kind and in order (`distlab compare`).

    m = match_compute(trace, plan, gpu, rank=0, events=step_events(t, 0))
    m["kinds"]["gemm"]      # {"measured_s", "predicted_s", "measured_kernels", "matched_kernels", "plan_ops"}
    m["matched"][0]         # {"op": "fwd h.0.attn", "kind": "gemm", "kernels": 4, "measured_s", "predicted_s"}

Kinds (one rule for both sides):
- measured kernels, by name: GEMM (cutlass, cuBLAS/cublasLt, sm80/sm90 xmma, ampere_*gemm*, cuDNN's implicit-GEMM
  convolutions; on a CPU trace aten::mm/addmm/bmm/matmul/linear), attention (flash, fmha, scaled_dot_product,
  efficient_attention), memory-bound (elementwise, norms incl. cuDNN's bn_, reductions, softmax, copies, layout
  transposes, scans/sorts, the optimizer's foreach/multi_tensor kernels), other (the rest). NCCL kernels,
  memcpy/memset are not compute (kineto.py), as in scenario.py's plan from a profile.
- a plan's Compute op (sim/ops.py), by the kernels it names: each ``gemms`` shape is one GEMM kernel, an
  ``attention`` call one attention kernel (two for recompute+backward) plus the block's elementwise passes
  (memory-bound); an op with only FLOPs is one GEMM (FLOPs > 0) or memory-bound (bytes only); its simulated
  duration is split over its kinds in proportion to sim/compute/kernels.py's time of each. An op ``simulate
  --from-profile`` made ("measured gemm x12": scenario.py) is that kind, that many kernels. Other ops with
  ``seconds`` given are kind "other", unmatched.
Matching: per rank, the plan's ops in simulated order and the measured kernels of the step in start order; each
op's GEMM (attention) part takes the next that many measured GEMM (attention) kernels. Memory-bound parts the kernel
model does not count (the elementwise passes) are compared as totals only; what is left on either side is reported
unmatched (the measured kernels' count, time and commonest names; the plan's op names).
"""
from __future__ import annotations

import re
from collections import Counter

from distlab.sim.kernel.spans import union_length

KINDS = ("gemm", "attention", "memory-bound", "other")
_GEMM = re.compile(r"(?<!fb)gemm|xmma|cutlass|cublas|matmul|sm\d+_.*tensorop|^aten::(mm|addmm|bmm|linear|baddbmm)$",
                   re.I)
_ATTENTION = re.compile(r"flash|fmha|scaled_dot_product|attention|sdpa|attn", re.I)
_MEMORY_BOUND = re.compile(r"elementwise|norm|bn_|reduce|softmax|copy|cat|fill|transpose|nchwToNhwc|nhwcToNchw|"
                           r"scan|sort|index|gather|scatter|embedding|pool|dropout|foreach|multi_tensor|adam|sgd|"
                           r"gelu|silu|relu|aten::(add|mul|sub|div|copy_|fill_|zero_|cat|to)", re.I)
_PROFILE_OP = re.compile(r"^measured (gemm|attention|memory-bound|other) x(\d+)$")
_PLAN_ATTENTION = re.compile(r"attn|attention|sdpa|flash", re.I)


def kernel_kind(name: str) -> str:
    """The kind of a measured compute kernel (or CPU op) from its name (module docstring)."""
    if _ATTENTION.search(name):
        return "attention"
    if _GEMM.search(name):
        return "gemm"
    if _MEMORY_BOUND.search(name):
        return "memory-bound"
    return "other"


def op_parts(op, gpu) -> list[tuple[str, float, int | None]]:
    """[(kind, weight, kernels or None)] of one plan Compute op (module docstring); weights are relative."""
    from distlab.sim.compute import kernels as k
    from distlab.sim.dtypes import DTYPE_BYTES
    if op.seconds is not None:
        m = _PROFILE_OP.match(op.name)
        return [(m.group(1), op.seconds, int(m.group(2)))] if m else [("other", op.seconds, None)]
    if op.gemms or op.attention is not None:
        e = DTYPE_BYTES.get(op.dtype, 2)
        parts = []
        if op.gemms:
            parts.append(("gemm", sum(k.gemm_time(M, N, K, e, gpu, k.gemm_dtype(op.dtype)) for M, N, K in op.gemms),
                          len(op.gemms)))
        if op.attention is not None:
            if op.attention_kernel == "unfused":
                t = k.unfused_attention_time(*op.attention, gpu, 2, op.attention_pass)
            else:
                t = k.attention_time(*op.attention, gpu, op.causal, op.attention_pass)
            parts.append(("attention", t, 2 if op.attention_pass == "recompute+backward" else 1))
            parts.append(("memory-bound", k.elementwise_time(*op.attention, gpu, 2, op.attention_pass), None))
        return parts
    if op.flops > 0:
        return [("attention" if _PLAN_ATTENTION.search(op.name) else "gemm", 1.0, 1)]
    return [("memory-bound", 1.0, None)] if op.bytes else [("other", 1.0, None)]


def match_compute(trace, plan, gpu, rank: int, events) -> dict:
    """Per kind totals, the matched ops and what was left unmatched on one rank (module docstring)."""
    measured: dict[str, list] = {k: [] for k in KINDS}
    for e in sorted((e for e in events if e.kind not in ("communication", "memory")),
                    key=lambda e: e.start_us):
        measured[kernel_kind(e.name)].append(e)
    records = sorted((o for o in trace.ops if o.rank == rank and o.kind == "compute"), key=lambda o: o.start)
    ops = plan.ranks[rank] if plan is not None and rank < len(plan.ranks) else None
    kinds = {k: {"measured_s": union_length([(e.start_us * 1e-6, e.end_us * 1e-6) for e in measured[k]]),
                 "predicted_s": 0.0, "measured_kernels": len(measured[k]), "matched_kernels": 0, "plan_ops": 0}
             for k in KINDS}
    taken = {k: 0 for k in KINDS}
    matched, unmatched_ops = [], []
    for o in records:
        op = ops[o.index] if ops is not None and o.index < len(ops) else None
        parts = op_parts(op, gpu) if op is not None else [("other", 1.0, None)]
        total = sum(w for _, w, _ in parts) or 1.0
        for kind, w, count in parts:
            pred = (o.end - o.start) * w / total
            kinds[kind]["predicted_s"] += pred
            kinds[kind]["plan_ops"] += 1
            if count is None:
                continue
            got = measured[kind][taken[kind]:taken[kind] + count]
            taken[kind] += len(got)
            kinds[kind]["matched_kernels"] += len(got)
            if not got:
                unmatched_ops.append(f"{o.name} ({kind})")
                continue
            meas = sum(e.dur_us for e in got) * 1e-6
            matched.append({"rank": rank, "op": o.name, "kind": kind, "kernels": len(got), "plan_kernels": count,
                            "first_kernel": got[0].name.split("(")[0][:60], "measured_s": meas, "predicted_s": pred,
                            "error": (pred - meas) / meas if meas > 0 else None})
    left = {}
    for kind in KINDS:
        rest = measured[kind][taken[kind]:]
        if rest:
            names = Counter(_short(e.name) for e in rest).most_common(3)
            left[kind] = {"kernels": len(rest), "seconds": sum(e.dur_us for e in rest) * 1e-6,
                          "names": [f"{n} x{c}" for n, c in names]}
    return {"rank": rank, "kinds": kinds, "matched": matched,
            "unmatched": {"measured": left, "plan_ops": unmatched_ops}}


def _short(name: str) -> str:
    """A kernel's name without its template arguments and signature, for the unmatched list."""
    name = re.sub(r"^void ", "", name.split("(")[0])
    return name.split("<")[0][:48] or name[:48]
