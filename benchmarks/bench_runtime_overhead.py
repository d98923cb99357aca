"""Executor overhead: a plan of 200 all_reduce ops against a hand-written torch.distributed loop of the same
200 calls, in the same ranks, interleaved (ABBA order per repetition, a barrier before each timing).

    python benchmarks/bench_runtime_overhead.py [--nproc 2] [--sizes 4KiB,1MiB] [--reps 21] [--json]

Throughput = ops / (slowest rank's time for the 200); ratio = executor throughput / loop throughput, the
median over repetitions of each adjacent pair's ratio (target >= 0.97); "best" = fastest loop / fastest
executor repetition, the estimate least hurt by other load on a shared machine (noise only adds time).
On a loaded machine both swing by 2-3x between repetitions, so the overhead is also measured alone: with
dist.all_reduce replaced by a no-op, the executor's time minus the loop's is what it adds per op (its clock
reads, record and dispatch), and "from overhead" = loop time per op / (loop time per op + that).
The executor runs with each rank's flight recorder (runtime/diagnosis/flight.py), as `distlab run` does; "flight/op" is
what the recorder adds per op: the no-op difference between that executor and one without a recorder, and
"ring/op" the recorder's three slot writes alone (issued, started, completed), timed in a loop.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

OPS = 200


def overhead_task(ctx, payload):
    import torch
    import torch.distributed as dist

    from distlab.runtime.execute.executor import Executor
    from distlab.runtime.execute.wire import all_gather_json
    from distlab.sim.plan import Collective, Plan
    out = []
    for nbytes in payload["sizes"]:
        plan = Plan([[Collective("all_reduce", nbytes) for _ in range(OPS)] for _ in range(ctx.world_size)])
        ex = Executor(plan, ctx)
        flight, ctx.flight = ctx.flight, None
        plain = Executor(plan, ctx)                        # the same plan without a flight recorder
        ctx.flight = flight
        t = torch.zeros(nbytes // 4)

        def loop():
            for _ in range(OPS):
                dist.all_reduce(t)

        def timed(fn):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        ex.run()                                           # warm-up both
        loop()
        ex_times, loop_times = [], []
        for rep in range(payload["reps"]):
            if rep % 2 == 0:
                ex_times.append(timed(ex.run))
                loop_times.append(timed(loop))
            else:
                loop_times.append(timed(loop))
                ex_times.append(timed(ex.run))
        every = all_gather_json((ex_times, loop_times))
        ex_slow = [max(e[0][i] for e in every) for i in range(payload["reps"])]
        loop_slow = [max(e[1][i] for e in every) for i in range(payload["reps"])]
        ratios = [lp / e for e, lp in zip(ex_slow, loop_slow)]
        added = _added_per_op(ex, loop)
        flight_added = (added - _added_per_op(plain, loop)) if flight is not None else 0.0
        out.append({"bytes": nbytes, "executor_s": statistics.median(ex_slow), "loop_s": statistics.median(loop_slow),
                    "ratio": statistics.median(ratios), "best_ratio": min(loop_slow) / min(ex_slow),
                    "ratio_q25": sorted(ratios)[len(ratios) // 4], "ratio_q75": sorted(ratios)[3 * len(ratios) // 4],
                    "added_per_op_s": added,
                    "ratio_from_overhead": (min(loop_slow) / OPS) / (min(loop_slow) / OPS + added),
                    "flight_per_op_s": flight_added, "ring_per_op_s": _ring_per_op(flight),
                    "flight_share": flight_added / (min(loop_slow) / OPS),
                    "ratios": ratios})
    return out


def _added_per_op(ex, loop, reps: int = 51) -> float:
    """Seconds the executor adds per op: both run with dist.all_reduce replaced by a no-op (median)."""
    import torch.distributed as dist

    class Done:
        def wait(self):
            return None
    done = Done()
    real = dist.all_reduce
    dist.all_reduce = lambda *a, **k: done
    try:
        diffs = []
        for _ in range(reps):
            t0 = time.perf_counter()
            ex.run()
            t1 = time.perf_counter()
            loop()
            diffs.append(((t1 - t0) - (time.perf_counter() - t1)) / OPS)
    finally:
        dist.all_reduce = real
    return max(0.0, statistics.median(diffs))


def _ring_per_op(flight, n: int = 20000) -> float:
    """Seconds of the recorder's three slot writes per collective, in a tight loop."""
    if flight is None:
        return 0.0
    key = flight.key((-1,), "bench")
    t0 = time.perf_counter()
    for i in range(n):
        rec = flight.issued(key, 0, 4096, 0, 0, i)
        flight.started(rec)
        flight.completed(rec)
    return (time.perf_counter() - t0) / n


def main(argv=None) -> int:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from distlab.runtime.ranks.launch import launch
    from distlab.sim.cli import print_json, print_table
    from distlab.sim.io import parse_size_range
    from distlab.sim.plan import format_bytes
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--sizes", default="4KiB,1MiB")
    p.add_argument("--reps", type=int, default=21)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    payload = {"sizes": parse_size_range(args.sizes), "reps": args.reps}
    rows = launch(f"{os.path.abspath(__file__)}:overhead_task", payload, args.nproc, timeout=120)[0]
    if args.json:
        print_json(rows)
        return 0
    print_table(f"{OPS} all_reduce ops on {args.nproc} gloo ranks: executor vs hand-written loop "
                f"(slowest rank, median of {args.reps})",
                ["size", "executor (ms)", "loop (ms)", "executor ops/s", "loop ops/s", "ratio", "ratio q25-q75",
                 "best", "added/op (us)", "from overhead", "flight/op (us)", "ring/op (us)", "flight share"],
                [[format_bytes(r["bytes"]), f"{r['executor_s'] * 1e3:.1f}", f"{r['loop_s'] * 1e3:.1f}",
                  f"{OPS / r['executor_s']:.0f}", f"{OPS / r['loop_s']:.0f}", f"{r['ratio']:.3f}",
                  f"{r['ratio_q25']:.2f}-{r['ratio_q75']:.2f}", f"{r['best_ratio']:.3f}",
                  f"{r['added_per_op_s'] * 1e6:.2f}", f"{r['ratio_from_overhead']:.4f}",
                  f"{r['flight_per_op_s'] * 1e6:.2f}", f"{r['ring_per_op_s'] * 1e6:.2f}",
                  f"{r['flight_share'] * 100:.2f}%"] for r in rows])
    return 0


if __name__ == "__main__":                # --markdown: also write its section of docs/accuracy.md
    from accuracy_doc import run_main
    sys.exit(run_main("bench_runtime_overhead", main))
