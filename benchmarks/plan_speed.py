"""How fast `distlab plan` searches, and how close its fast estimate is to the discrete-event simulator.

Issue 17's target: at least 10,000 candidate layouts of Llama 3 70B on 1024 H100 evaluated in at most 60 s on 2
cores, the top 20 confirmed by the simulator. Prints the layouts enumerated (every one memory-checked), those
that fit and those estimated (the fitting ones; with --estimate-all every one, fitting or not, timed as the
search would time it), the wall time of each phase, and for the confirmed ones the estimate's error against the
simulator.

    python benchmarks/plan_speed.py                      # Llama 3 70B, 128 x DGX H100, global batch 1024
    python benchmarks/plan_speed.py --nodes 16 --confirm 5 --workers 1
"""
from __future__ import annotations

import argparse
import os
import time
from collections import Counter


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama3-70b")
    p.add_argument("--cluster", default="dgx-h100")
    p.add_argument("--nodes", type=int, default=128)
    p.add_argument("--global-batch", type=int, default=1024)
    p.add_argument("--confirm", type=int, default=20, help="layouts the simulator confirms (default 20)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: the CPUs, at most 2)")
    p.add_argument("--estimate-all", action="store_true", help="also estimate the layouts that do not fit")
    p.add_argument("--confirm-from", type=int, default=0, help="confirm the --confirm layouts after the best N "
                                                               "instead (a long confirmation in parts)")
    args = p.parse_args()
    from distlab.sim.planner.search import confirm_top, estimate_all, search
    print(f"{args.model} on {args.nodes} x {args.cluster}, global batch {args.global_batch}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start")
    t0 = time.perf_counter()
    s = search({"preset": args.model}, args.cluster, args.nodes, args.global_batch, confirm=0, workers=args.workers)
    t1 = time.perf_counter()
    estimated = len(s.ranked)
    if args.estimate_all:
        rest = [c for c in s.all if c.estimate is None]
        for c, e in zip(rest, estimate_all(s.estimator, [c.layout for c in rest], workers=args.workers)):
            c.estimate = e
        estimated += len(rest)
    t2 = time.perf_counter()
    confirm_top(s, args.confirm, args.workers, args.confirm_from)
    t3 = time.perf_counter()
    confirmed = [(i, c) for i, c in enumerate(s.ranked) if c.simulated_s is not None]
    print(f"layouts enumerated and memory-checked {len(s.all)}, fit {len(s.ranked)}, estimated {estimated}")
    print("  by family (enumerated): " + ", ".join(f"{k} {v}" for k, v in Counter(c.layout.family for c in s.all)
                                                 .most_common()))
    print(f"phases: search (enumerate, memory, estimate the fitting) {t1 - t0:.1f} s"
          + (f", estimate the rest {t2 - t1:.1f} s" if args.estimate_all else "")
          + f", simulator confirms {len(confirmed)} in {t3 - t2:.1f} s; total {t3 - t0:.1f} s; "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    errors = []
    for i, c in confirmed:
        err = c.estimate.step_s / c.simulated_s - 1
        errors.append(abs(err))
        print(f"{i + 1:3d}  {c.layout.label():90s} simulated {c.simulated_s * 1e3:8.1f} ms  estimate "
              f"{c.estimate.step_s * 1e3:8.1f} ms  ({err:+.2%})")
    if errors:
        print(f"estimate vs simulator on the confirmed: worst {max(errors):.2%}, median "
              f"{sorted(errors)[len(errors) // 2]:.2%}")
    return 0


if __name__ == "__main__":                # --markdown: also write its section of docs/accuracy.md
    from accuracy_doc import run_main
    raise SystemExit(run_main("plan_speed", main))
