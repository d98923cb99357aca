"""`distlab bench`: an nccl-tests-style sweep of real collectives on local ranks (time, algbw, busbw).

The table has nccl-tests' columns (size, count, type, redop, root, time, algbw, busbw; src/util.cu) and
prints a line as each case's last round ends. ``--json`` follows the layout of nccl-tests' JSON output
(``-J``, version 2: a "config" object, a "results" list with one object per size, the average bus bandwidth,
"errors") in distlab's key conventions (units in key names): see README "JSON output".
"""
from __future__ import annotations

import json
import sys

from distlab.runtime.commands.common import (add_launch_arguments, check_launch, check_sweep_memory, launch_kwargs,
                                             parse_ops, positive_int)

NAME = "bench"
HELP = "Measure real collectives on local ranks like nccl-tests: slowest rank's median time, algbw, busbw."
IN_PLACE = ("all_reduce", "broadcast", "reduce")          # runtime/measure/sweep.py: one buffer for these


def add_arguments(p) -> None:
    p.epilog = ("time = the slowest rank's start-to-end, median over --iters rounds; min/max = the fastest and "
                "slowest round; 'from launch' = from the last rank's arrival to the last rank's end, what the "
                "simulator's collective time means (runtime/measure/sweep.py).")
    p.add_argument("--ops", default="all_reduce", help="comma-separated collectives, or all (default all_reduce)")
    p.add_argument("--sizes", default="1MiB:64MiB", help="LO:HI in x2 steps (LO:HI:F for xF), or a list "
                                                        "1MiB,4MiB (default 1MiB:64MiB)")
    p.add_argument("--dtype", default="float32", help="element type (default float32)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per size (default 2)")
    p.add_argument("--iters", type=int, default=10, help="timed calls per size; the median is reported (default 10)")
    add_launch_arguments(p, "number of local ranks (default 2; under torchrun: its WORLD_SIZE)")
    p.add_argument("--out", metavar="RESULTS.json", help="also write the --json object here (kept if the run fails)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="save busbw against size, error bars from the repeats")
    p.add_argument("--strict", action="store_true", help="exit 1 when the result is not trustworthy (other "
                   "processes took cores, or a size's median moves over 25%% by chance; runtime/measure/trust.py)")
    from distlab.sim.cli import add_output_arguments
    add_output_arguments(p, verbose=False)


def result_row(row: dict) -> dict:
    """A sweep row (runtime/measure/sweep.py) with nccl-tests' fields (sim.cli.nccl_fields) and in_place."""
    from distlab.sim.cli import nccl_fields
    return {"op": row["op"], **nccl_fields(row["op"], row["bytes"], row["dtype"]),
            "in_place": row["op"] in IN_PLACE, **{k: v for k, v in row.items() if k not in ("op", "bytes", "dtype")}}


def report(rows: list[dict], args, nproc: int, sizes: list[int], backend, error) -> dict:
    """The --json / --out object."""
    bw = [r["busbw_GBps"] for r in rows if r["op"] != "barrier"]
    return {"world_size": nproc, "backend": backend, "dtype": args.dtype, "complete": error is None,
            "config": {"ops": parse_ops(args.ops), "min_bytes": min(sizes), "max_bytes": max(sizes),
                       "sizes_bytes": sizes, "warmup_iters": args.warmup, "iterations": args.iters},
            "results": rows, "average_busbw_GBps": sum(bw) / len(bw) if bw else None,
            "errors": [] if error is None else [str(error)]}


def run(args) -> int:
    from distlab.runtime.ranks.launch import RunFailed
    from distlab.runtime.ranks.torchrun_rank import local_ranks, new_launch, one_world_size
    from distlab.sim.cli import BW_COLUMNS, NCCL_COLUMNS, RowPrinter, nccl_cells, print_json, progress, with_schema
    from distlab.sim.errors import ConfigError
    from distlab.sim.io import check_outputs, parse_size_range, write_atomic
    from distlab.sim.plan import DTYPE_BYTES

    ops = parse_ops(args.ops)
    nproc = one_world_size(args.nproc, "2")
    if args.dtype not in DTYPE_BYTES:
        raise ConfigError(f"unknown dtype {args.dtype!r}; allowed: {', '.join(DTYPE_BYTES)}", "--dtype")
    sizes = parse_size_range(args.sizes, "--sizes", args.dtype)
    if args.backend == "gloo":
        from distlab.runtime.execute.collectives import check_backend_dtype
        check_backend_dtype(args.dtype, "gloo", "--dtype")
    if args.warmup < 0:
        raise ConfigError(f"{args.warmup} must be a whole number >= 0", "--warmup")
    positive_int(args.iters, "--iters")
    check_launch(args, local_ranks(nproc))     # ranks, threads, timeout, memory: before anything starts
    check_sweep_memory(ops, sizes, args.dtype, nproc, local_ranks(nproc))
    check_outputs((args.out, "--out", "file"), (args.plot, "--plot", "figure"))
    if args.backend == "nccl":            # before the table's header: a refusal is the only line printed
        from distlab.runtime.ranks.preflight import check_nccl
        check_nccl(local_ranks(nproc))
    from distlab.sim.cli import STYLE
    extra = [("min", "(us)", 9), ("max", "(us)", 9), ("launch", "(us)", 9)] if STYLE.wide else []
    printer = None if args.json else RowPrinter([("op", "", 14)] + NCCL_COLUMNS + BW_COLUMNS + [("spread", "", 6)]
                                                + extra)
    if printer:
        printer.comment(f"bench: {nproc} ranks, {args.dtype}, warmup {args.warmup}, iters {args.iters}; time = "
                        "slowest rank,")
        printer.comment("median of the iters; spread = (slowest - fastest iter) / median"
                        + ("; launch = from the last rank's arrival" if STYLE.wide else " (--wide: min, max, launch)"))
        printer.header()
    shown = []

    def show(rows):
        for row in rows[len(shown):]:
            shown.append(result_row(row))
            if printer:
                r = shown[-1]
                spread = (r["time_max_s"] - r["time_min_s"]) / r["time_s"] if r["time_s"] else 0.0
                printer.row([r["op"]] + nccl_cells(r) + [f"{spread:.0%}"] + [
                    f"{r[k] * 1e6:.2f}" for k in ("time_min_s", "time_max_s", "launch_time_s")][:len(extra)])

    payload = {"ops": ops, "sizes": sizes, "dtype": args.dtype, "warmup": args.warmup, "iters": args.iters}
    from distlab.runtime.measure import load as machine_load
    from distlab.runtime.measure.trust import Watch, exit_code, judge, verdict_lines
    before = machine_load.sample()        # before the ranks start, then during the whole sweep (runtime/measure/trust.py)
    watch = Watch()
    launch = new_launch("distlab.runtime.measure.sweep:sweep_task", payload, nproc, **launch_kwargs(args)).start()

    def rounds():                     # one tick per finished round, printing each final row as it comes
        done = 0
        for _ in launch.polls():
            part = launch.partial(0) or {}
            show(part.get("final", []))
            while done < min(args.iters, part.get("rounds", 0)):
                done += 1
                yield
    failed, backend = None, None
    try:
        for _ in progress(rounds(), args.iters, f"bench on {nproc} ranks"):
            pass
        result = launch.finish()[0]
        show(result["rows"])
        backend = result.get("backend")
    except RunFailed as e:
        show((e.partial.get(0) or {}).get("final", []))
        failed = e
    except BaseException:
        launch.abort()
        raise
    from distlab.runtime.measure.robust import median_noise
    cases = [{"kind": "bench", "case": f"{r['op']} {r['bytes']} B", "world_size": nproc,
              "spread": (r["time_max_s"] - r["time_min_s"]) / r["time_s"],
              "noise": median_noise(r["times_s"])} for r in shown if r["time_s"] and len(r.get("times_s", [])) >= 3]
    verdict = judge(before, watch.stop(), cases)
    obj = {**report(shown, args, nproc, sizes, backend, failed), "trust": verdict}
    if args.out:
        write_atomic(args.out, json.dumps(with_schema(obj, NAME), indent=1))
    if args.plot and shown:
        from distlab.sim.io import save_figure
        from distlab.sim.plots import busbw_figure
        save_figure(busbw_figure(shown, f"measured busbw, {nproc} ranks ({args.dtype}, median of "
                                        f"{args.iters}; bars: fastest to slowest)"), args.plot)
    if args.json:
        print_json(obj)
    elif shown:
        if obj["average_busbw_GBps"] is not None:
            printer.comment(f"Avg bus bandwidth    : {obj['average_busbw_GBps']:.3f} GB/s")
        for line in verdict_lines(verdict, "benchmark"):      # comments, as every line but a row in nccl-tests
            printer.comment(line.strip())
        for path in (args.out, args.plot):
            if path:
                print(f"wrote {path}")
    if failed is not None:
        sys.stderr.write(f"distlab bench: error: {failed}" + (f" ({len(shown)} rows kept)\n" if shown else "\n"))
        return 1
    return exit_code(verdict, args.strict)
