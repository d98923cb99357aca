"""`distlab validate`: calibrate on some sizes, then predict held-out cases and measure them (runtime/measure/validation.py)."""
from __future__ import annotations

import json
import sys

from distlab.runtime.commands.common import add_launch_arguments, launch_kwargs, parse_nprocs, parse_ops, positive_int

NAME = "validate"
HELP = "Calibrate, then compare simulated and measured times on held-out sizes, world sizes and an overlap plan."
DEFAULT_OPS = "all_reduce,all_gather,reduce_scatter,broadcast,all_to_all"
OVERLAP_REPEATS = 15           # timed runs of the overlap plan; its error is that of their median
OVERLAP_WARMUP = 2             # untimed runs before them
PROBE_ROUNDS = 1               # interference probe rounds before each run (runtime/measure/compute_probe.py): I and K
                               # are the robust centers of OVERLAP_WARMUP + OVERLAP_REPEATS = 17 rounds (their
                               # chance error moves the prediction ~1.5% each; the median of 9 repeats moved
                               # ±3-12% by chance in the runs of docs/calibration.md: more repeats first)


def add_arguments(p) -> None:
    p.add_argument("--ops", default=DEFAULT_OPS, help=f"collectives (default {DEFAULT_OPS})")
    p.add_argument("--calib-sizes", default="512KiB,2MiB,8MiB,32MiB,128MiB",
                   help="sizes the fit sees, around the held-out ones (default 512KiB,2MiB,8MiB,32MiB,128MiB)")
    p.add_argument("--sizes", default="1MiB:64MiB:4", help="held-out sizes (default 1MiB:64MiB:4 = 1, 4, 16, 64 MiB)")
    add_launch_arguments(p, "calibrated world sizes (default 2,4 where the cores allow, else 2; under torchrun: "
                            "its WORLD_SIZE)")
    p.add_argument("--holdout-nproc", help="world sizes measured but not calibrated (default 3, none under "
                                           "torchrun; 'none' for none)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per size (default 2)")
    p.add_argument("--iters", type=int, default=9, help="timed calls per size, interleaved (default 9)")
    p.add_argument("--no-overlap", action="store_true", help="skip the compute/communication overlap plan")
    p.add_argument("--overlap-repeats", type=int, default=OVERLAP_REPEATS, metavar="N",
                   help=f"timed runs of the overlap plan, each after {PROBE_ROUNDS} interference probe round; its "
                        f"error is that of their median (default {OVERLAP_REPEATS}; fewer: faster, but the median "
                        "moves more by chance)")
    p.add_argument("--scenario", metavar="FILE", help="also validate a scenario's plan (a workload of "
                                                      "runtime/parallel/registry.py: ddp, fsdp, pipeline, tp, ep)")
    p.add_argument("--plot", metavar="OUT.png", default="validate.png", help="predicted vs measured (default "
                                                                             "validate.png)")
    p.add_argument("--out", metavar="RESULTS.json", help="write every case here (kept if a run fails)")
    p.add_argument("--json", action="store_true", help="print cases and summary as JSON")
    p.add_argument("--strict", action="store_true", help="exit 1 when the result is not trustworthy (other "
                   "processes took cores, or a case's repeats spread more than its error and tolerance; "
                   "runtime/measure/trust.py)")
    from distlab.sim.cli import add_output_arguments
    add_output_arguments(p, verbose=False)


