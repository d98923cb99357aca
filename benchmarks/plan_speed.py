"""How fast `distlab plan` searches, and how close its fast estimate is to the discrete-event simulator.

Issue 17's target: at least 10,000 candidate layouts of Llama 3 70B on 1024 H100 evaluated in at most 60 s on 2
cores, the top 20 confirmed by the simulator. Prints the number of layouts enumerated, fitting and estimated, the
wall time of each phase, and for the confirmed ones the estimate's error against the simulator.

    python benchmarks/plan_speed.py                      # Llama 3 70B, 128 x DGX H100, global batch 1024
    python benchmarks/plan_speed.py --nodes 16 --confirm 5
"""
from __future__ import annotations

import argparse
import os
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama3-70b")
    p.add_argument("--cluster", default="dgx-h100")
    p.add_argument("--nodes", type=int, default=128)
    p.add_argument("--global-batch", type=int, default=1024)
    p.add_argument("--confirm", type=int, default=20, help="layouts the simulator confirms (default 20)")
    args = p.parse_args()
    from distlab.sim.planner.search import confirm_top, search
    t0 = time.perf_counter()
    s = search({"preset": args.model}, args.cluster, args.nodes, args.global_batch, confirm=0)
    t1 = time.perf_counter()
    confirm_top(s, args.confirm)
    t2 = time.perf_counter()
    print(f"{args.model} on {args.nodes} x {args.cluster} ({s.question['world_size']} GPUs), global batch "
          f"{args.global_batch}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"layouts enumerated {len(s.all)}, fit {len(s.ranked)}, estimated {len(s.ranked)} in {t1 - t0:.1f} s "
          f"({(t1 - t0) / max(len(s.all), 1) * 1e3:.1f} ms per layout); simulator confirmed {s.confirmed} in "
          f"{t2 - t1:.1f} s")
    errors = []
    for i, c in enumerate(s.ranked[:s.confirmed]):
        err = c.estimate.step_s / c.simulated_s - 1
        errors.append(abs(err))
        print(f"{i + 1:3d}  {c.layout.label():75s} simulated {c.simulated_s * 1e3:9.1f} ms  estimate "
              f"{c.estimate.step_s * 1e3:9.1f} ms  ({err:+.2%})")
    if errors:
        print(f"estimate vs simulator on the confirmed: worst {max(errors):.2%}, median "
              f"{sorted(errors)[len(errors) // 2]:.2%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
