"""Host side of the TP calibration (runtime/parallel/tp/calibrate.py measures on the ranks): the cluster fitted to it, and the
per-unit host costs read from it.

``fit_cluster``: per collective the ring model t = steps·α + f·S/B (``ring_cost``: all_gather and reduce_scatter
n-1, (n-1)/n; all_reduce 2(n-1), 2(n-1)/n), least squares over the sizes (α = 0 and B from the largest size if α
comes out negative); a memory rate M = 28 B x local elements / AdamW CPU time (sim/parallel/tp/plan.py ADAM_BYTES) and a
compute rate F (bisection) such that the roofline sum of max(flops/F, bytes/M) over the tp = 1 plan's forward and
backward ops equals the unparallelized forward+backward's CPU time; the GPU spec's ``launch_s`` = (block CPU -
unparallelized block CPU - the block's collectives' issue CPU) / the block's DTensor ops: the host CPU per DTensor
op as a TP layer dispatches them (sim/parallel/tp/plan.py launches; ~35-45 us here, ~3x an elementwise op on a DTensor alone,
which skips the hooks and the redistributions; the unparallelized block's whole CPU is subtracted, an upper bound of
its local math); ``cpu_cores`` = the cores the ranks share (the caller's fair share beside other processes,
runtime/measure/load.py effective_cores, else this machine's cores, at most the ranks), so that the simulator runs each
rank's compute at min(1, cores / ranks computing) of a core (sim/kernel/cores.py); the link latency (PP x TP's sends
between stages) = the all_gather's fitted α per ring step (one hop: a transfer to a rank that must be woken); a
collective's CPU work, ``comm_cpu_s`` + ``comm_cpu_s_per_byte`` x bytes per member rank: gloo's own threads, process
minus main-thread CPU over each chain / calibrate.CHAIN (gloo's CPU wherever it falls, also after ``wait`` returns;
issue to wait alone catches ~1/3 of it here, ~0.45 of ~1.4 ms at tp 4, the whole chain matches the step's own
process minus main-thread CPU per collective, ~1.6 ms), plus the calling thread's own CPU from issue to wait (the
functional collective's Python, c10d's enqueue, the wait: ~0.2 ms at tp 2, which the chain's times hold as wall
time; on cores that compute fills it takes its share like any compute), ``comm_cpu_line``; the simulator shares it
with the compute on the cores, sim/kernel/cores.py, with interference = comm_interference = 1. The ends' host CPU beyond
launches x launch_s (the embedding; final norm, head, loss): runtime/parallel/tp/ends.py. ``optimizer_host``: DTensor's host
CPU per parameter in AdamW's step beyond the same step on plain tensors (~80 us here, where the plan's 8 DTensor ops
per parameter at the block's ``launch_s`` would charge ~260-340 us: FSDP2 x TP's optimizer phase predicted 12-13 ms
for 3 ms measured, now ~4 ms), which replaces the optimizer's launches (runtime/parallel/tp/validate.py with_optimizer_host).
Per quantity: the median over rounds of the slowest rank (the CPU work: the median over ranks and rounds).

Why the collectives are fitted from chains that every tp group runs at once (PP x TP and FSDP2 x TP, 4 ranks on 2
cores; each variant re-simulated on the same launches): a gloo collective here is mostly CPU (the calling thread,
gloo's threads, a wake-up per hop), and with more busy threads than cores every hop waits for a core. Each call's
time is the chain's mean (runtime/parallel/tp/calibrate.py: a step pays its calls' tails); the experiments below used the
median. (a) Chains timed one tp group at a time (the others idle): ~0.35-0.6 ms a call against ~0.45-2.8 ms
together; fitted from them, a pipeline stage's actions that run alone are predicted well but the two stages'
overlapping actions ~40% short, PP x TP's step -17% to -33% (6 launches). (b) The same chain beside the other
group's compute (a loop of local ops) is only 1.09-1.15x slower than alone: the ranks wait for each other's
collectives, not for compute. (c) (a) plus the together/alone ratio (1.8-3.0) as a slowdown of a collective's
network part while more collectives' CPU work than cores runs on the node: PP x TP -11/-27/-12%, FSDP2 x TP
+1/+1/+32%. (d) The chains run together and a collective's network part progressing at its node's processor share:
PP x TP +7/-7/+11%, FSDP2 x TP +23/+29/+64%. (e) The collectives' CPU work served before compute (as CFS's wake-up
preemption would): +3% on PP x TP. The chains run together (this module: PP x TP +2/-10/+6%, FSDP2 x TP +9/+14/+43%
on those launches) cost the wake-ups at the rate of phases where every rank is busy and over-charge a stage that
runs alone; no variant was better on both. The chain's length matters too: 24 calls instead of 8 time the calls
lower (PP x TP -27% to -40% against -9% to -24% in alternating launches), as does the median: the mean instead,
re-simulated on 9 launches, moved PP x TP -11/-15/-25% to -3/+3/-13%, TP (tp 4) -4/-16/-1% to -3/-11/-1% and FSDP2 x
TP -7/+13/+12% to -1/+19/+24% (AdamW then over-charged by ~9 ms: ``optimizer_host``).
"""
from __future__ import annotations

