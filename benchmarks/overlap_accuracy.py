"""`distlab validate`'s overlap plan (runtime/measure/validation.py: compute on one stream, all_reduces of its gradients
on another) predicted vs measured, over several runs of the very command users run, with the machine's load.

    python benchmarks/overlap_accuracy.py [--runs 5] [--nproc 2] [--quick] [--json] [--keep DIR] [--markdown]

Each run is one `distlab validate --nproc N` (its defaults: 5 collectives calibrated at N ranks, held-out sizes,
the held-out world size 3, and the overlap plan at N and 3 ranks, timed first on fresh ranks, 15 times: the run's
error is that of the median makespan). ``--quick``: `validate --ops all_reduce --holdout-nproc none` with four
calibration sizes (a minute instead of several). Prints per world size every run's error, whether validate
trusted it and why not (runtime/measure/trust.py: other processes' load, which holds for every case of its run, a
median noisier than error and tolerance, more ranks than cores), the median error over all runs, the fitted
factors (interference I: compute's slowdown beside an all_reduce; comm_interference K: the all_reduce's beside
compute, sim/kernel/cores.py) and the error without them. Targets (issue 33): at 2 ranks within 15% in at least
4 of 5 runs; at 3 ranks (more ranks than the 2 cores) every run within 25% or reported untrustworthy by validate
with the reason (runtime/measure/trust.py). Exit 1 when a target is missed, or cannot be judged (more than one run in 5
untrustworthy at 2 ranks). ``--keep DIR``: each run's `validate --out` file (every op of every repeat, each probe
round's figures) is kept there; benchmarks/overlap_ops.py DIR compares them op by op. ``--markdown``: also write
this benchmark's section of docs/accuracy.md (benchmarks/accuracy_doc.py).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

TARGET = {2: 0.15, 3: 0.25}           # |error| per world size; other world sizes: 15%
NEEDED = 0.8                          # share of the runs within the target (4 of 5)
OVERSUBSCRIBED = (3,)                 # more ranks than this machine's 2 cores: each run within its target or
                                      # reported untrustworthy by validate with the reason (runtime/measure/trust.py)


def one_run(nproc: str, folder: str, k: int, quick: bool) -> dict:
    out = os.path.join(folder, f"validate-{k}.json")
    extra = (["--ops", "all_reduce", "--holdout-nproc", "none", "--calib-sizes", "1MiB,2MiB,8MiB,16MiB", "--sizes",
              "4MiB", "--iters", "5"] if quick else [])
    cmd = [sys.executable, "-m", "distlab.runtime.cli", "validate", "--nproc", nproc, *extra,
           "--plot", os.path.join(folder, f"validate-{k}.png"), "--out", out, "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"overlap_accuracy: validate failed: {p.stderr.strip()}")
    d = json.loads(p.stdout)
    return {"load": d["load"], "trust": d.get("trust", {}),
            "cases": [c for c in d["cases"] if c["kind"] == "overlap plan"]}


def load_doubt(run: dict) -> str | None:
    """validate's verdict on the machine's load during a run (runtime/measure/trust.py judge), or None: it holds for every
    case of the run, whatever the case's own noise."""
    from distlab.runtime.measure.trust import BACKGROUND_LIMIT
    reasons = [r.split(" (allowed")[0] for r in run["trust"].get("reasons", []) if r.startswith("other processes used")]
    return ", ".join(reasons) + f" (allowed: {BACKGROUND_LIMIT:.0%} of the cores)" if reasons else None


