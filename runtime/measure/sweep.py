"""nccl-tests-style sweeps of real collectives, run inside the ranks (see runtime/commands/bench.py).

Cases are interleaved: after ``warmup`` untimed rounds, each of ``iters`` rounds times every (op, size) once
(short ones more often: below), each call after a barrier, so a burst of load from elsewhere on the machine
spreads over all cases instead of spoiling one. Per call, on one timeline (runtime/execute/clock.py):
  time = the slowest rank's own start-to-end (nccl-tests' convention; CUDA events on GPUs),
  launch time = latest end - latest start: from the moment the last rank arrived (the collective's launch in
      the simulator's terms) to the moment the last rank finished; barrier exit skew does not count.
A case reports medians over its samples. algbw = S / time and busbw = algbw x factor as in nccl-tests
doc/PERFORMANCE.md (S = planned bytes). All cases share one input and one output buffer (views of them).

Short cases (``short_s``, used by calibrate and validate): one preemption of a rank (a scheduler time slice is
a few ms; Linux CFS, Documentation/scheduler/sched-design-CFS.rst) is a large part of a call shorter than
SHORT_S, so such calls scatter most and their median is the least sure. From the second round on, a case whose
fastest call so far took t < ``short_s`` gets ``repeats(t)`` = min(MAX_REPEATS, floor(short_s / t)) calls per
round, in extra passes over the short cases after the round's main pass (other cases' calls between two of
one case's, unless it is the only short one). The fastest call, not the first: a call held up by a preemption
(the first timed round often is) does not make a short case look long. Every rank has the same times after
each round's gather, so every rank derives the same schedule.
"""
from __future__ import annotations

import statistics
import time

from distlab.runtime.execute.collectives import actual_bytes, busbw_factor, check_backend_dtype, element_counts, issue

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "barrier")
SHORT_S = 0.005        # calls shorter than this get more samples per round (module docstring)
MAX_REPEATS = 3


def cases(ops, sizes) -> list[tuple[str, int]]:
    """(op, bytes) in sweep order; a barrier has no size, so it is one case of 0 bytes."""
    out = []
    for op in ops:
        out += [("barrier", 0)] if op == "barrier" else [(op, s) for s in sizes]
    return out


def _views(todo, dtype, n, device):
    """Per case (input, output) views into two shared buffers (in place ops: the same view twice)."""
    import torch

    from distlab.runtime.execute.collectives import torch_dtype
    counts = [element_counts(op, b, dtype, n) for op, b in todo]
    inp = torch.zeros(max([i for i, _ in counts] + [1]), dtype=torch_dtype(dtype), device=device)
    out = torch.zeros(max([o for _, o in counts] + [1]), dtype=torch_dtype(dtype), device=device)
    views = []
    for (op, _), (i, o) in zip(todo, counts):
        if op == "barrier":
            views.append((None, None))
        elif op in ("all_reduce", "broadcast", "reduce"):
            views.append((inp[:i], inp[:i]))
        else:
            views.append((inp[:i], out[:o]))
    return views


def _row(op, nbytes, dtype, n, spans, launches) -> dict:
    t = statistics.median(spans)
    algbw = nbytes / t / 1e9 if t > 0 else 0.0
    return {"op": op, "bytes": nbytes, "actual_bytes": actual_bytes(op, nbytes, dtype, n), "dtype": dtype,
            "world_size": n, "time_s": t, "time_min_s": min(spans), "time_max_s": max(spans),
            "launch_time_s": statistics.median(launches), "algbw_GBps": algbw,
            "busbw_GBps": algbw * busbw_factor(op, n), "times_s": spans, "launch_times_s": launches}


def repeats(t: float, short_s: float | None) -> int:
    """Calls per round of a case whose fastest call took ``t``: min(MAX_REPEATS, floor(short_s / t)), >= 1."""
    if not short_s:
        return 1
    return MAX_REPEATS if t <= 0 else max(1, min(MAX_REPEATS, int(short_s / t)))


