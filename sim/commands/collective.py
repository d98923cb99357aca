"""`distlab collective`: simulate one collective, or sweep sizes like nccl-tests."""
from __future__ import annotations

from distlab.sim.cli import BW_COLUMNS, NCCL_COLUMNS, RowPrinter, nccl_cells, nccl_fields, print_json, progress
from distlab.sim.cluster import PRESETS
from distlab.sim.errors import ConfigError
from distlab.sim.plan import ALGORITHMS, COLLECTIVES, DTYPE_BYTES, format_bytes

NAME = "collective"
HELP = "Simulate a collective on a cluster: time, algbw and busbw (nccl-tests definitions and columns)."
ROOTED = ("broadcast", "reduce")

# One collective simulates every rank's flows: on 2 cores about 1.3 ms of CPU and 72 KB per rank per size
# (measured 2026-12-08: 8,192 ranks 10.6 s and 0.59 GB; 16,384 ranks 23 s and 1.18 GB). These caps keep an
# accepted command within 60 s and 1 GB (issue 41: resources bounded before work starts).
MAX_COLLECTIVE_RANKS = 8192
MAX_RANK_SIZES = 32768


def add_arguments(p) -> None:
    p.add_argument("op", choices=COLLECTIVES, help="the collective")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--size", default="256MiB", help="message size, e.g. 8B, 64KiB, 256MiB, 1GiB (default 256MiB)")
    size.add_argument("--sizes", help="a sweep: LO:HI in x2 steps (LO:HI:F for xF), or a list 1MiB,4MiB")
    p.add_argument("--dtype", default="float32", choices=list(DTYPE_BYTES), metavar="DTYPE",
                   help=f"element type ({', '.join(DTYPE_BYTES)}): sizes must be whole numbers of its "
                        "elements (default float32)")
    p.add_argument("--cluster", default="dgx-h100",
                   help=f"a preset ({', '.join(PRESETS)}) or a cluster .yaml")
    p.add_argument("--nodes", type=int, help="number of nodes (default: the cluster's)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs (ranks) per node (default: the cluster's)")
    p.add_argument("--algo", default="auto", choices=ALGORITHMS, help="algorithm (default auto: the fastest)")
    p.add_argument("--proto", default="auto", help="NCCL protocol: LL, LL128, Simple (default auto: the fastest; "
                   "NCCL_PROTO and NCCL_ALGO in the environment limit auto as they limit NCCL)")
    p.add_argument("--root", type=int, help="root rank of broadcast and reduce (default 0; an error for others)")
    p.add_argument("--trace", metavar="OUT.json", help="write a Chrome trace (Perfetto) of every transfer")
    p.add_argument("--plot", metavar="OUT.png", help="save busbw against size")
    p.add_argument("--timeline", metavar="OUT.png", help="save a figure of every transfer (one --size only)")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    from distlab.sim.cli import add_output_arguments
    add_output_arguments(p, verbose=False)


