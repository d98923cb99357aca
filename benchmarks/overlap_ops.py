"""`distlab validate`'s overlap plan op by op: where a run's predicted makespan and its measured one part.

    python benchmarks/overlap_accuracy.py --quick --keep DIR     # keeps every run's validate --out file
    python benchmarks/overlap_ops.py DIR [--json]

The plan (runtime/measure/validation.py overlap_plan) is bwd0, then three layers whose compute overlaps the previous
layer's all_reduce, then the last all_reduce alone. Each kept run is cut into those parts, predicted (the same
simulation validate ran: sim.engine on the calibrated cluster with the probe rounds' rate and factors) and
measured (every repeat, every rank; the median over the repeats):

- ``first compute``: bwd0 on every rank at once, nothing in flight (the compute rate F alone);
- ``overlapped``: from the end of bwd0 on the last rank to the launch of the last all_reduce (the interference
  factors I and K at work);
- ``last all_reduce``: its launch (the last rank's start) to the last rank's end, nothing beside it (the
  collective model alone); next to it the same all_reduce alone as the probe rounds timed it between the
  plan's runs and as the size sweep timed it (the held-out 4 MiB all_reduce, and the fit's prediction);
- ``makespan``: the case's own figure.

A part whose error is far from the others' says which input of the prediction was off in that run (F, I and K,
or the collective fit). Exit 2 with one line when DIR has no kept run.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys

PARTS = ("first compute", "overlapped", "last all_reduce", "makespan")


def parts(trace) -> dict:
    """{part: seconds} of one trace of the overlap plan (predicted or measured), the parts of the docstring."""
    by: dict = {}
    for o in trace.ops:
        by.setdefault(o.name, []).append(o)
    layers = sum(1 for name in by if name.startswith("bwd"))
    first, last = by["bwd0"], by[f"ar{layers - 1}"]
    launch = max(o.launch if o.launch is not None else o.start for o in last)
    first_end = max(o.end for o in first)
    return {"first compute": first_end - min(o.start for o in first), "overlapped": launch - first_end,
            "last all_reduce": max(o.end for o in last) - launch, "makespan": trace.makespan}


def compare(run: dict) -> list[dict]:
    """One row per world size of a kept `validate --out` file: predicted and measured (median) parts."""
    from distlab.runtime.execute.executor import merge_results
    from distlab.runtime.measure.validation import cluster_for, overlap_plan, probe_compute
    from distlab.sim.kernel.engine import simulate
    rows = []
    for n, results in sorted(run["measured"].items(), key=lambda kv: int(kv[0])):
        n = int(n)
        if not results or "plan" not in results[0]:
            continue
        plan = overlap_plan(n)
        compute = probe_compute(results[0]["compute"])
        cluster = cluster_for(run["calibration"], compute, n, "gloo", run["load"]["cpu_cores"].get(str(n)))
        predicted = parts(simulate(plan, cluster, record_transfers=False))
        repeats = len(results[0]["plan"]["runs"])
        measured = [parts(merge_results(plan, [r["plan"] for r in results], run=k)) for k in range(repeats)]
        row = {"world_size": n, "predicted_s": predicted,
               "measured_s": {p: statistics.median(m[p] for m in measured) for p in PARTS},
               "interference": cluster.interference, "comm_interference": cluster.comm_interference,
               "flops_per_s": compute["flops_per_s"],
               "all_reduce_alone_probe_s": compute.get("comm_alone_s")}
        sweep = [c for c in run["cases"] if c["kind"] != "overlap plan" and c["world_size"] == n
                 and c["case"] == "all_reduce" and c["bytes"] == plan.meta["bytes"]]
        if sweep:
            row.update(all_reduce_alone_sweep_s=sweep[0]["measured_s"], all_reduce_fit_s=sweep[0]["predicted_s"])
        row["error"] = {p: (row["predicted_s"][p] - row["measured_s"][p]) / row["measured_s"][p] for p in PARTS}
        rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", help="the --keep DIR of benchmarks/overlap_accuracy.py")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    files = sorted(glob.glob(os.path.join(args.dir, "validate-*.json")))
    if not files:
        sys.stderr.write(f"overlap_ops: error: no validate-*.json in {args.dir} (write them with "
                         "benchmarks/overlap_accuracy.py --keep DIR)\n")
        return 2
    out = []
    for path in files:
        with open(path) as f:
            out += [{"file": os.path.basename(path), **row} for row in compare(json.load(f))]
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print("predicted / measured ms (error) per part; the measured part is the median over the repeats")
    for r in out:
        ms = "  ".join(f"{p} {r['predicted_s'][p] * 1e3:.1f}/{r['measured_s'][p] * 1e3:.1f} ({r['error'][p]:+.0%})"
                       for p in PARTS)
        alone = [f"{name} {r[key] * 1e3:.1f}" for name, key in (("probe", "all_reduce_alone_probe_s"),
                 ("sweep", "all_reduce_alone_sweep_s"), ("fit", "all_reduce_fit_s")) if r.get(key)]
        print(f"{r['file']} {r['world_size']} ranks: {ms}")
        print(f"  I {r['interference']:.2f}, K {r['comm_interference']:.2f}, F {r['flops_per_s'] / 1e9:.1f} GFLOP/s"
              + (f"; the all_reduce alone (ms): {', '.join(alone)}" if alone else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
