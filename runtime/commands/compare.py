"""`distlab compare PREDICTED MEASURED`: a simulated and a measured trace of the same plan, op by op (sim/compare.py).

PREDICTED: e.g. the trace `distlab simulate` writes, or the plan itself (simulated on ``--cluster``, e.g. the
file `distlab calibrate` writes); MEASURED: the trace `distlab run PLAN` writes. Prints per
rank every op's predicted and measured start and duration with the error, the totals (makespan, each stream's
busy time) and the worst ops; ``--out both.json`` writes both into one Perfetto/Chrome trace.
"""
from __future__ import annotations

NAME = "compare"
CALIBRATE_HINT = ("calibrate this machine first, then predict on its cluster file: distlab calibrate --out "
                  "my.yaml && distlab compare {predicted} {measured} --cluster my.yaml")
HELP = ("Compare a predicted (simulated) and a measured trace of the same plan op by op: start, duration, error "
        "per rank, totals, worst ops; --out writes both into one Perfetto trace.")


def add_arguments(p) -> None:
    p.add_argument("predicted", help="the simulated trace (*.trace native, or the *.json Chrome trace distlab "
                                     "writes), or the plan itself (distlab-plan/1), simulated here on --cluster")
    p.add_argument("measured", help="the measured trace of the same plan (distlab run's --out), or a folder of "
                   "torch.profiler traces of the real job (one .json or .json.gz per rank; then PREDICTED may be "
                   "a scenario .yaml too)")
    p.add_argument("--out", metavar="BOTH.json", help="write both into one Chrome/Perfetto trace (one process per "
                                                     "rank, predicted and measured threads side by side)")
    p.add_argument("--cluster", default="localhost-cpu", help="where a PREDICTED plan is simulated: a preset or a "
                   "cluster YAML, e.g. distlab calibrate's (default localhost-cpu)")
    p.add_argument("--step", type=int, default=0, help="with a torch.profiler folder as MEASURED: which profiled "
                   "step (default 0, the first complete one; sim/ingest/versus.py)")
    p.add_argument("--worst", type=int, default=5, help="how many of the worst ops to list (default 5)")
    p.add_argument("--json", action="store_true", help="print every op, the totals and the worst ops as JSON")
    from distlab.sim.cli import add_output_arguments
    add_output_arguments(p, verbose=True)


def run(args) -> int:
    import json

    from distlab.runtime.commands.common import positive_int
    from distlab.sim.cli import LONG_TABLE, STYLE, note, print_json, print_table, say
    from distlab.sim.compare import combined_chrome, compare, load_trace
    from distlab.sim.errors import ConfigError
    from distlab.sim.io import write_atomic

    positive_int(args.worst, "--worst")
    if _is_profile(args.measured):               # torch.profiler traces of a real job: sim/ingest/versus.py
        from distlab.sim.ingest.versus import run as against_profile
        if args.step < 0:
            raise ConfigError(f"{args.step} must be a whole number >= 0", "--step")
        return against_profile(args)
    if args.out is not None and not args.out.endswith(".json"):
        raise ConfigError(f"{args.out!r}: the combined trace is Chrome trace JSON; allowed: a *.json path", "--out")
    predicted = load_trace(args.predicted, args.cluster)
    measured = load_trace(args.measured)
    c = compare(predicted, measured, args.measured)
    if args.out:
        write_atomic(args.out, json.dumps(combined_chrome(c), separators=(",", ":")))
    result = c.to_dict(args.worst)
    header = scenario_header(predicted, measured)
    uncalibrated = uncalibrated_preset(predicted)
    hint = (f"predicted on the {uncalibrated} preset, never calibrated on this machine: its numbers are a "
            "generic machine's, so the error measures the preset, not the model; "
            + CALIBRATE_HINT.format(predicted=args.predicted, measured=args.measured)) if uncalibrated else None
    if args.json:
        print_json({**result, "predicted": args.predicted, "measured": args.measured, "out": args.out,
                    "cluster": predicted.meta.get("cluster"), "calibrated": uncalibrated is None, "hint": hint,
                    **({"scenario": header["scenario"]} if header else {})})
        return 0
    ms = _ms
    if header:
        say(f"scenario: {header['label']}")
    if STYLE.verbose:                     # every op of every rank: grows with the plan and the world
        for rank in sorted({p.measured.rank for p in c.pairs}):
            print_table(f"rank {rank}: predicted ({args.predicted}) against measured ({args.measured})",
                        ["op", "name", "stream", "start pred (ms)", "start meas (ms)", "dur pred (ms)",
                         "dur meas (ms)", "error"],
                        [[p.measured.index, p.measured.name, p.measured.stream, ms(p.predicted.start),
                          ms(p.measured.start), ms(p.predicted.duration), ms(p.measured.duration), _pct(p.error)]
                         for p in c.pairs if p.measured.rank == rank], justify_left=3)
    totals = result["totals"]
    rows = [["makespan", "", ms(totals["makespan"]["predicted_s"]), ms(totals["makespan"]["measured_s"]),
             _pct(totals["makespan"]["error"])]]
    rows += [[f"rank {s['rank']}", f"{s['stream']} busy", ms(s["predicted_busy_s"]), ms(s["measured_busy_s"]),
              _pct(s["error"])] for s in totals["streams"]]
    print_table(f"totals: predicted ({args.predicted}) against measured ({args.measured})",
                ["", "", "predicted (ms)", "measured (ms)", "error"], rows, justify_left=2, max_rows=LONG_TABLE)
    print_table(f"worst {len(result['worst'])} ops (largest |predicted - measured| duration)",
                ["rank", "op", "name", "dur pred (ms)", "dur meas (ms)", "diff (ms)", "error"],
                [[w["rank"], w["index"], w["name"], ms(w["predicted_duration_s"]), ms(w["measured_duration_s"]),
                  f"{w['duration_diff_s'] * 1e3:+.3f}", _pct(w["error"])] for w in result["worst"]], justify_left=3)
    if not STYLE.verbose:
        note(f"{len(c.pairs)} ops compared; --verbose prints each, rank by rank")
    if c.missing:
        say(f"{len(c.missing)} predicted ops are not in the measured trace (a partial run?)")
    if hint:
        say(f"warning: {hint}", indent="  ")
    if args.out:
        say(f"wrote {args.out}")
    return 0


def scenario_header(*traces) -> dict | None:
    """The scenario the plan was built from (sim/scenario/header.py), checked: a PREDICTED plan file's header, or
    the one `distlab run` keeps in its trace's meta; None when neither has one."""
    from distlab.sim.scenario.header import describe, from_data
    for t in traces:
        header = t.meta.get("scenario")
        if header is not None:
            return {"label": describe(from_data(header, f"{t.meta.get('plan', 'trace')}: scenario")),
                    "scenario": header}
    return None


def _is_profile(path: str) -> bool:
    """A folder of torch.profiler traces (one per rank) or one gzipped trace, not a trace distlab wrote."""
    import os
    return os.path.isdir(path) or path.endswith(".json.gz")


def uncalibrated_preset(trace) -> str | None:
    """The preset a predicted trace was simulated on, when it is a preset (sim/cluster/presets.py PRESETS: numbers of
    a generic machine, never calibrated here); None for a calibrated cluster file or an unknown one."""
    from distlab.sim.cluster import PRESETS
    name = trace.meta.get("cluster")
    return name if name in PRESETS else None


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _pct(error) -> str:
    return "n/a" if error is None else f"{error * 100:+.1f}%"
