"""`distlab validate`'s overlap plan (runtime/validation.py: compute on one stream, all_reduces of its gradients
on another) predicted vs measured at 2 and 4 ranks, over several validate runs, with the machine's load.

    python benchmarks/overlap_accuracy.py [--runs 5] [--nproc 2,4] [--json] [--keep DIR]

Each run is one `distlab validate --ops all_reduce` (its own calibration, then the plan 5 times: the run's error
is that of the median makespan). Prints per world size every run's error, the median error over the runs, their
spread (largest - smallest), the load before each run, the fitted factors (interference I: compute's slowdown
beside an all_reduce; comm_interference K: the all_reduce's beside compute, sim/kernel/cores.py) and the median error
of the same predictions with both factors 1, and with K = 1 only (what each changes). ``--keep DIR``: each
run's `distlab validate --out` file (every op of every repeat) is kept there. Target (issue 15): |median error| <= 15%. Exit code 1
when a target is missed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

TARGET = 0.15


def one_run(nproc: str, folder: str, k: int) -> dict:
    out = os.path.join(folder, f"validate-{k}.json")
    cmd = [sys.executable, "-m", "distlab.runtime.cli", "validate", "--ops", "all_reduce", "--nproc", nproc,
           "--holdout-nproc", "none", "--calib-sizes", "1MiB,2MiB,8MiB,16MiB", "--sizes", "4MiB", "--iters", "5",
           "--plot", os.path.join(folder, f"validate-{k}.png"), "--out", out, "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"overlap_accuracy: validate failed: {p.stderr.strip()}")
    d = json.loads(p.stdout)
    return {"load": d["load"], "cases": [c for c in d["cases"] if c["kind"] == "overlap plan"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--nproc", default="2,4")
    p.add_argument("--json", action="store_true")
    p.add_argument("--keep", metavar="DIR", help="keep each run's validate output (JSON, PNG) in DIR")
    args = p.parse_args(argv)
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one_run(args.nproc, args.keep or tmp, k) for k in range(args.runs)]
    per_n: dict[int, list[dict]] = {}
    for r in runs:
        for c in r["cases"]:
            per_n.setdefault(c["world_size"], []).append({**c, "load_average": (r["load"]["at_calibration"] or {})
                                                          .get("loadavg_1m")})
    summary = []
    for n, cs in sorted(per_n.items()):
        errors = [c["error"] for c in cs]
        med = statistics.median(errors)
        summary.append({"world_size": n, "runs": len(cs), "median_error": med, "errors": errors,
                        "median_error_without_interference": statistics.median(
                            c["error_without_interference"] for c in cs),
                        "median_error_without_comm_interference": statistics.median(
                            c.get("error_without_comm_interference", c["error"]) for c in cs),
                        "spread": max(errors) - min(errors), "interference": [c.get("interference") for c in cs],
                        "comm_interference": [c.get("comm_interference", 1.0) for c in cs],
                        "load_average": [c["load_average"] for c in cs], "ok": abs(med) <= TARGET})
    if args.json:
        print(json.dumps({"schema": "distlab.overlap_accuracy/1", "target": TARGET, "results": summary}, indent=1))
    else:
        for s in summary:
            runs = ", ".join(f"{e * 100:+.0f}% (I {i:.2f}, K {k:.2f}, load {la})" for e, i, k, la in
                             zip(s["errors"], s["interference"], s["comm_interference"], s["load_average"]))
            print(f"{s['world_size']} ranks: median error {s['median_error'] * 100:+.1f}% over {s['runs']} runs "
                  f"(spread {s['spread'] * 100:.0f} points; without interference "
                  f"{s['median_error_without_interference'] * 100:+.1f}%, with I only "
                  f"{s['median_error_without_comm_interference'] * 100:+.1f}%) {'ok' if s['ok'] else 'MISSED'}; "
                  f"runs: {runs}")
    return 0 if all(s["ok"] for s in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
