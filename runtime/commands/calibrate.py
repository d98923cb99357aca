"""`distlab calibrate`: measure this machine's collectives and compute, write a cluster YAML the simulator loads.

Per world size (one launch each, runtime/measure/calibration.py's ``measure``): a size sweep of every op, the ring model
fitted to the median times from launch (runtime/measure/fit.py), and matmul FLOP/s with all ranks computing at once.
The YAML (runtime/measure/calibration.py's ``write_cluster``) is the localhost-cpu preset sized to the largest world
size, with ``gpu`` = the measured compute (at the largest world size), ``calibration.collectives`` = the fits
(with size bands where one line does not fit), ``interference`` = compute's slowdown while an all_reduce is in
flight and ``comm_interference`` = the all_reduce's slowdown while every rank computes (runtime/measure/compute_probe.py,
at the largest world size), and, for CPU ranks, ``cpu_cores`` = the cores this process may use, which the ranks
share (sim/kernel/cores.py). It is rewritten (atomically) after each world size.
``--compute``: GEMMs of many shapes, a copy and a 1 x 1 GEMM timed in this process (runtime/measure/compute_probe.py;
CUDA when present), and the gpu's tflops, gemm_efficiency, hbm_GBps and launch_s set from them, with a table and
a figure of the curve. This module only parses arguments and formats.
"""
from __future__ import annotations

import sys

from distlab.runtime.commands.common import add_launch_arguments, launch_kwargs, parse_ops, positive_int

NAME = "calibrate"
HELP = "Fit latency and bandwidth of real collectives per world size, and compute speed; write a cluster YAML."
DEFAULT_OPS = "all_reduce,all_gather,reduce_scatter,broadcast,reduce,all_to_all"


def add_arguments(p) -> None:
    p.add_argument("--from-nccl-tests", nargs="+", metavar="LOG", help="fit the cluster to nccl-tests output "
                   "(text or -J JSON of any *_perf binary) instead of measuring here; starts no ranks "
                   "(sim/ingest/calibrate.py)")
    p.add_argument("--ops", default=DEFAULT_OPS, help=f"collectives to fit (default {DEFAULT_OPS})")
    p.add_argument("--sizes", default="256KiB:64MiB:4", help="sweep sizes (default 256KiB:64MiB:4)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per size (default 2)")
    p.add_argument("--iters", type=int, default=7, help="timed calls per size (default 7)")
    add_launch_arguments(p, "world sizes to calibrate, e.g. 2,4 (default 2,4 where the cores allow, else 2; "
                            "under torchrun: its WORLD_SIZE)")
    p.add_argument("--probe-seconds", type=float, default=0.3, metavar="SECONDS",
                   help="time of each rank's matmul and copy rate probes, all ranks at once (default 0.3; less is "
                   "noisier: for quick checks)")
    p.add_argument("--interference-rounds", type=int, default=4, metavar="N",
                   help="rounds of compute with and without an all_reduce in flight (default 4; fewer is noisier)")
    p.add_argument("--out", default="localhost-calibrated.yaml", help="cluster YAML to write")
    p.add_argument("--compute", action="store_true", help="also measure GEMMs of many shapes and the copy "
                   "bandwidth here, and write the efficiency curve, peak, HBM bandwidth and per-op overhead")
    p.add_argument("--compute-budget", type=float, default=2.0, metavar="SECONDS",
                   help="seconds the --compute GEMM sweep may take (default 2)")
    p.add_argument("--plot", metavar="OUT.png", default="calibrate-compute.png",
                   help="figure of the GEMM efficiency curve, with --compute (default calibrate-compute.png)")
    p.add_argument("--json", action="store_true", help="print the fits and compute as JSON")
    p.add_argument("--strict", action="store_true", help="exit 1 when the result is not trustworthy (other "
                   "processes took cores, or a fit's medians move over 15%% by chance; runtime/measure/trust.py); the cluster "
                   "file is written either way and says so in its header")
    from distlab.sim.cli import add_output_arguments
    add_output_arguments(p, verbose=False)


