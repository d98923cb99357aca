"""Predicted vs measured pipeline makespans on this machine (gloo, CPU ranks).

    python benchmarks/pipeline_accuracy.py [--ranks 2 4] [--microbatches 8] [--steps 3]

For each of GPipe, 1F1B, interleaved 1F1B (v=2), ZB-H1 and ZBV, in one launch of N gloo ranks:
1. Calibrate: every rank times one block (Linear(width, width) + ReLU) on a microbatch, F, B and the split I
   (input grad) and W (weight grad), all ranks at once right before the schedule runs (so they share the cores
   as in the run); wall time of 20 back-to-back repeats (runtime.pipeline.calibrate). A send/recv ping-pong between ranks 0 and 1 gives the p2p bandwidth; a probe
   GPipe run (one block per stage) the p2p latency as a pipeline sees it (``p2p_latency``) and the runtime's
   own time per action (``action_overhead``).
2. Measure: torch.distributed.pipelining runs the schedule, every action timed; the median step makespan of
   --steps steps is "measured" (the fastest step is shown too, and is what the bubble column uses).
3. Predict: sim.pipeline's plan of the same configuration, stage costs = blocks x the rank's calibrated block
   costs + the overhead per action, p2p with that latency and bandwidth; the simulator gives the makespan.
   torch detail modelled: stage 0 has no input gradient, so its I does no matmul and its W runs the full
   backward (PipelineStage.backward_weight_one_chunk).
4. Replay (a check of the schedule and p2p model alone): the same plan with each (stage, kind)'s mean
   measured action time.
Every figure is the median over --repeat launches. Exit code 1 if a prediction is off by more than --tolerance.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zbh1", 1), ("zbv", 2)]


def cluster_of(p: int, p2p: dict, latency: float):
    """``p`` CPU ranks joined by a fabric with the given one-way latency and the ping-pong's bandwidth."""
    from sim.cluster import PRESETS, IntraNode
    extra = max(p2p["large"] - p2p["small"], 1e-6)
    return replace(PRESETS["localhost-cpu"], name="localhost-measured", gpus_per_node=p,
                   intra_node=IntraNode("loopback", p2p["bytes"] / extra / 1e9, latency * 1e6))


def p2p_latency(trace) -> float:
    """Mean delay from the end of an action whose output another rank needs to the start of the action that
    needs it, where that action waited for nothing else: the effective one-way p2p latency of a real pipeline
    (gloo's threads hand messages over more slowly than a ping-pong shows; on a loaded machine the mean keeps
    the waits for a core, as the calibration's mean does)."""
    from sim.pipeline.metrics import actions_of
    acts = actions_of(trace)
    end = {(a.stage, a.kind if a.kind == "F" else "B", a.mb): o.end for a, o in acts if a.kind != "W"}
    prev_end, delays = {}, []
    for a, o in acts:
        src = (a.stage - 1, "F", a.mb) if a.kind == "F" else (a.stage + 1, "B", a.mb)
        if a.kind != "W" and src in end and end[src] > prev_end.get(o.rank, 0.0):
            delays.append(o.start - end[src])
        prev_end[o.rank] = o.end
    return statistics.fmean(delays) if delays else 0.0


def action_overhead(trace) -> float:
    """Mean gap between consecutive actions of a rank when the second had nothing to wait for: the
    runtime's own time per action (Python, posting sends and receives, being descheduled)."""
    from sim.pipeline.metrics import actions_of
    acts = actions_of(trace)
    end = {(a.stage, a.kind if a.kind == "F" else "B", a.mb): o.end for a, o in acts if a.kind != "W"}
    prev_end, gaps = {}, []
    for a, o in acts:
        src = (a.stage - 1, "F", a.mb) if a.kind == "F" else (a.stage + 1, "B", a.mb)
        if o.rank in prev_end and end.get(src, 0.0) <= prev_end[o.rank]:
            gaps.append(o.start - prev_end[o.rank])
        prev_end[o.rank] = o.end
    return statistics.fmean(gaps) if gaps else 0.0


