"""Lesson 11's three planner searches (sim/lessons/bank_plan.py: Llama 3 70B on 8 x DGX H100, the 405B replica
of Table 4's first row, the tiny model): the CPU seconds of each in this process (workers=1, as the notebook runs
them), and a fingerprint of everything they found, to prove a speed-up changed nothing.

The fingerprint holds, per search, every enumerated layout in enumeration order with its memory by part, and for
the estimated ones the estimate's step and terms as ``float.hex`` (bit-exact), then the ranking (indices into the
enumeration) and the counts. ``--save`` writes it (JSON); ``--compare`` reads one and names the first difference
(exit 1) or says "identical".

    python benchmarks/plan_lesson_searches.py --save /tmp/before.json     # on the old code
    python benchmarks/plan_lesson_searches.py --compare /tmp/before.json  # on the new code
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

SEARCHES = ("70b", "405b-replica", "tiny")


def fingerprint(s) -> dict:
    """Everything a search found, bit-exact (floats as float.hex)."""
    index = {id(c): i for i, c in enumerate(s.all)}
    rows = []
    for c in s.all:
        row = [repr(c.layout), {k: float(v).hex() for k, v in c.memory.items()}]
        if c.estimate is not None:
            row += [c.estimate.step_s.hex(), {k: float(v).hex() for k, v in c.estimate.terms.items()}]
        rows.append(row)
    return {"all": rows, "ranked": [index[id(c)] for c in s.ranked], "fit": s.fit, "pruned": s.pruned,
            "confirmed": s.confirmed, "model_flops": float(s.model_flops).hex()}


def digest(fp: dict) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()


def first_difference(a: dict, b: dict) -> str | None:
    for key in ("fit", "pruned", "confirmed", "model_flops", "ranked"):
        if a[key] != b[key]:
            where = next((i for i, (x, y) in enumerate(zip(a[key], b[key])) if x != y), None) \
                if isinstance(a[key], list) else None
            return f"{key} differs" + (f" first at position {where}" if where is not None else "")
    if len(a["all"]) != len(b["all"]):
        return f"{len(a['all'])} layouts before, {len(b['all'])} now"
    for i, (x, y) in enumerate(zip(a["all"], b["all"])):
        if x != y:
            return f"layout {i} differs: before {x}, now {y}"
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=SEARCHES, action="append", help="run only this search (repeatable)")
    p.add_argument("--save", metavar="PATH", help="write the fingerprints (JSON) to PATH")
    p.add_argument("--compare", metavar="PATH", help="compare with the fingerprints saved at PATH (exit 1 if any "
                                                     "differs)")
    p.add_argument("--json", action="store_true", help="print the CPU seconds and digests as JSON")
    args = p.parse_args(argv)
    from distlab.sim.lessons import bank_plan
    before = None
    if args.compare:
        with open(args.compare) as f:
            before = json.load(f)
    out, fps, differs = {}, {}, False
    load = os.getloadavg()[0]
    for name in args.only or SEARCHES:
        t = time.process_time()
        s = bank_plan._search(name)
        cpu = time.process_time() - t
        fps[name] = fingerprint(s)
        out[name] = {"cpu_s": round(cpu, 2), "layouts": len(s.all), "fit": s.fit, "estimated": len(s.ranked),
                     "sha256": digest(fps[name])}
        if before is not None:
            diff = first_difference(before[name], fps[name]) if name in before else "not in the saved file"
            out[name]["compare"] = diff or "identical"
            differs |= diff is not None
    if args.save:
        with open(args.save, "w") as f:
            json.dump(fps, f)
    if args.json:
        print(json.dumps({"load_average_start": load, "load_average_end": os.getloadavg()[0], "searches": out}))
    else:
        print(f"load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, {os.cpu_count()} cores")
        for name, r in out.items():
            print(f"{name:14s} {r['cpu_s']:7.2f} s CPU  {r['layouts']} layouts, {r['fit']} fit, "
                  f"{r['estimated']} estimated  sha256 {r['sha256'][:16]}"
                  + (f"  {r['compare']}" if "compare" in r else ""))
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
