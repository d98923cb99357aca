"""`distlab collective`: simulate one collective, or sweep sizes like nccl-tests."""
from __future__ import annotations

from distlab.sim.cli import print_json, print_table, progress
from distlab.sim.cluster import PRESETS
from distlab.sim.errors import ConfigError
from distlab.sim.plan import ALGORITHMS, COLLECTIVES, format_bytes

NAME = "collective"
HELP = "Simulate a collective on a cluster: time, algbw and busbw (nccl-tests definitions)."


def add_arguments(p) -> None:
    p.add_argument("op", choices=COLLECTIVES, help="the collective")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--size", default="256MiB", help="message size, e.g. 8B, 64KiB, 256MiB, 1GiB (default 256MiB)")
    size.add_argument("--sizes", help="a sweep: LO:HI in x2 steps (LO:HI:F for xF), or a list 1MiB,4MiB")
    p.add_argument("--cluster", default="dgx-h100",
                   help=f"a preset ({', '.join(PRESETS)}) or a cluster .yaml")
    p.add_argument("--nodes", type=int, help="number of nodes (default: the cluster's)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs (ranks) per node (default: the cluster's)")
    p.add_argument("--algo", default="auto", choices=ALGORITHMS, help="algorithm (default auto: the fastest)")
    p.add_argument("--proto", default="auto", help="NCCL protocol: LL, LL128, Simple (default auto: the fastest; "
                   "NCCL_PROTO and NCCL_ALGO in the environment limit auto as they limit NCCL)")
    p.add_argument("--root", type=int, default=0, help="root rank of broadcast and reduce (default 0)")
    p.add_argument("--trace", metavar="OUT.json", help="write a Chrome trace (Perfetto) of every transfer")
    p.add_argument("--plot", metavar="OUT.png", help="save busbw against size")
    p.add_argument("--timeline", metavar="OUT.png", help="save a figure of every transfer (one --size only)")
    p.add_argument("--json", action="store_true", help="print results as JSON")


def run(args) -> int:
    from dataclasses import replace

    from distlab.sim.cluster import _validated, load_cluster
    from distlab.sim.collectives import metrics
    from distlab.sim.engine import simulate_collective
    from distlab.sim.io import parse_size, parse_size_range

    from distlab.sim.collectives.protocols import check_protocol
    check_protocol(args.proto, "--proto")
    sizes = parse_size_range(args.sizes) if args.sizes else [parse_size(args.size, "--size")]
    for flag, value in (("--trace", args.trace), ("--timeline", args.timeline)):
        if value and len(sizes) > 1:
            raise ConfigError(f"{flag} shows one collective; use it with --size, not --sizes", flag)
    if args.nodes is not None and args.nodes < 1:
        raise ConfigError(f"{args.nodes} must be a whole number >= 1", "--nodes")
    cluster = load_cluster(args.cluster, args.nodes)
    if args.gpus_per_node is not None:
        cluster = _validated(replace(cluster, gpus_per_node=args.gpus_per_node), "--gpus-per-node")
    n = cluster.world_size
    if args.op in ("broadcast", "reduce") and not 0 <= args.root < n:
        raise ConfigError(f"root {args.root} is outside the world (0..{n - 1})", "--root")
    record = bool(args.trace or args.timeline)
    if record and n * n * 2 * n > 5e7:
        raise ConfigError(f"a transfer trace of {n} ranks would be too large; use fewer nodes", "--trace")

    rows, trace = [], None
    for size in progress(sizes, len(sizes), f"{args.op} sweep", enabled=len(sizes) > 4):
        trace, algorithm = simulate_collective(args.op, size, cluster, args.algo, args.root,
                                               record_transfers=record, protocol=args.proto)
        protocol = ",".join(trace.meta["protocols"]) or "-"
        rows.append({"op": args.op, "algorithm": algorithm, "protocol": protocol, "world_size": n,
                     "nodes": cluster.nodes,
                     "cluster": cluster.name, "bytes": size, **metrics(args.op, n, size, trace.makespan)})

    if args.trace:
        trace.save(args.trace)
    if args.plot:
        plot_busbw(rows, args.plot)
    if args.timeline:
        from distlab.sim.io import save_figure
        from distlab.sim.plots import transfers_timeline
        r = rows[0]
        save_figure(transfers_timeline(trace, title=f"{args.op} {format_bytes(r['bytes'])}, {r['algorithm']}, "
                                                    f"{n} ranks on {cluster.name}"), args.timeline)
    if args.json:
        print_json(rows if args.sizes else rows[0])
        return 0
    title = f"{args.op} on {cluster.name}: {n} ranks ({cluster.nodes} x {cluster.gpus_per_node})"
    print_table(title, ["size", "algorithm", "protocol", "time (us)", "algbw (GB/s)", "busbw (GB/s)"],
                [[format_bytes(r["bytes"]), r["algorithm"], r["protocol"], f"{r['time_s'] * 1e6:.2f}",
                  f"{r['algbw_GBps']:.2f}", f"{r['busbw_GBps']:.2f}"] for r in rows], justify_left=3)
    for path in (args.trace, args.plot, args.timeline):
        if path:
            print(f"wrote {path}")
    return 0


def plot_busbw(rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from distlab.sim.io import save_figure
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["bytes"] for r in rows], [r["busbw_GBps"] for r in rows], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    r = rows[0]
    ax.set_title(f"{r['op']} on {r['cluster']}, {r['world_size']} ranks")
    ax.grid(True, alpha=0.3)
    save_figure(fig, path)
    plt.close(fig)