def check(args):
    from distlab.sim.errors import ConfigError
    from distlab.sim.io import parse_size_range
    ops = parse_ops(args.ops, allow_barrier=False)
    sizes = parse_size_range(args.sizes)
    if len(set(sizes)) < 2:
        raise ConfigError("a fit needs at least two sizes", "--sizes")
    if args.warmup < 0:
        raise ConfigError(f"{args.warmup} must be a whole number >= 0", "--warmup")
    positive_int(args.iters, "--iters")
    from distlab.runtime.ranks.torchrun_rank import world_sizes
    from distlab.runtime.ranks.preflight import default_world_sizes
    nprocs = world_sizes(args.nproc, default_world_sizes(args.threads or 1))
    if min(nprocs) < 2:
        raise ConfigError("collectives need at least 2 ranks", "--nproc")
    budget = args.compute_budget
    if not isinstance(budget, (int, float)) or not 0.05 <= budget <= 600:
        raise ConfigError(f"{budget!r} must be seconds between 0.05 and 600", "--compute-budget")
    if not isinstance(args.probe_seconds, (int, float)) or not 0.01 <= args.probe_seconds <= 60:
        raise ConfigError(f"{args.probe_seconds!r} must be seconds between 0.01 and 60", "--probe-seconds")
    positive_int(args.interference_rounds, "--interference-rounds")
    return ops, sizes, sorted(set(nprocs))


def _lines(entry: dict) -> list[tuple[str, dict]]:
    """('all', the one-line fit) or one ('1 MiB..32 MiB', fit) per size band."""
    from distlab.sim.plan import format_bytes
    if not entry.get("bands"):
        return [("all", entry)]
    return [(f"{format_bytes(b['min_bytes'])}..{format_bytes(b['max_bytes'])}", b) for b in entry["bands"]]