def schedule(fastest: list[float], short_s: float | None) -> list[int]:
    """The case indices one round visits: every case once, then extra passes over the short cases
    (``fastest``: each case's fastest call so far)."""
    reps = [repeats(t, short_s) for t in fastest]
    order = list(range(len(fastest)))
    for p in range(1, max(reps, default=1)):
        order += [c for c, r in enumerate(reps) if r > p]
    return order


def sweep(ctx, ops, sizes, dtype="float32", warmup=2, iters=10, on_round=None, on_final=None,
          short_s=None) -> list[dict]:
    """Time every case on the whole world; every rank returns the same rows (in case order). ``on_round(k,
    rows)`` after each round; ``on_final(rows)`` each time a case's row is final: in the last round the ranks
    compare times after each call (after it, so no timing changes), and a row is known after its case's last
    call, as nccl-tests prints a line per size. ``short_s``: more calls per round for short cases (module
    docstring); None: one call per case per round."""
    import torch
    import torch.distributed as dist

    from distlab.runtime.execute.clock import clock_offset
    from distlab.runtime.execute.wire import all_gather_json
    n, cuda = ctx.world_size, ctx.device.type == "cuda"
    todo = cases(ops, sizes)
    views = _views(todo, dtype, n, ctx.device)
    offset = clock_offset(ctx)
    for _ in range(warmup):
        for (op, _), (inp, out) in zip(todo, views):
            issue(op, inp, out)
    if cuda:
        torch.cuda.synchronize()
    spans = [[] for _ in todo]
    launches = [[] for _ in todo]

    def gather(cs, mine):
        every = all_gather_json(mine)
        for j, c in enumerate(cs):
            spans[c].append(max(e[j][1] - e[j][0] for e in every))
            launches[c].append(max(e[j][1] for e in every) - max(e[j][0] for e in every))

    def row(c):
        return _row(*todo[c], dtype, n, spans[c], launches[c])

    final, order = {}, list(range(len(todo)))
    for k in range(iters):
        mine, last = [], k == iters - 1
        if k >= 1:                         # every rank has the same times (gathered): the same schedule
            order = schedule([min(s) for s in spans], short_s)
        final_visit = {c: i for i, c in enumerate(order)}
        for i, c in enumerate(order):
            op, (inp, out) = todo[c][0], views[c]
            dist.barrier()
            if cuda:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0 = time.perf_counter()
                e0.record()
                issue(op, inp, out)
                e1.record()
                e1.synchronize()
                mine.append((t0 - offset, t0 - offset + e0.elapsed_time(e1) / 1e3))
            else:
                t0 = time.perf_counter()
                issue(op, inp, out)
                mine.append((t0 - offset, time.perf_counter() - offset))
            if last:
                gather([c], mine[-1:])
                if final_visit[c] == i:
                    final[c] = row(c)
                    if on_final is not None:
                        on_final(list(final.values()))
        if not last:
            gather(order, mine)
        if on_round is not None:
            on_round(k + 1, [row(c) for c in range(len(todo))])
    return [final[c] for c in sorted(final)]


def measure_compute(ctx, seconds: float = 0.3, rounds: int = 5) -> dict:
    """Matmul FLOP/s and copy bandwidth per rank with all ranks working at once (CPU ranks share cores as
    in a run): the same work on every rank, rate = work / (last end - first start) on rank 0's clock
    (runtime/execute/clock.py: hosts' clocks differ), the robust center of
    ``rounds`` (runtime/measure/robust.py: a round another process interrupts does not count), with its spread."""
    from distlab.runtime.measure import robust
    import torch.distributed as dist

    from distlab.runtime.execute.clock import clock_offset
    from distlab.runtime.execute.compute import Matmuls
    from distlab.runtime.execute.wire import all_gather_json, broadcast_json
    offset = clock_offset(ctx)          # first start and last end are compared across ranks: one timeline
    mm = Matmuls(ctx.device)
    k = max(1, int(seconds / rounds / broadcast_json(mm.measure(0.05), src=0)))
    mm.measure_copy()
    copies = max(1, int(seconds / rounds / (2 * mm._src.numel() * 4 / mm.copy_Bps)))
    flops, copy = [], []
    for fn, work, out in ((lambda: mm.run(k), k * mm.flops_per_iter, flops),
                          (lambda: [mm._dst.copy_(mm._src) for _ in range(copies)],
                           copies * 2 * mm._src.numel() * 4, copy)):
        for _ in range(rounds):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            if ctx.device.type == "cuda":
                import torch
                torch.cuda.synchronize()
            every = all_gather_json((t0 - offset, time.perf_counter() - offset))
            out.append(work / (max(b for _, b in every) - min(a for a, _ in every)))
    return {"matmul_n": mm.n, "matmul_dtype": str(mm.dtype).replace("torch.", ""), "arch": device_arch(ctx.device),
            "flops_per_s": robust.center(flops), "copy_Bps": robust.center(copy),
            "flops_spread": robust.spread(flops), "copy_spread": robust.spread(copy)}


