"""Simulator speed: ring all-reduce of 1 GiB over 1024 GPUs (128 DGX H100) and hierarchical all-reduce over
8192 GPUs (1024 nodes), each on one core. Targets: <= 10 s and <= 60 s. Prints wall time and simulated
transfers (point-to-point flows) per second.

    python benchmarks/sim_speed.py [--json]
"""
import json
import sys
import time

from distlab.sim.cluster import load_cluster
from distlab.sim.collectives import metrics
from distlab.sim.kernel.engine import simulate_collective

CASES = [("ring", 128, 10.0), ("hierarchical", 1024, 60.0)]


def main() -> int:
    rows = []
    for algo, nodes, target in CASES:
        cluster = load_cluster("dgx-h100", nodes=nodes)
        t0 = time.perf_counter()
        trace, _ = simulate_collective("all_reduce", 2**30, cluster, algo)
        wall = time.perf_counter() - t0
        flows = trace.meta["flows"]
        m = metrics("all_reduce", cluster.world_size, 2**30, trace.makespan)
        rows.append({"algorithm": algo, "gpus": cluster.world_size, "wall_s": round(wall, 3),
                     "target_s": target, "ok": wall <= target, "transfers": flows,
                     "transfers_per_s": round(flows / wall), "simulated_ms": trace.makespan * 1e3,
                     "busbw_GBps": round(m["busbw_GBps"], 1)})
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"{r['algorithm']:>12} all_reduce 1 GiB on {r['gpus']:>5} GPUs: {r['wall_s']:7.2f} s wall "
                  f"(target {r['target_s']:.0f} s), {r['transfers']:,} transfers, {r['transfers_per_s']:,}/s, "
                  f"simulated {r['simulated_ms']:.3f} ms, busbw {r['busbw_GBps']} GB/s")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":                # --markdown: also write its section of docs/accuracy.md
    from accuracy_doc import run_main
    sys.exit(run_main("sim_speed", main))