def run(args) -> int:
    if args.from_nccl_tests:                       # no ranks: sim/ingest reads the logs
        from distlab.sim.ingest.calibrate import run as from_logs
        return from_logs(args.from_nccl_tests, args.out, args.json)
    from distlab.runtime.measure.calibration import backend_of, measure, write_cluster
    from distlab.runtime.ranks.launch import RunFailed
    from distlab.sim.cli import LONG_TABLE, print_json, print_table
    from distlab.sim.plan import format_bytes

    ops, sizes, nprocs = check(args)
    from distlab.runtime.commands.common import check_launch, check_sweep_memory
    from distlab.runtime.ranks.torchrun_rank import local_ranks
    check_launch(args, local_ranks(max(nprocs)))   # ranks, threads, timeout, memory: before anything starts
    check_sweep_memory(ops, sizes, "float32", max(nprocs), local_ranks(max(nprocs)))
    from distlab.sim.io import check_output
    check_output(args.out, "--out", "file")     # before the ranks start
    if args.compute:
        check_output(args.plot, "--plot", "figure")
    from distlab.runtime.ranks.preflight import warn_cores
    from distlab.runtime.ranks.torchrun_rank import under_torchrun
    if not under_torchrun() and args.nproc is not None:    # the default fits the cores (default_world_sizes)
        warn_cores(max(nprocs), args.threads, "distlab calibrate")
    from distlab.runtime.measure import load as machine_load
    from distlab.runtime.measure.fit import fit_warnings, latency_text
    from distlab.sim.output import wrapped
    from distlab.runtime.measure.trust import Watch, exit_code, judge, verdict_lines
    from distlab.sim.cli import say
    load = machine_load.sample()          # before the ranks start: the other processes' share
    watch = Watch()                       # and during the whole measurement (runtime/measure/trust.py)
    if load and not args.json:
        say(load.line(), indent="  ")
    rows, compute, backend, done = [], None, "gloo", []
    for n in nprocs:
        try:
            result = measure(ops, sizes, n, args.warmup, args.iters, probe_seconds=args.probe_seconds,
                             interference_rounds=args.interference_rounds, **launch_kwargs(args))[0]
        except RunFailed as e:
            if done:
                write_cluster(args.out, rows, compute, done, backend, sizes, load)
                sys.stderr.write(f"distlab calibrate: kept world sizes {done} in {args.out}\n")
            sys.stderr.write(f"distlab calibrate: error: {e}\n")
            return 1
        rows += result["rows"]
        compute = result["compute"]
        backend = backend_of(compute)
        done.append(n)
        cluster = write_cluster(args.out, rows, compute, done, backend, sizes, load)
    probe = None
    if args.compute:
        from distlab.runtime.measure.compute_probe import measure_here, write_with_fit
        probe = measure_here(backend, args.threads, args.compute_budget)
        cluster = write_with_fit(args.out, cluster, probe["fit"])
        if args.plot:
            from distlab.runtime.measure.compute_probe import plot_curve
            plot_curve(probe, args.plot)
    table = cluster.calibration["collectives"]
    during = watch.stop()
    after = machine_load.sample()
    loads = {"at_calibration": load.to_dict() if load else None, "after": after.to_dict() if after else None,
             "during": during}
    verdict = judge(load, during, [{"kind": "calibration fit", "case": f"{op} fit", "world_size": n,
                                    "spread": entry["spread"], "noise": entry["noise"]} for op, per_n in table.items()
                                   for n, entry in per_n.items() if "noise" in entry])
    if not verdict["trustworthy"]:          # the cluster file says so too, where it is read later
        mark_untrustworthy(args.out, verdict)
    for w in fit_warnings(cluster.calibration):
        sys.stderr.write(wrapped(f"distlab calibrate: {w}"))
    if args.json:
        out = {"cluster": args.out, "calibration": cluster.calibration, "gpu": cluster.to_dict()["gpu"],
               "cpu_cores": cluster.cpu_cores, "interference": cluster.interference,
               "comm_interference": cluster.comm_interference, "load": loads, "rows": rows}
        if probe:
            out["compute"] = {k: v for k, v in probe.items() if k != "fit"}
            out["files"] = [args.plot] if args.plot else []
        print_json({**out, "trust": verdict})
        return exit_code(verdict, args.strict)
    print_table(f"ring-model fit per op and world size ({format_bytes(min(sizes))}..{format_bytes(max(sizes))})",
                ["op", "ranks", "sizes", "latency (us)", "bandwidth (GB/s)", "spread"],
                [[op, n, band, latency_text(v), f"{v['bandwidth_GBps']:.3f}", f"{entry.get('spread', 0):.0%}"]
                 for op, per_n in table.items() for n, entry in per_n.items() for band, v in _lines(entry)],
                justify_left=3, max_rows=LONG_TABLE)
    if probe:
        print_table(f"GEMMs ({probe['dtype']} on {probe['device']}; time = the fastest of the rounds; model = "
                    "launch_s + max(FLOPs / (peak x curve), bytes / copy bandwidth))",
                    ["M", "N", "K", "kind", "time (ms)", "GFLOP/s", "efficiency", "curve", "model error"],
                    [[r["m"], r["n"], r["k"], r["kind"], f"{r['time_s'] * 1e3:.3f}", f"{r['flops_per_s'] / 1e9:.1f}",
                      f"{r['efficiency']:.2f}", f"{r['curve_efficiency']:.2f}", f"{r['model_error'] * 100:+.0f}%"]
                     for r in probe["gemms"]], justify_left=4)
        say(f"compute (one rank alone, --compute): peak {cluster.gpu.tflops * 1e3:.1f} GFLOP/s, copy "
            f"{cluster.gpu.hbm_GBps:.1f} GB/s, per-op overhead {cluster.gpu.launch_s * 1e6:.1f} us")
        if args.plot:
            say(f"wrote {args.plot}")
    else:
        say(f"compute: {cluster.gpu.tflops * 1e3:.1f} GFLOP/s matmul, {cluster.gpu.hbm_GBps:.1f} GB/s copy per rank")
    say(f"interference: compute x {cluster.interference:.3f} while an all_reduce is in flight")
    say(f"comm_interference: all_reduce x {cluster.comm_interference:.3f} while every rank computes")
    if after:
        say(f"after: {after.line()}", indent="  ")
    for line in verdict_lines(verdict, "calibration"):
        say(line, indent="    ")
    say(f"wrote {args.out} (cpu_cores {cluster.cpu_cores}: the cores left to the ranks)")
    return exit_code(verdict, args.strict)


def mark_untrustworthy(path: str, verdict: dict) -> None:
    """Put the verdict's reasons at the top of the cluster file (YAML comments; the file still loads)."""
    from distlab.runtime.measure.trust import verdict_lines
    from distlab.sim.io import write_atomic
    with open(path) as f:
        text = f.read()
    head = "".join(f"# {line.strip()}\n" for line in verdict_lines(verdict, "calibration")
                   if not line.strip().startswith("re-run"))
    write_atomic(path, head + text)
