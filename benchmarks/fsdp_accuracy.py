"""Predicted vs measured FSDP2 step time on this machine (gloo, CPU ranks): is the simulator within 25%?

    python benchmarks/fsdp_accuracy.py [--nproc 2] [--layers 4] [--hidden 256] [--seq-len 128] [--batch 2]

One launch of real ``fully_shard`` ranks (runtime/parallel/fsdp/run.py) measures, per variant, the step time (slowest rank,
robust center of --steps, runtime/measure/robust.py, as the calibration; the best is printed too) and every collective. Interleaved with those steps, the same launch
times all_gather / reduce_scatter at the plan's sizes, one unsharded forward+backward, and Adam on plain tensors
the size of a shard. From those the simulator is calibrated (runtime.parallel.fsdp.validate.calibrated_cluster) and
predicts each variant's step from its plan alone. Prints both, the error, where the time went (rank 0: in
collectives, in the optimizer, the rest), and whether the collective sequences match. Exit 1 if any error
exceeds --tolerance (default 25%). The machine's load (runtime/measure/load.py) is printed at calibration and at the end;
--background-load 0.5 runs one process busy half of a core meanwhile.
"""
from __future__ import annotations

import argparse
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--vocab", type=int, default=2001)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--tolerance", type=float, default=25.0, help="allowed |error| in percent")
    p.add_argument("--save", metavar="PATH", help="write the ranks' raw results (JSON) there")
    p.add_argument("--background-load", type=float, default=0.0, metavar="DUTY",
                   help="run one busy process at DUTY of a core (0.5: half) during the benchmark (runtime/measure/load.py)")
    args = p.parse_args(argv)
    from distlab.runtime.measure.load import BackgroundLoad
    with BackgroundLoad(args.background_load) as gen:
        return _main(args, gen.pids)


def _main(args, load_pids) -> int:
    from distlab.runtime.measure import load as machine_load

    from distlab.runtime.parallel.fsdp import run as fsdp
    from distlab.runtime.parallel.fsdp import validate as fsdp_validate
    from distlab.sim.parallel.fsdp.plan import build_fsdp, collective_sequence
    from distlab.sim.models import gpt
    model = gpt(layers=args.layers, hidden=args.hidden, heads=args.heads, seq_len=args.seq_len, vocab=args.vocab,
                micro_batch=args.batch, dtype="float32", arch="llama", name="bench-llama")
    variants = [{}, {"reshard_after_forward": False}]
    sizes = fsdp_validate.calibration_sizes([build_fsdp(model, args.nproc, v) for v in variants])
    load = machine_load.sample(count_pids=load_pids)
    print(f"{model.summary()}; at calibration: {load.line() if load else 'load unknown'}")
    t = time.time()
    results = fsdp.run(model, args.nproc, variants, steps=args.steps, warmup=2, calibrate=sizes, local=True,
                       timeout=600)
    print(f"measured in {time.time() - t:.1f} s on {args.nproc} gloo ranks")
    if args.save:
        import json
        with open(args.save, "w") as f:
            json.dump(results, f)
    cluster = fsdp_validate.calibrated_cluster(results, model, args.nproc)
    cal = cluster.calibration["collectives"]
    fit = {op: v[str(args.nproc)] for op, v in cal.items()}
    print(f"calibrated: compute {cluster.gpu.tflops * 1e3:.2f} GFLOP/s, memory {cluster.gpu.hbm_GBps:.2f} GB/s, "
          + ", ".join(f"{op} α {f['latency_us']:.0f} us B {f['bandwidth_GBps']:.2f} GB/s" for op, f in fit.items()))
    worst = 0.0
    print(f"{'variant':38s} {'measured ms':>12s} {'(best)':>9s} {'predicted ms':>13s} {'error':>8s}  sequence")
    for i, v in enumerate(variants):
        measured = fsdp_validate.measured_step(results, i)
        predicted, parts = fsdp_validate.predict(model, args.nproc, v, cluster, parts=True)
        got = fsdp_validate.measured_parts(results, i)
        err = 100.0 * (predicted / measured - 1)
        worst = max(worst, abs(err))
        match = fsdp.measured_sequence(results, i) == collective_sequence(build_fsdp(model, args.nproc, v))
        median = fsdp_validate.measured_step(results, i, min)
        print(f"{str(v or 'default'):38s} {measured * 1e3:12.2f} {median * 1e3:9.2f} {predicted * 1e3:13.2f} "
              f"{err:+7.1f}%  {'match' if match else 'DIFFERS'}")
        print("    rank 0, measured / predicted ms: " + ", ".join(
            f"{k} {got[k] * 1e3:.1f} / {parts[k] * 1e3:.1f}" for k in ("comm", "optimizer", "other")))
    after = machine_load.sample(count_pids=load_pids)
    print(f"worst |error| {worst:.1f}% (tolerance {args.tolerance:g}%); at the end: "
          f"{after.line() if after else 'load unknown'}")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":                # --markdown: also write its section of docs/accuracy.md
    from accuracy_doc import run_main
    sys.exit(run_main("fsdp_accuracy", main))
