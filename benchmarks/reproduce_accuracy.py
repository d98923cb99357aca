"""Published runs reproduced (sim/reproduce/runs.yaml): predicted vs reported figure per run, then per source and per
GPU generation over the rows not fitted on: rows, median |error|, largest |error|, bias (the median signed error).
Target: median <= 10% and largest <= 20% for each generation with held-out rows. Rows the simulator cannot express
yet are listed with the reason.

    python benchmarks/reproduce_accuracy.py [RUNS.yaml] [--max-gpus N] [--only NAME ...] [--json]
    python benchmarks/reproduce_accuracy.py --fit [RUNS.yaml]

--fit refits each generation's sustained fraction (sim/compute/fitted.py) on the rows its ``fitted_on`` names:
the value that makes the mean log error of those rows zero (simulation in the loop: a step's throughput is close
to a power of sustained, so each iteration rescales it by that power's estimate; 4 iterations). It prints the
constants to write into sim/compute/fitted.py.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from distlab.sim.compute.fitted import FITTED, Fitted  # noqa: E402
from distlab.sim.reproduce.predict import predict  # noqa: E402
from distlab.sim.reproduce.runs import load_runs  # noqa: E402


def log_error(runs, generation: str, sustained: float) -> float:
    """Mean log(predicted / reported) of ``runs`` with the generation's sustained fraction set to ``sustained``."""
    over = {generation: Fitted(sustained=sustained, fitted_on=FITTED[generation].fitted_on)}
    return statistics.fmean(math.log1p(predict(r, over)["error"]) for r in runs)


def fit(runs, generation: str, names) -> float:
    """sustained with a mean log error of zero over the rows ``names`` (module docstring)."""
    rows = [r for r in runs if r.name in names]
    s, e = 0.7, log_error(rows, generation, 0.7)
    s2 = s * math.exp(-e)                               # first step: throughput proportional to sustained
    for _ in range(4):
        e2 = log_error(rows, generation, s2)
        print(f"  {generation}: sustained {s2:.4f}, mean log error {e2:+.4f}", flush=True)
        if abs(e2) < 1e-4:
            break
        power = (e2 - e) / math.log(s2 / s) if s2 != s else 1.0
        s, e, s2 = s2, e2, s2 * math.exp(-e2 / max(power, 0.1))
    return s2


def summary(results: list[dict], key: str) -> list[dict]:
    """Per value of ``key`` (table or generation): held-out rows, median and largest |error|, bias."""
    out = []
    for value in dict.fromkeys(x[key] for x in results):
        errs = [x["error"] for x in results if x[key] == value and x.get("expressible") and not x["fitted"]]
        fitted = sum(1 for x in results if x[key] == value and x.get("expressible") and x["fitted"])
        missing = sum(1 for x in results if x[key] == value and not x.get("expressible"))
        row = {key: value, "rows": len(errs), "fitted_rows": fitted, "not_expressible": missing}
        if errs:
            row.update(median_abs_error=statistics.median(abs(e) for e in errs),
                       max_abs_error=max(abs(e) for e in errs), bias=statistics.median(errs))
        out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="?")
    ap.add_argument("--only", action="append")
    ap.add_argument("--max-gpus", type=int)
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    runs, fitted = load_runs(args.runs)
    if args.fit:
        for generation, f in fitted.items():
            if f.fitted_on:
                t0 = time.perf_counter()
                s = fit(runs, generation, f.fitted_on)
                print(f"{generation}: sustained {s:.4f} (fitted on {', '.join(f.fitted_on)}; "
                      f"{time.perf_counter() - t0:.0f} s)")
        return 0
    results = []
    for r in runs:
        if (args.only and r.name not in args.only) or (args.max_gpus and r.gpus > args.max_gpus):
            continue
        x = predict(r)
        results.append(x)
        if args.json:
            continue
        if not x["expressible"]:
            print(f"{x['name']:38} {x['world_size']:6} GPUs  not expressible yet: {x['reason']}", flush=True)
            continue
        print(f"{x['name']:38} {x['world_size']:6} GPUs  {x['figure']} reported {x['reported']:8.4g}  predicted "
              f"{x['predicted']:8.4g}  error {100 * x['error']:+6.1f}%  {'fitted' if x['fitted'] else '      '}"
              f"  MFU {100 * x['mfu']:4.1f}%  step {x['step_time_s']:.3f} s  sim wall {x['wall_s']:.1f} s",
              flush=True)
    tables, generations = summary(results, "table"), summary(results, "generation")
    if args.json:
        print(json.dumps({"results": results, "by_source": tables, "by_generation": generations}, indent=1))
        return 0
    for title, rows, key in (("per source", tables, "table"), ("per GPU generation", generations, "generation")):
        print(f"\n{title} (rows not fitted on):")
        for s in rows:
            line = f"  {s[key]}: {s['rows']} rows"
            if s["rows"]:
                line += (f", median |error| {100 * s['median_abs_error']:.1f}%, largest "
                         f"{100 * s['max_abs_error']:.1f}%, bias {100 * s['bias']:+.1f}%")
            line += f"; fitted on {s['fitted_rows']}, not expressible yet {s['not_expressible']}"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
