"""Simulation at scale: the DDP Llama-70B scenario (scenarios/ddp-llama-70b.yaml) on 256 and 1024 GPUs, each in
its own process pinned to one core. Prints wall time (build + simulate + step summary) and peak memory (the
process's peak resident set, resource.getrusage). Targets at 1024 GPUs: <= 10 s and <= 1 GB (issue 15).

    python benchmarks/sim_scale.py [--full] [--json]

``--full`` also runs the full simulation (every rank, symmetric=False) for comparison: minutes at 256 GPUs.
"""
import json
import os
import resource
import subprocess
import sys
import time

SCENARIO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scenarios", "ddp-llama-70b.yaml")
CASES = [(32, None, None), (128, 10.0, 1024.0)]        # (nodes of 8 GPUs, target s, target MiB)


def one(nodes: int, symmetric: bool) -> dict:
    """Simulate once in this process; return its figures."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    from distlab.sim import scenario as sc
    from distlab.sim.engine import simulate
    t0 = time.perf_counter()
    d = sc.validate({**sc.load(SCENARIO), "nodes": nodes}, "scenario")
    r = sc.build(d)
    r.trace = simulate(r.plan, r.cluster, record_transfers=False, symmetric=symmetric)
    summary = sc.step_summary(r.trace)
    wall = time.perf_counter() - t0
    return {"world_size": r.plan.world_size, "symmetric": symmetric, "wall_s": round(wall, 3),
            "peak_MiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "step_s": summary["step_s"], "ops": len(r.trace.ops)}


def main() -> int:
    if "--one" in sys.argv:
        nodes, symmetric = int(sys.argv[2]), sys.argv[3] == "1"
        print(json.dumps(one(nodes, symmetric)))
        return 0
    rows = []
    for nodes, target_s, target_mib in CASES:
        for symmetric in (True, False) if "--full" in sys.argv else (True,):
            out = subprocess.run([sys.executable, __file__, "--one", str(nodes), "1" if symmetric else "0"],
                                 capture_output=True, text=True, check=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            row["target_s"], row["target_MiB"] = target_s, target_mib
            row["ok"] = not symmetric or target_s is None or (row["wall_s"] <= target_s
                                                               and row["peak_MiB"] <= target_mib)
            rows.append(row)
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            target = f" (target {r['target_s']:.0f} s, {r['target_MiB']:.0f} MiB)" if r["target_s"] else ""
            print(f"ddp llama-70b on {r['world_size']:>5} GPUs, {'symmetric' if r['symmetric'] else 'full':>9}: "
                  f"{r['wall_s']:7.2f} s wall, peak {r['peak_MiB']:7.1f} MiB{target}, {r['ops']:,} op records, "
                  f"step {r['step_s']:.6f} s")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