import statistics


def _over_rounds(results: list[dict], get) -> float:
    """Median over rounds of the slowest rank's value."""
    rounds = min(len(get(r)) for r in results)
    return statistics.median(max(get(r)[i] for r in results) for i in range(rounds))


def fit_cluster(results: list[dict], model, tp: int, world: int, sequence_parallel: bool = True,
                cores: float | None = None):
    """localhost-cpu on ``world`` ranks with the fitted collectives (at group size tp), compute rate and
    memory rate (module docstring)."""
    import numpy as np

    from distlab.sim.collectives import ring_cost
    from distlab.sim.mesh import Mesh
    from distlab.sim.plan import Compute
    from distlab.sim.parallel.tp.plan import ADAM_BYTES, TPOptions, tp_plan
    from distlab.sim.parallel.tp.rules import local_numel
    cals = [r["variants"][0]["calibration"] for r in results]
    coll = {}
    for op, table in cals[0]["collectives"].items():
        steps, f = ring_cost(op, tp)
        pts = sorted((int(s), _over_rounds(cals, lambda c, op=op, s=s: c["collectives"][op][s])) for s in table)
        slope, icpt = np.polyfit(*zip(*pts), 1) if len(pts) > 1 else (0.0, -1.0)
        if icpt < 0 or slope <= 0:      # noise at latency-bound sizes: α from the smallest, B from the rest
            icpt = min(t for _, t in pts)
            slope = max((pts[-1][1] - icpt) / pts[-1][0], 1e-12)
        coll[op] = {str(tp): {"latency_us": float(icpt) / steps * 1e6 + 1e-3,
                              "bandwidth_GBps": f / float(slope) / 1e9}}
    fb = _over_rounds(cals, lambda c: c["fwd_bwd"])
    M = ADAM_BYTES * local_numel(model, tp) / _over_rounds(cals, lambda c: c["optimizer"])
    one = tp_plan(model, Mesh({"tp": 1}), TPOptions(sequence_parallel=sequence_parallel))
    work = [(o.flops, o.bytes) for o in one.ranks[0] if isinstance(o, Compute) and o.name != "optimizer"]
    from dataclasses import replace

    from distlab.runtime.measure.validation import roofline_cluster
    cluster = roofline_cluster(work, fb, M, world, coll)
    hop = coll.get("all_gather", {}).get(str(tp), {}).get("latency_us", cluster.intra_node.latency_us)
    cpu_s, cpu_s_per_byte = comm_cpu_line(cals)
    return replace(cluster, gpu=replace(cluster.gpu, launch_s=launch_seconds(cals)),
                   intra_node=replace(cluster.intra_node, latency_us=hop),
                   cpu_cores=float(min(world, cores if cores is not None else cals[0]["cores"])),
                   comm_cpu_s=cpu_s, comm_cpu_s_per_byte=cpu_s_per_byte)