def device_arch(device) -> str:
    """NCCL's tuning row for this device (sim/cluster/specs.py GPUSpec.arch): cpu, or the CUDA compute capability's
    generation (8.x ampere, 9.x hopper, 10.x and later blackwell)."""
    if device.type != "cuda":
        return "cpu"
    import torch
    major = torch.cuda.get_device_capability(device)[0]
    return "ampere" if major <= 8 else "hopper" if major == 9 else "blackwell"


def sweep_task(ctx, payload: dict):
    """Worker target: the sweep (rank 0 keeps the rows so far after each round, and the final rows as each
    case's last round ends: partial = {"rounds", "rows", "final"}), then optionally compute rates (with the
    interference of an all_reduce in flight) and a plan (runtime.execute.executor.plan_task payload) in the same ranks;
    with both, compute["during_plan"] = the matmul rate and interference of probe rounds run between the plan's
    runs (runtime/measure/compute_probe.py), so they see the load the runs saw. ``plan_first``: compute and the plan
    before the sweep, on ranks that have run nothing else yet (`distlab validate`: its default sweep, 5 ops up to
    128 MiB, takes minutes, and the plan timed after it is not the plan timed alone, which is what
    benchmarks/overlap_accuracy.py and a user's own run measure)."""
    dtype = payload.get("dtype", "float32")
    check_backend_dtype(dtype, ctx.backend, "--dtype")

    state = {"rounds": 0, "rows": [], "final": []}

    def keep(**kw):
        if ctx.rank == 0:
            state.update(kw)
            ctx.save_partial(state)
    result = {"backend": ctx.backend}
    if payload.get("plan_first"):
        _compute_and_plan(ctx, payload, result)
    result["rows"] = sweep(ctx, payload["ops"], payload["sizes"], dtype, payload.get("warmup", 2),
                           payload.get("iters", 10), lambda k, rows: keep(rounds=k, rows=rows),
                           lambda final: keep(final=final), payload.get("short_s")) if payload["ops"] else []
    if not payload.get("plan_first"):
        _compute_and_plan(ctx, payload, result)
    return result


def _compute_and_plan(ctx, payload: dict, result: dict) -> None:
    """result["compute"] (payload "compute") and result["plan"] (payload "plan"; its "probe_rounds" probe rounds,
    default 1, before each of its runs)."""
    probe = None
    if payload.get("compute"):
        result["compute"] = measure_compute(ctx, payload.get("probe_seconds", 0.3))
        if ctx.world_size > 1:             # compute alone vs with an all_reduce in flight (runtime/measure/compute_probe.py)
            from distlab.runtime.measure.compute_probe import InterferenceProbe, measure_interference
            if payload.get("plan"):        # measured between the plan's runs instead (below)
                probe = InterferenceProbe(ctx)
            else:
                result["compute"].update(measure_interference(ctx, rounds=payload.get("interference_rounds", 4)))
    if payload.get("plan"):
        from distlab.runtime.execute.executor import plan_task
        rounds = int(payload["plan"].get("probe_rounds", 1))     # probe rounds before each of the plan's runs

        def between():
            for _ in range(rounds):
                probe.round()
        result["plan"] = plan_task(ctx, payload["plan"], between=between if probe else None)
        if probe:                          # rounds interleaved with the plan's runs: the same load as they had
            result["compute"]["during_plan"] = probe.result()
