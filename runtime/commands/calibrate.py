"""`distlab calibrate`: measure this machine's collectives and compute, write a cluster YAML the simulator loads.

Per world size (one launch each): a size sweep of every op (runtime/sweep.py), the ring model fitted to the
median times from launch (last rank's arrival to last rank's end, what the simulator's collective time means;
runtime/fit.py), and matmul FLOP/s with all ranks computing at once. The YAML is the
localhost-cpu preset sized to the largest world size, with ``gpu`` = the measured compute (at the largest world
size) and ``calibration.collectives`` = the fits. It is rewritten (atomically) after each world size.
"""
from __future__ import annotations

import socket
import sys
import time

from distlab.runtime.commands.common import add_launch_arguments, launch_kwargs, parse_nprocs, parse_ops, positive_int

NAME = "calibrate"
HELP = "Fit latency and bandwidth of real collectives per world size, and compute speed; write a cluster YAML."
DEFAULT_OPS = "all_reduce,all_gather,reduce_scatter,broadcast,reduce,all_to_all"


def add_arguments(p) -> None:
    p.add_argument("--ops", default=DEFAULT_OPS, help=f"collectives to fit (default {DEFAULT_OPS})")
    p.add_argument("--sizes", default="256KiB:64MiB:4", help="sweep sizes (default 256KiB:64MiB:4)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per size (default 2)")
    p.add_argument("--iters", type=int, default=7, help="timed calls per size (default 7)")
    add_launch_arguments(p, "world sizes to calibrate, e.g. 2,4 (default 2,4)", "2,4")
    p.add_argument("--out", default="localhost-calibrated.yaml", help="cluster YAML to write")
    p.add_argument("--json", action="store_true", help="print the fits and compute as JSON")


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
    nprocs = parse_nprocs(args.nproc)
    if min(nprocs) < 2:
        raise ConfigError("collectives need at least 2 ranks", "--nproc")
    return ops, sizes, sorted(set(nprocs))


def measure(ops, sizes, n, args, plan_payload=None, label="calibrate"):
    """One launch at ``n`` ranks: the sweep rows, compute rates, and (if given) a plan's results."""
    from distlab.runtime.launch import Launch
    payload = {"ops": ops, "sizes": sizes, "warmup": args.warmup, "iters": args.iters, "compute": True,
               "plan": plan_payload}
    launch = Launch("distlab.runtime.sweep:sweep_task", payload, n, **launch_kwargs(args)).start()
    return launch.wait_progress(args.iters, f"{label}: {n} ranks",
                                lambda L: (L.partial(0) or {}).get("rounds", 0))


def write_cluster(path, rows, compute, nprocs, backend, sizes) -> object:
    from distlab.runtime.fit import calibrated_cluster, calibration_from_rows
    from distlab.sim.io import write_atomic
    from distlab.sim.plan import format_bytes
    calibration = calibration_from_rows(rows)
    cluster = calibrated_cluster(calibration, compute, max(nprocs), backend)
    head = (f"# written by distlab calibrate on {socket.gethostname()} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
            f"# backend {backend}, world sizes {','.join(map(str, nprocs))}, sizes {format_bytes(min(sizes))}.."
            f"{format_bytes(max(sizes))}; gpu = CPU matmul/copy speed per rank with {max(nprocs)} ranks running\n")
    write_atomic(path, head + cluster.to_yaml())
    return cluster


def run(args) -> int:
    from distlab.runtime.launch import RunFailed
    from distlab.sim.cli import print_json, print_table
    from distlab.sim.plan import format_bytes

    ops, sizes, nprocs = check(args)
    from distlab.sim.io import check_output
    check_output(args.out, "--out", "file")     # before the ranks start
    rows, compute, backend, done = [], None, "gloo", []
    for n in nprocs:
        try:
            result = measure(ops, sizes, n, args)[0]
        except RunFailed as e:
            if done:
                write_cluster(args.out, rows, compute, done, backend, sizes)
                sys.stderr.write(f"distlab calibrate: kept world sizes {done} in {args.out}\n")
            sys.stderr.write(f"distlab calibrate: error: {e}\n")
            return 1
        rows += result["rows"]
        compute = result["compute"]
        backend = "nccl" if compute["matmul_dtype"] == "bfloat16" else "gloo"
        done.append(n)
        cluster = write_cluster(args.out, rows, compute, done, backend, sizes)
    table = cluster.calibration["collectives"]
    if args.json:
        print_json({"cluster": args.out, "calibration": cluster.calibration, "gpu": cluster.gpu.__dict__,
                    "rows": rows})
        return 0
    print_table(f"ring-model fit per op and world size ({format_bytes(min(sizes))}..{format_bytes(max(sizes))})",
                ["op", "ranks", "latency (us)", "bandwidth (GB/s)"],
                [[op, n, f"{v['latency_us']:.1f}", f"{v['bandwidth_GBps']:.3f}"]
                 for op, per_n in table.items() for n, v in per_n.items()], justify_left=2)
    print(f"compute: {cluster.gpu.tflops * 1e3:.1f} GFLOP/s matmul, {cluster.gpu.hbm_GBps:.1f} GB/s copy per rank")
    print(f"wrote {args.out}")
    return 0