def run(args) -> int:
    from dataclasses import replace

    from distlab.sim.cluster import load_cluster, validated
    from distlab.sim.collectives import metrics
    from distlab.sim.kernel.engine import simulate_collective
    from distlab.sim.io import check_outputs, parse_size, parse_size_range

    from distlab.sim.collectives.protocols import check_protocol
    check_protocol(args.proto, "--proto")
    sizes = (parse_size_range(args.sizes, "--sizes", args.dtype) if args.sizes
             else [parse_size(args.size, "--size", args.dtype)])
    for flag, value in (("--trace", args.trace), ("--timeline", args.timeline)):
        if value and len(sizes) > 1:
            raise ConfigError(f"{flag} shows one collective; use it with --size, not --sizes", flag)
    if args.root is not None and args.op not in ROOTED:
        raise ConfigError(f"{args.op} has no root; --root is for {' and '.join(ROOTED)}", "--root")
    check_outputs((args.trace, "--trace", "trace"), (args.plot, "--plot", "figure"),
                  (args.timeline, "--timeline", "figure"))
    from distlab.sim.cli import check_whole
    if args.nodes is not None:                 # the real bound: the ranks one collective simulates in time
        base = load_cluster(args.cluster)           # a GB200 node is a compute tray (sim/cluster/load.py)
        gpn, unit = base.tray_gpus or base.gpus_per_node, "trays" if base.tray_gpus else "nodes"
        check_whole(args.nodes, "--nodes", 1, max(1, MAX_COLLECTIVE_RANKS // gpn), f"{unit} of {gpn} GPUs")
    cluster = load_cluster(args.cluster, args.nodes)
    if args.gpus_per_node is not None:
        cluster = validated(replace(cluster, gpus_per_node=args.gpus_per_node), "--gpus-per-node")
    n = cluster.world_size
    if n > MAX_COLLECTIVE_RANKS:
        raise ConfigError(f"{n:,} ranks; allowed: at most {MAX_COLLECTIVE_RANKS:,} (~60 s, 1 GB)", "--nodes")
    if n * len(sizes) > MAX_RANK_SIZES:
        raise ConfigError(f"{n:,} ranks x {len(sizes)} sizes; allowed: {MAX_RANK_SIZES:,} rank-sizes (~60 s)",
                          "--sizes")
    root = args.root or 0
    if args.op in ROOTED and not 0 <= root < n:
        raise ConfigError(f"root {root} is outside the world (0..{n - 1})", "--root")
    record = bool(args.trace or args.timeline)
    if record and n * n * 2 * n > 5e7:
        raise ConfigError(f"a transfer trace of {n} ranks would be too large; use fewer nodes", "--trace")

    printer = None if args.json else RowPrinter(NCCL_COLUMNS + [("algorithm", "", 12), ("protocol", "", 8)] + BW_COLUMNS)
    rows, trace = [], None
    for size in progress(sizes, len(sizes), f"{args.op} sweep"):
        trace, algorithm = simulate_collective(args.op, size, cluster, args.algo, root, record_transfers=record,
                                               protocol=args.proto)
        protocol = ",".join(trace.meta.get("protocols", [])) or "-"
        rows.append({"op": args.op, **nccl_fields(args.op, size, args.dtype, root), "algorithm": algorithm,
                     "protocol": protocol, **metrics(args.op, n, size, trace.makespan)})
        if printer and len(rows) == 1:      # after the first size: a refused algorithm prints only its error
            printer.comment(f"{args.op} on {cluster.name}: {n} ranks ({cluster.nodes} x {cluster.gpus_per_node}), "
                            f"algorithm {args.algo}; simulated, from launch to the last end")
            printer.header()
        if printer:
            cells = nccl_cells(rows[-1])
            printer.row(cells[:5] + [algorithm, protocol] + cells[5:])

    if args.trace:
        trace.save(args.trace)
    if args.plot:
        from distlab.sim.io import save_figure
        from distlab.sim.plots import busbw_figure
        save_figure(busbw_figure(rows, f"{args.op} on {cluster.name}, {n} ranks (simulated, {args.dtype})",
                                 auto=args.algo == "auto"), args.plot)
    if args.timeline:
        from distlab.sim.cli import working
        r = rows[0]
        title = f"{args.op} {format_bytes(r['bytes'])}, {r['algorithm']}, {n} ranks on {cluster.name}"
        with working(f"drawing {len(trace.transfers)} transfers"):
            if args.timeline.lower().endswith(".png"):      # Pillow: no matplotlib import (issue 12.6)
                from distlab.sim.timeline_png import save_timeline_png
                save_timeline_png(trace, args.timeline, title)
            else:
                from distlab.sim.io import save_figure
                from distlab.sim.plots import transfers_timeline
                save_figure(transfers_timeline(trace, title=title), args.timeline)
    if args.json:
        print_json({"op": args.op, "cluster": cluster.name, "world_size": n, "nodes": cluster.nodes,
                    "gpus_per_node": cluster.gpus_per_node, "dtype": args.dtype, "algorithm_requested": args.algo,
                    "results": rows, "files": {k: v for k, v in (("trace", args.trace), ("plot", args.plot),
                                                                  ("timeline", args.timeline)) if v}})
        return 0
    if args.algo == "auto" and len({(r["algorithm"], r["protocol"]) for r in rows}) > 1:
        changes = [r for i, r in enumerate(rows) if i == 0 or (r["algorithm"], r["protocol"]) != (rows[i - 1]["algorithm"], rows[i - 1]["protocol"])]
        printer.comment("auto chose: " + ", ".join(f"{r['algorithm']} ({r['protocol']}) from "
                                                   f"{format_bytes(r['bytes'])}" for r in changes))
    for path in (args.trace, args.plot, args.timeline):
        if path:
            print(f"wrote {path}")
    return 0