def comm_cpu_line(cals: list[dict]) -> tuple[float, float]:
    """(a, b) of a collective's CPU work w = a + b x bytes per member rank (sim/kernel/cores.py): per kind and size the
    median over ranks and rounds of gloo's threads' CPU per call plus the calling thread's own CPU from issue to
    wait (``comm_main``; absent in older calibrations: 0), least squares over every (kind, size); a
    negative slope gives (median, 0), a negative intercept the line through the origin. (0, 0) for a
    calibration without it. The interference factors stay 1 (sim/kernel/cores.py: not counted twice)."""
    import numpy as np
    def per_call(c, op, size):
        main = c.get("comm_main", {}).get(op, {}).get(size) or [0.0] * len(c["comm_cpu"][op][size])
        return [g + m for g, m in zip(c["comm_cpu"][op][size], main)]
    pts = [(int(size), statistics.median(v for c in cals for v in per_call(c, op, size)))
           for op, table in cals[0].get("comm_cpu", {}).items() for size in table]
    if not pts:
        return 0.0, 0.0
    x, y = np.array(pts, dtype=float).T
    slope, icpt = np.polyfit(x, y, 1) if len(set(x)) > 1 else (0.0, float(np.median(y)))
    if slope < 0:
        return max(float(np.median(y)), 0.0), 0.0
    if icpt < 0:
        return 0.0, max(float(x @ y / (x @ x)), 0.0)
    return float(icpt), float(slope)


def launch_seconds(cals: list[dict]) -> float:
    """DTensor's host CPU per dispatched op of a TP block: (parallel block - plain block - its collectives' issue)
    / its DTensor ops, each CPU time the median over rounds of the slowest rank (module docstring)."""
    c = cals[0]
    issue = sum(_over_rounds(cals, lambda c, op=op: c["block_collectives"][op]) for op in c["block_calls"])
    host = _over_rounds(cals, lambda c: c["block_tp"]) - _over_rounds(cals, lambda c: c["block_local"]) - issue
    return max(host / c["block_ops"], 0.0)


def fsdp_host(results: list[dict]) -> tuple[float, float]:
    """FSDP2's host CPU seconds per unit (forward, backward; Calibrator._fsdp_round), the median over rounds of the
    slowest rank; (0, 0) for a run without FSDP2."""
    cals = [r["variants"][0].get("calibration") or {} for r in results]
    if not all(c.get("fsdp_forward") for c in cals):
        return 0.0, 0.0
    return _over_rounds(cals, lambda c: c["fsdp_forward"]), _over_rounds(cals, lambda c: c["fsdp_backward"])


def optimizer_host(results: list[dict]) -> float:
    """DTensor's host CPU seconds per parameter in AdamW's step beyond the same step on plain tensors
    (runtime/parallel/tp/calibrate.py ``_optimizer_setup``: the TP shards as DTensors Shard(0) on the tp mesh), each the
    median over rounds of the slowest rank; None for a calibration without it."""
    cals = [r["variants"][0].get("calibration") or {} for r in results]
    if not all(c.get("optimizer_dtensor") for c in cals):
        return None
    extra = _over_rounds(cals, lambda c: c["optimizer_dtensor"]) - _over_rounds(cals, lambda c: c["optimizer"])
    return max(extra, 0.0) / cals[0]["optimizer_params"]


def pipeline_overhead(results: list[dict]) -> float:
    """The pipelining runtime's CPU seconds per action (runtime/parallel/tp/pipeline.py RuntimeProbe), the median over
    rounds of the slowest rank; 0 for a run without a pipeline."""
    cals = [r["variants"][0].get("calibration") or {} for r in results]
    if not all(c.get("pipeline_action") for c in cals):
        return 0.0
    return _over_rounds(cals, lambda c: c["pipeline_action"])