def summarize(runs: list[dict]) -> list[dict]:
    per_n: dict[int, list[dict]] = {}
    for k, r in enumerate(runs):
        during = (r["load"].get("during") or {}).get("background_cores")
        busy = load_doubt(r)
        for c in r["cases"]:
            c = {**c, "background_during": during}
            why = "; ".join(filter(None, [busy, c.get("doubt")]))
            if why:
                c.update(trusted=False, doubt=f"run {k + 1}: {why}")
            per_n.setdefault(c["world_size"], []).append(c)
    out = []
    for n, cs in sorted(per_n.items()):
        target = TARGET.get(n, 0.15)
        errors = [c["error"] for c in cs]
        trusted = [c for c in cs if c.get("trusted", True)]
        within = sum(abs(c["error"]) <= target for c in cs)
        doubts = [c["doubt"] for c in cs if c.get("doubt")]
        if n in OVERSUBSCRIBED:       # within its target, or reported untrustworthy with the reason, run by run
            unexplained = [c for c in cs if abs(c["error"]) > target and not c.get("doubt")]
            ok = not unexplained
            status = (f"ok: {within} of {len(cs)} runs within {target:.0%}, {len(cs) - within} reported "
                      "untrustworthy with the reason" if ok else
                      f"MISSED: {len(unexplained)} of {len(cs)} runs beyond {target:.0%} and trusted")
        else:
            ok = within >= NEEDED * len(cs)
            status = "ok" if ok else (f"NOT JUDGED: {len(cs) - len(trusted)} of {len(cs)} runs untrustworthy"
                                      if len(trusted) < NEEDED * len(cs) else "MISSED")
        out.append({"world_size": n, "runs": len(cs), "target": target, "within_target": within,
                    "errors": errors, "median_error": statistics.median(errors),
                    "trusted_runs": len(trusted), "doubts": doubts,
                    "median_error_without_interference": statistics.median(c["error_without_interference"]
                                                                           for c in cs),
                    "spreads": [c.get("spread") for c in cs], "interference": [c.get("interference") for c in cs],
                    "comm_interference": [c.get("comm_interference", 1.0) for c in cs],
                    "background_during": [c["background_during"] for c in cs], "ok": ok, "status": status})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--nproc", default="2")
    p.add_argument("--quick", action="store_true", help="all_reduce only, no held-out world size")
    p.add_argument("--json", action="store_true")
    p.add_argument("--keep", metavar="DIR", help="keep each run's validate output (JSON, PNG) in DIR")
    p.add_argument("--markdown", action="store_true", help="also write this section of docs/accuracy.md")
    args = p.parse_args(argv)
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    from accuracy_doc import report
    with report("overlap_accuracy", args.markdown, sys.argv[1:] if argv is None else argv):
        with tempfile.TemporaryDirectory() as tmp:
            runs = [one_run(args.nproc, args.keep or tmp, k, args.quick) for k in range(args.runs)]
        summary = summarize(runs)
        if args.json:
            print(json.dumps({"schema": "distlab.overlap_accuracy/3", "target": TARGET, "results": summary},
                             indent=1))
        else:
            print(f"`distlab validate --nproc {args.nproc}`{' (--quick)' if args.quick else ''}, {args.runs} runs; "
                  "error = (predicted - measured) / measured of the median of its repeats")
            for s in summary:
                runs_text = ", ".join(
                    f"{e * 100:+.0f}% (spread {sp * 100:.0f}%, I {i:.2f}, K {k:.2f}, others {b} cores)"
                    for e, sp, i, k, b in zip(s["errors"], s["spreads"], s["interference"], s["comm_interference"],
                                              s["background_during"]))
                print(f"{s['world_size']} ranks: within {s['target']:.0%} in {s['within_target']} of {s['runs']} "
                      f"runs, median error {s['median_error'] * 100:+.1f}% (without the interference factors "
                      f"{s['median_error_without_interference'] * 100:+.1f}%); trusted by validate: "
                      f"{s['trusted_runs']} of {s['runs']}: {s['status']}")
                print(f"  runs: {runs_text}")
                for d in s["doubts"]:
                    print(f"  untrustworthy: {d}")
    return 0 if all(s["ok"] for s in summary) else 1        # a target not shown, missed or not judged


if __name__ == "__main__":
    sys.exit(main())
