"""Does `distlab plan` find the published layouts? For each run of the reproduction suite (sim/reproduce/runs.yaml:
Megatron-LM's Table 1), search every layout of the run's model on its GPUs and global batch, on the run's cluster
with its generation's fitted GEMM curve, and report where the published layout ranks among those that fit, its
throughput against the planner's #1, and, when it is not in the top 5 within 10%, #1 against it term by term.
Twice: over every layout distlab builds, and over what the run's own stack offered ("as published": DDP, the
run's recompute, no sequence or context parallelism, even splits: Megatron-LM in 2021, which had the interleaved
schedule and the vocabulary-parallel loss).

Both sides are the planner's fast estimate (sim/planner/step.py), so the comparison is like for like; the planner
searches what distlab's builders compose (sim/planner/layouts.py: tp, cp, pp with virtual stages and splits, DDP,
FSDP2 or HSDP, micro-batch, sequence and loss parallelism, recompute, 1F1B, GPipe or interleaved 1F1B), which
includes every published layout of Table 1.

    python benchmarks/plan_published.py --max-gpus 512
"""
from __future__ import annotations

import argparse
import os
import time


def published_layout(run):
    from distlab.sim.planner.layouts import Layout
    lay = run.layout
    m = run.global_batch // (lay["dp"] * run.micro_batch)
    return Layout(lay["tp"], lay["pp"], lay["dp"], "ddp", run.micro_batch, m, False,
                  run.recompute, run.schedule)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-gpus", type=int, default=512, help="skip runs of more GPUs (default 512)")
    p.add_argument("--only", action="append", help="run name(s) to search")
    p.add_argument("--as-published", action="store_true", help="search only what the run's stack offered: DDP, its "
                                                                "recompute, no sequence parallelism")
    args = p.parse_args()
    from distlab.sim.planner import explain
    from distlab.sim.planner.search import search
    from distlab.sim.reproduce.predict import cluster_for
    from distlab.sim.reproduce.runs import load_runs
    from distlab.sim.reproduce.scenario import model_dtype
    runs, generations = load_runs()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'run':16s} {'GPUs':>5s} {'layouts':>7s} {'fit':>5s} {'rank':>5s} {'vs #1':>7s} {'s':>6s}  planner's #1")
    for run in runs:
        if run.flops != "megatron-eq3":          # Table 1's rows (the runs file holds other sources since)
            continue
        if run.gpus > args.max_gpus or (args.only and run.name not in args.only):
            continue
        t0 = time.perf_counter()
        cluster = cluster_for(run, generations)
        model = {**run.model, "dtype": model_dtype(run)}
        want = published_layout(run)
        same_stack = (lambda L: L.dp_kind == "ddp" and L.recompute == want.recompute and not L.sequence_parallel
                      and L.cp == 1 and L.split is None) if args.as_published else None
        s = search(model, cluster, cluster.nodes, run.global_batch, confirm=0, allow=same_stack)
        rank = next((i + 1 for i, c in enumerate(s.ranked) if c.layout == want), None)
        first = s.ranked[0]
        mine = next((c for c in s.ranked if c.layout == want), None)
        ratio = first.step_s / mine.step_s if mine else float("nan")
        dt = time.perf_counter() - t0
        print(f"{run.name:16s} {run.gpus:5d} {len(s.all):7d} {len(s.ranked):5d} {rank or '-':>5} {ratio:7.1%} "
              f"{dt:6.1f}  {first.layout.label()}")
        if mine is None:
            print(f"{'':16s} the published layout {want.label()} was not ranked (enumerated: "
                  f"{any(c.layout == want for c in s.all)}; it does not fit or is not searched)")
        elif rank > 5 or ratio < 0.9:
            term, sec = explain.largest_difference(first, mine)
            parts = ", ".join(f"{name} {first.estimate.terms.get(k, 0) * 1e3:.0f} vs {mine.estimate.terms.get(k, 0) * 1e3:.0f}"
                              for k, name in explain.TERMS.items())
            print(f"{'':16s} #1 vs published (ms): {parts}; the published layout loses most on {term} "
                  f"(+{sec * 1e3:.0f} ms)")
    return 0


if __name__ == "__main__":                # --markdown: also write its section of docs/accuracy.md
    from accuracy_doc import run_main
    raise SystemExit(run_main("plan_published", main))
