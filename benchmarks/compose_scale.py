"""A composition at full scale from the command line (issue 30): Llama 3 405B on 16,384 H100 as torchtitan lays
it out, pp 16 x dp_shard 128 x tp 8 (FSDP2 inside each pipeline stage, TP + SP in a node), 1F1B with 16
micro-batches, torchtitan's uneven split (7 + 14 x 8 + 7 blocks: Llama 3, arXiv 2407.21783, sec. 3.3.2):

    distlab simulate --model llama3-405b --cluster dgx-h100 --nodes 2048 --mesh pp=16,dp_shard=128,tp=8 \\
        --microbatches 16

Target: <= 60 s and <= 4 GiB. Runs that command in a child process (its files into a temporary folder, as a user
would get them) and prints its wall time, its CPU seconds (user + system: the wall time on an idle core), its
peak memory (the child's peak resident set, resource.getrusage(RUSAGE_CHILDREN)) and the machine's load average
before and after (other processes slow a shared core down: compare cpu_s with the target then).

Then the planner's estimate of the same step (sim/planner/composed.py, built from one rank per stage) and its
wall time, in this process.

    python benchmarks/compose_scale.py [--json] [--repeat N]
"""
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

COMMAND = ["simulate", "--model", "llama3-405b", "--cluster", "dgx-h100", "--nodes", "2048",
           "--mesh", "pp=16,dp_shard=128,tp=8", "--microbatches", "16"]
TARGET_S, TARGET_MIB = 60.0, 4096.0


def one() -> dict:
    """Run the command once in a child; its wall time, CPU, peak memory and step."""
    with tempfile.TemporaryDirectory(prefix="distlab-compose-scale-") as out:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "distlab.runtime.cli", *COMMAND, "--out", out],
                           capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        files = sorted(os.listdir(out))
    if p.returncode != 0:
        raise SystemExit(f"compose_scale: the command failed ({p.returncode}): {p.stderr.strip()[-400:]}")
    step = next((line.split()[-2] for line in p.stdout.splitlines() if line.strip().startswith("step time")), None)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"command": "distlab " + " ".join(COMMAND), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "peak_MiB": round(after.ru_maxrss / 1024, 1), "step_ms": float(step) if step else None,
            "files": files, "load_1min_before": round(load0, 2), "load_1min_after": round(os.getloadavg()[0], 2),
            "target_s": TARGET_S, "target_MiB": TARGET_MIB}


def estimate() -> dict:
    """The planner's estimate of the same step (sim/planner/composed.py), in this process after the child: its
    step and wall time (what a search pays per candidate of this size)."""
    from distlab.sim.cluster import load_cluster
    from distlab.sim.mesh import Mesh
    from distlab.sim.models import preset
    from distlab.sim.parallel.fsdp.plan import FSDPOptions
    from distlab.sim.parallel.parallelize import choose
    from distlab.sim.parallel.pipeline.plan import PipelineOptions
    from distlab.sim.planner.composed import estimate_composed
    t0 = time.perf_counter()
    mesh = Mesh({"pp": 16, "dp_shard": 128, "tp": 8})
    par = choose(mesh, {"pipeline": PipelineOptions(microbatches=16), "fsdp": FSDPOptions(reshard_after_forward=False)})
    step = estimate_composed(preset("llama3-405b"), mesh, par, load_cluster("dgx-h100", nodes=2048))
    return {"estimate_step_ms": round(step * 1e3, 3), "estimate_wall_s": round(time.perf_counter() - t0, 2)}


def describe(r: dict) -> str:
    """One run in two lines: the command, then its time, memory, step and the load around it."""
    verdict = "ok" if r["ok"] else "OVER"
    return (f"{r['command']}\n  {r['wall_s']:.2f} s wall ({r['cpu_s']:.2f} s CPU), peak {r['peak_MiB']:.1f} MiB "
            f"(target {TARGET_S:.0f} s, {TARGET_MIB:.0f} MiB): {verdict}; step {r['step_ms']} ms; files "
            f"{', '.join(r['files'])}; load {r['load_1min_before']} -> {r['load_1min_after']}\n  the planner's "
            f"estimate (sim/planner/composed.py): step {r['estimate_step_ms']} ms in {r['estimate_wall_s']} s")


def main() -> int:
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 1
    rows = [one() for _ in range(repeat)]
    for r in rows:
        r["ok"] = r["wall_s"] <= TARGET_S and r["peak_MiB"] <= TARGET_MIB
        r.update(estimate())
    print(json.dumps(rows, indent=2) if "--json" in sys.argv else "\n".join(map(describe, rows)), flush=True)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