def run(args) -> int:
    from distlab.runtime.measure.calibration import backend_of, measure
    from distlab.runtime.ranks.launch import RunFailed
    from distlab.runtime.measure.validation import (held_out_cases, overlap_case, overlap_plan, plot, summarize,
                                            summary_noise)
    from distlab.sim.cli import print_json
    from distlab.sim.errors import ConfigError
    from distlab.sim.io import parse_size_range, write_atomic
    from distlab.sim.plan import format_bytes

    ops = parse_ops(args.ops, allow_barrier=False)
    from distlab.sim.io import check_outputs
    check_outputs((args.plot, "--plot", "figure"), (args.out, "--out", "file"))
    calib, held = parse_size_range(args.calib_sizes, "--calib-sizes"), parse_size_range(args.sizes)
    if set(calib) & set(held):
        raise ConfigError(f"{format_bytes(sorted(set(calib) & set(held))[0])} is in both --calib-sizes and "
                          "--sizes; held-out sizes must be new", "--sizes")
    if len(set(calib)) < 2:
        raise ConfigError("a fit needs at least two sizes", "--calib-sizes")
    from distlab.runtime.ranks.torchrun_rank import under_torchrun, world_sizes
    from distlab.runtime.ranks.preflight import default_world_sizes
    nprocs = sorted(set(world_sizes(args.nproc, default_world_sizes(args.threads or 1))))
    holdout = [] if args.holdout_nproc == "none" else parse_nprocs(args.holdout_nproc or "3", "--holdout-nproc")
    if under_torchrun():                # one job, one world size (runtime/ranks/torchrun_rank.py)
        if args.holdout_nproc not in (None, "none"):
            raise ConfigError("torchrun started one world size; held-out world sizes need their own job: "
                              "leave --holdout-nproc out", "--holdout-nproc")
        if args.scenario:
            raise ConfigError("not under torchrun yet: run it on one node with distlab validate", "--scenario")
        holdout = []
    if min(nprocs + holdout) < 2:
        raise ConfigError("collectives need at least 2 ranks", "--nproc")
    positive_int(args.iters, "--iters")
    positive_int(args.overlap_repeats, "--overlap-repeats")
    from distlab.runtime.commands.common import check_launch, check_sweep_memory
    from distlab.runtime.ranks.torchrun_rank import local_ranks
    most = max(nprocs + holdout)
    check_launch(args, local_ranks(most))      # ranks, threads, timeout, memory: before anything starts
    check_sweep_memory(ops, calib + held, "float32", most, local_ranks(most))
    from distlab.runtime.ranks.preflight import check_scenario, warn_cores
    scenario = None
    if args.scenario:                  # parsed and checked once; refused at once when its real ranks cannot fit
        from distlab.sim import scenario as sc                      # in this host's memory
        scenario = sc.from_dict(args.scenario)
        check_scenario(scenario, nprocs[0], path=args.scenario)
    # the user's own world sizes only: the defaults fit the cores (default_world_sizes), and the held-out world
    # size (3) is one rank more than 2 cores on purpose: the calibrated cluster's cpu_cores predicts the sharing
    given = (nprocs if args.nproc is not None else []) + (holdout if args.holdout_nproc is not None else [])
    if not under_torchrun() and given:     # under torchrun each node warns for its own ranks
        warn_cores(max(given), args.threads, "distlab validate")
    from distlab.runtime.measure import load as machine_load
    from distlab.runtime.measure.trust import Watch
    load = machine_load.sample()          # before the ranks start: the other processes' share
    watch = Watch()                       # and during the whole measurement (runtime/measure/trust.py)
    cores = {n: round(load.effective_cores(n), 2) if load else None for n in set(nprocs) | set(holdout)}
    scenario_rows = []
    if args.scenario:                  # fail fast on a scenario this runtime cannot run yet
        from distlab.runtime.parallel.registry import scenario_cases     # imports torch (~3 s of CPU): only for one
        scenario_rows = scenario_cases(args.scenario, args, scenario)

    measured, failed = {}, None
    for n in sorted(set(nprocs) | set(holdout)):
        sizes = sorted(set(held) | (set(calib) if n in nprocs else set()))
        plan = None if args.no_overlap else {"plan": overlap_plan(n).to_dict(), "warmup": OVERLAP_WARMUP,
                                             "repeat": args.overlap_repeats, "probe_rounds": PROBE_ROUNDS}
        try:                          # the plan first, on fresh ranks (runtime/measure/sweep.py sweep_task)
            measured[n] = measure(ops, sizes, n, args.warmup, args.iters, plan, "validate", plan_first=True,
                                  **launch_kwargs(args))
        except RunFailed as e:
            failed = e
            break
        if args.out:
            write_atomic(args.out, json.dumps({"complete": False, "measured": measured}))
    if not measured:
        sys.stderr.write(f"distlab validate: error: {failed}\n")
        return 1
    backend = backend_of(measured[min(measured)][0]["compute"])
    calibration, held_cases = held_out_cases(measured, calib, held, nprocs, backend, cores)
    cases = []
    for n, results in measured.items():
        cases += [c for c in held_cases if c["world_size"] == n]
        if not args.no_overlap:
            plan = overlap_plan(n)
            cases.append(overlap_case(plan, [r["plan"] for r in results], calibration, results[0]["compute"],
                                      backend, cores[n]))
    cases += scenario_rows
    during = watch.stop()
    after = machine_load.sample()
    loads = {"at_calibration": load.to_dict() if load else None, "at_measurement": after.to_dict() if after else None,
             "during": during, "cpu_cores": {str(n): c for n, c in sorted(cores.items())}}   # what the simulator was given
    from distlab.runtime.measure.trust import exit_code, judge
    from distlab.runtime.ranks.preflight import cpu_cores
    verdict = judge(load, during, cases, cores=cpu_cores() if backend == "gloo" else None)
    from distlab.runtime.measure.fit import fit_warnings
    from distlab.sim.output import wrapped
    for w in fit_warnings(calibration):
        sys.stderr.write(wrapped(f"distlab validate: {w}"))
    summary = summarize(cases)
    noise = summary_noise(measured, calib, held, nprocs, backend, cores)    # how far the figure moves by chance
    for s in summary:
        if (s["kind"], s["world_size"]) in noise:
            s["median_abs_error_noise"] = noise[s["kind"], s["world_size"]]
    if args.out:
        write_atomic(args.out, json.dumps({"complete": failed is None, "calibration": calibration, "cases": cases,
                                           "summary": summary, "load": loads, "trust": verdict,
                                           "measured": measured}, indent=1))
    if args.plot and cases:
        plot(cases, args.plot)
    if args.json:
        print_json({"calibration": calibration, "cases": cases, "summary": summary, "load": loads,
                    "trust": verdict})
    else:
        from distlab.runtime.measure.validate_output import print_validation
        print_validation(cases, summary, load, after, verdict, max(nprocs + holdout), nprocs, calib, held)
        for path in (args.plot, args.out):
            if path:
                print(f"wrote {path}")
    if failed is not None:
        sys.stderr.write(f"distlab validate: error: {failed}\n")
        return 1
    return exit_code(verdict, args.strict)
