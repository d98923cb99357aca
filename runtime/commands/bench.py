"""`distlab bench`: an nccl-tests-style sweep of real collectives on local ranks (time, algbw, busbw)."""
from __future__ import annotations

import json
import sys

from distlab.runtime.commands.common import add_launch_arguments, launch_kwargs, parse_nproc, parse_ops, positive_int

NAME = "bench"
HELP = "Measure real collectives on local ranks like nccl-tests: slowest rank's median time, algbw, busbw."


def add_arguments(p) -> None:
    p.epilog = ("'from launch' = from the last rank's arrival to the last rank's end, what the simulator's "
                "collective time means (runtime/sweep.py).")
    p.add_argument("--ops", default="all_reduce", help="comma-separated collectives, or all (default all_reduce)")
    p.add_argument("--sizes", default="1MiB:64MiB", help="LO:HI in x2 steps (LO:HI:F for xF), or a list "
                                                        "1MiB,4MiB (default 1MiB:64MiB)")
    p.add_argument("--dtype", default="float32", help="element type (default float32)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per size (default 2)")
    p.add_argument("--iters", type=int, default=10, help="timed calls per size; the median is reported (default 10)")
    add_launch_arguments(p, "number of local ranks (default 2)", "2")
    p.add_argument("--out", metavar="RESULTS.json", help="also write the rows here (kept if the run fails)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="save busbw against size")


def run(args) -> int:
    from distlab.runtime.launch import Launch, RunFailed
    from distlab.sim.cli import print_json, print_table
    from distlab.sim.errors import ConfigError
    from distlab.sim.io import parse_size_range, write_atomic
    from distlab.sim.plan import DTYPE_BYTES, format_bytes

    ops = parse_ops(args.ops)
    sizes = parse_size_range(args.sizes)
    nproc = parse_nproc(args.nproc)
    if args.dtype not in DTYPE_BYTES:
        raise ConfigError(f"unknown dtype {args.dtype!r}; allowed: {', '.join(DTYPE_BYTES)}", "--dtype")
    if args.backend == "gloo":
        from distlab.runtime.collectives import check_backend_dtype
        check_backend_dtype(args.dtype, "gloo", "--dtype")
    if args.warmup < 0:
        raise ConfigError(f"{args.warmup} must be a whole number >= 0", "--warmup")
    positive_int(args.iters, "--iters")
    payload = {"ops": ops, "sizes": sizes, "dtype": args.dtype, "warmup": args.warmup, "iters": args.iters}
    launch = Launch("distlab.runtime.sweep:sweep_task", payload, nproc, **launch_kwargs(args)).start()
    try:
        rows = launch.wait_progress(args.iters, f"bench on {nproc} ranks",
                                    lambda L: (L.partial(0) or {}).get("rounds", 0))[0]["rows"]
        failed = None
    except RunFailed as e:
        rows, failed = (e.partial.get(0) or {}).get("rows", []), e
    if args.out:
        write_atomic(args.out, json.dumps({"complete": failed is None, "rows": rows}, indent=1))
    if args.plot and rows:
        plot_busbw(rows, args.plot)
    if args.json:
        print_json(rows)
    elif rows:
        print_table(f"measured on {nproc} local ranks ({args.dtype}; time = slowest rank, median of {args.iters})",
                    ["op", "size", "time (ms)", "min (ms)", "from launch (ms)", "algbw (GB/s)", "busbw (GB/s)"],
                    [[r["op"], format_bytes(r["bytes"]), f"{r['time_s'] * 1e3:.3f}", f"{r['time_min_s'] * 1e3:.3f}",
                      f"{r['launch_time_s'] * 1e3:.3f}", f"{r['algbw_GBps']:.3f}", f"{r['busbw_GBps']:.3f}"]
                     for r in rows], justify_left=2)
        for path in (args.out, args.plot):
            if path:
                print(f"wrote {path}")
    if failed is not None:
        sys.stderr.write(f"distlab bench: error: {failed}" + (f" ({len(rows)} rows kept)\n" if rows else "\n"))
        return 1
    return 0


def plot_busbw(rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from distlab.sim.io import save_figure
    fig, ax = plt.subplots(figsize=(7, 4))
    for op in dict.fromkeys(r["op"] for r in rows if r["op"] != "barrier"):
        rs = [r for r in rows if r["op"] == op]
        ax.plot([r["bytes"] for r in rs], [r["busbw_GBps"] for r in rs], marker="o", label=op)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    n = rows[0]["world_size"]
    ax.set_title(f"measured busbw, {n} local ranks")
    ax.grid(True, alpha=0.3)
    ax.legend()
    save_figure(fig, path)
    plt.close(fig)
