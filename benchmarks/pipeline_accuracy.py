"""Predicted vs measured pipeline makespans on this machine (gloo, CPU ranks).

    python benchmarks/pipeline_accuracy.py [--ranks 2 4] [--microbatches 8] [--steps 3] [--background-load 0.5]

For each of GPipe, 1F1B, interleaved 1F1B (v=2), ZB-H1 and ZBV, in one launch of N gloo ranks
(runtime/parallel/pipeline/validate.py, shared with `distlab validate --scenario` and lesson 07):
1. Probe: the same schedule and model with N microbatches (2N when --microbatches is N), run for real, its
   steps alternating with those of step 2 (so that both see the same load); before and after them, every rank
   times one block (Linear(width, width) + ReLU) alone: F, B and the split I (input grad) and W (weight grad).
   From the probe: the p2p latency a pipeline sees (its hand-offs), and the runtime's CPU time per action,
   fitted so that the simulated probe lasts as long as the measured one (if it is faster even without overhead,
   the cores it shows instead). A send/recv ping-pong gives the p2p bandwidth.
2. Measure: torch.distributed.pipelining runs the schedule with --microbatches, every action timed; the median
   step makespan of --steps steps is "measured".
3. Predict: sim.pipeline's plan of that configuration: stage costs = blocks x the rank's block costs + the
   overhead per action, on a cluster whose ranks share this machine's cores (processor sharing, sim/kernel/cores.py,
   with the cores fair sharing beside the other processes leaves them: runtime/measure/load.py effective_cores),
   p2p with the probe's latency and the ping-pong's bandwidth. The prediction never sees the run it predicts.
   torch detail modelled: stage 0 has no input gradient, so its I does no matmul and its W runs the full
   backward (PipelineStage.backward_weight_one_chunk).
4. Replay (a check of the schedule and p2p model alone): the same plan with each (stage, kind)'s mean
   measured action time.
Every figure is the median over --repeat launches. Exit code 1 if a prediction is off by more than --tolerance.
The machine's load (runtime/measure/load.py) is printed per launch at calibration and at the end; --background-load 0.5
runs one process busy half a core meanwhile; --raw keeps each launch's measurements.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zbh1", 1), ("zbv", 2)]


def one_launch(n: int, args):
    """One launch of ``n`` ranks: probe, calibrate and run every schedule. Yields (label, (predicted, replay,
    fastest, median step makespans, predicted bubble, measured bubble), note)."""
    from distlab.runtime.parallel.pipeline.validate import measure_runs, predict_runs
    from distlab.sim.parallel.pipeline import metrics as M
    cfgs = [dict(schedule=s, stages=n, microbatches=args.microbatches, virtual_stages=v, width=args.width,
                 rows=args.rows, layers=n * args.blocks_per_rank, steps=args.steps, warmup=1) for s, v in SCHEDULES]
    raw = measure_runs(cfgs, n, timeout=600, count_pids=args.load_pids)
    if args.raw:
        import pickle
        args.launch = getattr(args, "launch", 0) + 1
        with open(f"{args.raw}-{n}-{args.launch}.pkl", "wb") as f:
            pickle.dump(raw, f)
    results = predict_runs(raw)
    r0 = results[0]
    c, q = r0["calibration"][0], r0["p2p"]
    load = r0["load"] or {}
    note = (f"      last launch, at calibration: load average {load.get('loadavg_1m')}, other processes "
            f"{load.get('background_cores')} of {load.get('cores')} cores ({len(load.get('background', []))} busy), "
            f"cpu_cores {r0['cores_load']} for the simulator (runtime/measure/load.py effective_cores); probes (latency, overhead per action): "
            + ", ".join(f"{r['cfg']['schedule']} {r['latency'] * 1e6:.0f}/{r['overhead'] * 1e6:.0f} us"
                         + (f" (cores {r['cores']:g})" if r['cores'] != r['cores_load'] else "")
                         + (f" (fitted {r['overhead_fitted'] * 1e6:.0f}, rejected)" if r['overhead'] != r['overhead_fitted'] else "")
                         for r in results)
            + f"; rank 0, one block alone (gpipe run): F {c['F'] * 1e3:.3f} ms, B {c['B'] * 1e3:.3f}, "
            f"I {c['I'] * 1e3:.3f}, W {c['W'] * 1e3:.3f}; "
            f"p2p one-way {q['small'] * 1e6:.0f} us (4 B), {q['large'] * 1e6:.0f} us ({q['bytes'] // 1024} KiB)")
    for r in results:
        cfg, measured, predicted, replayed, plan = r["cfg"], r["measured"], r["predicted"], r["replayed"], r["plan"]
        mp, mm = M.compute(predicted, plan.meta["pipeline"]), M.compute(measured, plan.meta["pipeline"])
        label = cfg["schedule"] + (f" v={cfg['virtual_stages']}" if cfg["virtual_stages"] > 1 else "")
        yield label, (mp.makespan, replayed.makespan, mm.makespan, statistics.median(measured.meta["step_makespans"]),
                      mp.bubble, mm.bubble), note


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--rows", type=int, default=64, help="rows per microbatch")
    ap.add_argument("--blocks-per-rank", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3, help="launches per rank count; medians are reported")
    ap.add_argument("--tolerance", type=float, default=0.25)
    ap.add_argument("--background-load", type=float, default=0.0, metavar="DUTY",
                    help="run one busy process at DUTY of a core (0.5: half) during the benchmark (runtime/measure/load.py)")
    ap.add_argument("--raw", metavar="PREFIX", help="also pickle each launch's measurements to PREFIX-<ranks>-<k>.pkl "
                    "(runtime.parallel.pipeline.validate.predict_runs predicts from them again)")
    args = ap.parse_args(argv)
    from distlab.runtime.measure.load import BackgroundLoad
    with BackgroundLoad(args.background_load) as gen:
        args.load_pids = gen.pids
        return _main(args)


def _main(args) -> int:
    worst = {"predicted": 0.0, "replay": 0.0}
    print(f"{'ranks':>5} {'schedule':>15} {'predicted':>10} {'replay':>8} {'fastest':>9} {'median':>8} "
          f"{'error':>7} {'replay err':>10} {'bubble pred':>11} {'bubble meas':>11}   (ms)")
    for n in args.ranks:
        rows: dict[str, list[tuple]] = {}
        for _ in range(args.repeat):
            for label, row, note in one_launch(n, args):
                rows.setdefault(label, []).append(row)
        for label, rs in rows.items():
            pred, rep, fast, med, bp, bm = (statistics.median(col) for col in zip(*rs))
            err, rerr = pred / med - 1, rep / med - 1
            worst["predicted"], worst["replay"] = max(worst["predicted"], abs(err)), max(worst["replay"], abs(rerr))
            print(f"{n:>5} {label:>15} {pred * 1e3:>10.2f} {rep * 1e3:>8.2f} {fast * 1e3:>9.2f} {med * 1e3:>8.2f} "
                  f"{err:>+7.1%} {rerr:>+10.1%} {bp:>11.1%} {bm:>11.1%}")
        print(note)
    from distlab.runtime.measure import load as machine_load
    after = machine_load.sample(count_pids=args.load_pids)
    print(f"at the end: {after.line(max(args.ranks)) if after else 'load unknown'}")
    ok = worst["predicted"] <= args.tolerance
    print(f"worst error: predicted {worst['predicted']:.1%}, replay {worst['replay']:.1%} "
          f"(tolerance {args.tolerance:.0%}: {'PASS' if ok else 'FAIL'})")
    return 0 if ok else 1


if __name__ == "__main__":                # --markdown: also write its section of docs/accuracy.md
    from accuracy_doc import run_main
    sys.exit(run_main("pipeline_accuracy", main))
