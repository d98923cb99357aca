"""Predicted vs measured expert-parallel steps on this machine (gloo, CPU ranks).

    python benchmarks/ep_accuracy.py [--ranks 4] [--steps 5] [--tolerance 0.2]

One launch of N ranks (runtime/parallel/ep/validate.py, shared with `distlab validate --scenario` of an ep scenario):
even all_to_all_single calls are timed (fit: α and bandwidth), a probe (the first shape, balanced routing) fits
this CPU's FLOP rate, then each case (MoE shapes x routing skews) runs forward + backward ``--steps`` times:
measured = median over steps of the slowest rank's step; spread = (slowest - fastest step) / median; load = the
token copies each ep rank received (the skew's imbalance). Predicted = the simulated plan (sim/parallel/ep/plan.py) on
the fitted cluster; the prediction never sees the run it predicts. Exit code 1 if an error exceeds --tolerance.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = [dict(kind="moe", name="moe-h256-e8", layers=2, hidden=256, experts=8, top_k=2, expert_ffn=512, seq_len=256,
               attention="none", embed=False, dtype="float32", shared_experts=1),
          dict(kind="moe", name="moe-h128-e16", layers=2, hidden=128, experts=16, top_k=4, expert_ffn=256,
               seq_len=256, attention="none", embed=False, dtype="float32")]
SKEWS = [0.0, 1.0, 2.0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--tolerance", type=float, default=0.2)
    args = ap.parse_args(argv)
    from distlab.runtime.parallel.ep.validate import measure_and_predict
    from distlab.sim.parallel.ep.model import from_spec
    variants = [{"model": from_spec(s), "skew": k} for s in SHAPES for k in SKEWS]
    r = measure_and_predict(variants, args.ranks, steps=args.steps)
    a2a = r["calibration"]["all_to_all"][str(args.ranks)]
    load = r["load"]
    print(f"{args.ranks} gloo ranks; before the launch: load average {load['loadavg_1m'] if load else '?'} on "
          f"{load['cores'] if load else '?'} cores, {r['cores'] or 'a core each'} cores left to the ranks")
    print(f"all_to_all fit: alpha "
          f"{a2a['latency_us']:.0f} us, {a2a['bandwidth_GBps']:.3f} GB/s; FLOP rate {r['flop_rate'] / 1e9:.2f} "
          f"GFLOP/s (probe {r['probe_s'] * 1e3:.1f} ms)")
    print(f"{'case':28} {'predicted ms':>12} {'measured ms':>12} {'error':>7} {'spread':>7}  copies received per rank")
    worst = 0.0
    for row in r["rows"]:
        err = (row["predicted_s"] - row["measured_s"]) / row["measured_s"]
        spread = (max(row["repeats"]) - min(row["repeats"])) / row["measured_s"]
        worst = max(worst, abs(err))
        print(f"{row['what']:28} {row['predicted_s'] * 1e3:12.2f} {row['measured_s'] * 1e3:12.2f} {err:+7.1%} "
              f"{spread:7.1%}  {row['received']}")
    print(f"worst |error| {worst:.1%} (tolerance {args.tolerance:.0%})")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":                # --markdown: also write its section of docs/accuracy.md
    from accuracy_doc import run_main
    sys.exit(run_main("ep_accuracy", main))
