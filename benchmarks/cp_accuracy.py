"""Predicted vs measured context-parallel step time on this machine (gloo, CPU ranks): within 20%?

    python benchmarks/cp_accuracy.py [--nproc 4] [--scenario scenarios/cp-cpu.yaml] [--steps 7] [--repeats 3]
                                     [--rotate-method allgather|alltoall]

Each repeat is one launch (runtime/parallel/cp/validate.py): torch's ring attention (``_templated_ring_attention`` and
its backward, the code ``context_parallel`` runs; runtime/parallel/cp/run.py says why not ``context_parallel`` itself)
and FSDP2 on --nproc gloo ranks, with calibration rounds (runtime/parallel/cp/calibrate.py) interleaved with the steps;
the simulator, calibrated on them, predicts the step from the plan alone. Printed per repeat: measured (median
over steps of the slowest rank's uncaptured step) and its spread over the steps, predicted, error, whether every
collective sequence matched; then the median error over repeats and the machine's load (runtime/measure/load.py) before
and after (the machine is shared). Exit 1 if the median |error| exceeds --tolerance (default 20%).
"""
from __future__ import annotations

import argparse
import statistics
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--scenario", default="scenarios/cp-cpu.yaml")
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rotate-method", choices=("allgather", "alltoall"), default=None)
    p.add_argument("--tolerance", type=float, default=20.0, help="allowed median |error| in percent")
    args = p.parse_args(argv)
    from distlab.runtime.measure import load as machine_load
    from distlab.runtime.parallel.cp.validate import validate_cp
    from distlab.sim import scenario as sc
    d = sc.load(args.scenario)
    if args.rotate_method:
        d["cp"] = {**(d.get("cp") or {}), "rotate_method": args.rotate_method}
    before = machine_load.sample()
    print(f"{args.scenario} on {args.nproc} gloo ranks; before: {before.line() if before else 'load unknown'}")
    errors = []
    for k in range(args.repeats):
        t = time.time()
        r = validate_cp(d, nproc=args.nproc, steps=args.steps, warmup=1, timeout=900)
        row = r["rows"][0]
        m, rep = row["measured_s"], row["repeats"]
        err = 100.0 * (row["predicted_s"] / m - 1)
        errors.append(err)
        c = r["cluster"]
        print(f"repeat {k + 1}: {row['what']}: measured {m * 1e3:.1f} ms (steps {min(rep) * 1e3:.1f}.."
              f"{max(rep) * 1e3:.1f}, spread {100 * (max(rep) - min(rep)) / m:.0f}%), "
              f"predicted {row['predicted_s'] * 1e3:.1f} ms, "
              f"error {err:+.1f}%, sequences {'match' if r['sequence_match'] else 'DIFFER'}; calibrated compute "
              f"{c.gpu.tflops * 1e3:.2f} GFLOP/s, memory {c.gpu.hbm_GBps:.2f} GB/s, permute link "
              f"{c.intra_node.bandwidth_GBps:.3f} GB/s + {c.intra_node.latency_us:.0f} us ({time.time() - t:.0f} s)")
    after = machine_load.sample()
    med = statistics.median(errors)
    print(f"median error {med:+.1f}% over {len(errors)} repeats (from {min(errors):+.1f}% to {max(errors):+.1f}%; "
          f"tolerance {args.tolerance:g}%); after: {after.line() if after else 'load unknown'}")
    return 0 if abs(med) <= args.tolerance else 1


if __name__ == "__main__":                # --markdown: also write its section of docs/accuracy.md
    from accuracy_doc import run_main
    raise SystemExit(run_main("cp_accuracy", main))