def block_seconds(cfg: dict, calib: list[dict], overhead: float = 0.0) -> dict:
    """(stage, kind) -> seconds from per-rank block costs (stage 0: I = 0, W = full backward, as torch), plus
    ``overhead`` per action."""
    from sim.pipeline import schedules as S
    from sim.pipeline.plan import split_layers
    p, v = cfg["stages"], cfg["virtual_stages"]
    placement = S.stage_to_rank(cfg["schedule"], p, v)
    seconds = {}
    for s, r in enumerate(split_layers(cfg["layers"], p * v)):
        c, n = calib[placement[s]], len(r)
        seconds.update({(s, k): n * c[k] for k in "FBIW"})
        if s == 0:
            seconds[s, "I"], seconds[s, "W"] = 0.0, n * c["B"]
    return {k: t + overhead for k, t in seconds.items()}


def replay_seconds(trace) -> dict:
    from sim.pipeline.metrics import actions_of
    times: dict = {}
    for a, o in actions_of(trace):
        times.setdefault((a.stage, a.kind), []).append(o.end - o.start)
    return {k: statistics.fmean(v) for k, v in times.items()}


def simulate_cfg(cfg: dict, seconds: dict, cluster):
    from sim.engine import simulate
    from sim.models import Layer, Model
    from sim.pipeline.plan import PipelineSpec, build_plan
    act = cfg["rows"] * cfg["width"] * 4
    model = Model("blocks", [Layer(f"b{i}", [], fwd_flops=1.0, activation_bytes=act) for i in range(cfg["layers"])])
    full = {(s, k): seconds.get((s, k), 0.0) for s in range(cfg["stages"] * cfg["virtual_stages"]) for k in "FBIW"}
    plan = build_plan(model, PipelineSpec(cfg["schedule"], cfg["stages"], cfg["microbatches"],
                                          cfg["virtual_stages"]), seconds=full)
    return simulate(plan, cluster), plan


def one_launch(n: int, args):
    """One launch of ``n`` ranks: probe, calibrate and run every schedule. Yields (label, (predicted, replay,
    fastest, median step makespans, predicted bubble, measured bubble), note)."""
    from runtime.pipeline import measure
    from sim.pipeline import metrics as M
    probe = dict(schedule="gpipe", stages=n, microbatches=args.microbatches, virtual_stages=1, width=args.width,
                 rows=args.rows, layers=n, steps=args.steps, warmup=1)
    runs = [probe] + [dict(schedule=s, stages=n, microbatches=args.microbatches, virtual_stages=v, width=args.width,
                           rows=args.rows, layers=n * args.blocks_per_rank, steps=args.steps, warmup=1,
                           calibrate=True) for s, v in SCHEDULES]
    res = measure(runs, n, calibrate_shape={"width": args.width, "rows": args.rows}, timeout=600)
    ranks = sorted(res["ranks"], key=lambda r: r["rank"])
    latency, overhead = p2p_latency(res["traces"][0]), action_overhead(res["traces"][0])
    cluster = cluster_of(n, ranks[0]["p2p"], latency)
    c, q = ranks[0]["runs"][1]["calibration"], ranks[0]["p2p"]
    note = (f"      last launch: pipeline p2p latency {latency * 1e6:.0f} us, overhead per action "
            f"{overhead * 1e6:.0f} us; rank 0, one block (gpipe run): "
            f"F {c['F'] * 1e3:.3f} ms, B {c['B'] * 1e3:.3f}, I {c['I'] * 1e3:.3f}, W {c['W'] * 1e3:.3f}; "
            f"p2p one-way {q['small'] * 1e6:.0f} us (4 B), {q['large'] * 1e6:.0f} us ({q['bytes'] // 1024} KiB)")
    for i, (cfg, measured) in enumerate(zip(runs, res["traces"])):
        if i == 0:
            continue
        calib = [r["runs"][i]["calibration"] for r in ranks]
        predicted, plan = simulate_cfg(cfg, block_seconds(cfg, calib, overhead), cluster)
        replayed, _ = simulate_cfg(cfg, replay_seconds(measured), cluster)
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
    args = ap.parse_args(argv)
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
    ok = worst["predicted"] <= args.tolerance
    print(f"worst error: predicted {worst['predicted']:.1%}, replay {worst['replay']:.1%} "
          f"(tolerance {args.tolerance:.0%}: {'PASS' if ok else 'FAIL'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
