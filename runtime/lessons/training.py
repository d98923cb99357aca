"""Real runs of lessons 05-07: DDP's bucket-size sweep, FSDP2 and pipeline schedules, each predicted by the
simulator from a calibration made in the same launch, then measured; each result's "background" is the other
processes' CPU during the launch (runtime/measure/trust.py Watch), so a lesson can say when a busy machine makes its
measurement unfit to judge the model (sim/lessons/verdicts.py)."""
from __future__ import annotations

from distlab.runtime.lessons.common import fewer, run_on_ranks
from distlab.runtime.measure.trust import Watch


# --- DDP: the bucket-size sweep, measured (lesson 05) ----------------------------------------------------------
def ddp_bucket_sweep(model, caps, nproc: int = 2, steps: int = 4, warmup: int = 2,
                     calibrate=(2**18, 2**20, 2**22, 2**24), timeout: float = 240.0, profile: dict | None = None) -> dict:
    """Real DDP (runtime.parallel.ddp.rank_task) once per ``bucket_cap_mb`` of ``caps``, all in one launch of ``nproc``
    ranks; the first cap's run also times the model alone and a few all-reduces, which calibrate the simulator
    (runtime.parallel.ddp.calibrated) to predict every cap. Returns {"rows": per cap {bucket_cap_mb, buckets,
    measured_buckets, predicted_s, measured_s, error_pct}, "results": per cap the ranks' results, "model",
    "cluster" (calibrated), "predicted": per cap the simulated Trace}. runtime.parallel.ddp's calibration times CPU
    tensors, so this runs on gloo. ``profile`` ({"cap": one of ``caps``, "dir": a folder}): that cap's steps
    also run under ``torch.profiler`` on every rank, each exporting its Chrome trace to DIR/rank{r}.json
    ("profiles": the paths; sim/lessons/profiling.py reads them); the profiler's overhead is in those steps."""
    from distlab.runtime.parallel.ddp.validate import calibrated, slowest as _slowest
    from distlab.runtime.ranks.launch import TRAINING
    from distlab.sim.parallel.ddp.plan import DDPOptions, ddp_plan
    from distlab.sim.kernel.engine import simulate
    from distlab.sim.models import model_from_spec
    model = model_from_spec(model)
    if profile:
        from distlab.sim.files import make_folder
        make_folder(profile["dir"], "profile")          # checked as every output folder (sim/files.py)
    payload = {"model": {**model.config, "name": model.name}, "caps": list(caps), "steps": fewer(steps, 2),
               "warmup": fewer(warmup, 2), "calibrate": [int(s) for s in calibrate],
               "profile": {"index": list(caps).index(profile["cap"]), "dir": profile["dir"]} if profile else None}
    watch = Watch()
    out = run_on_ranks("distlab.runtime.lessons.training:_ddp_sweep_task", payload, nproc, "gloo", timeout,
                       preload=TRAINING)
    background = watch.stop()
    per_cap = [[r[i] for r in out] for i in range(len(caps))]
    cal_model, cluster = calibrated(model, per_cap[0])
    rows, traces = [], []
    for cap, results in zip(caps, per_cap):
        plan, info = ddp_plan(cal_model, nproc, DDPOptions(bucket_cap_mb=cap))
        trace = simulate(plan, cluster, record_transfers=False)
        measured = _slowest(results, "steps", "step")
        rows.append({"bucket_cap_mb": cap, "buckets": len(info["buckets"]),
                     "measured_buckets": len(results[0]["rebuilt_bucket_sizes"]), "predicted_s": trace.makespan,
                     "measured_s": measured, "error_pct": 100.0 * (trace.makespan - measured) / measured})
        traces.append(trace)
    done = {"rows": rows, "results": per_cap, "model": cal_model, "cluster": cluster, "predicted": traces,
            "background": background}
    if profile:
        import os
        done["profiles"] = [os.path.join(profile["dir"], f"rank{r}.json") for r in range(nproc)]
    return done


def _ddp_sweep_task(ctx, payload):
    import contextlib
    import os

    from distlab.runtime.parallel.ddp.run import rank_task
    out, prof = [], payload.get("profile")
    for i, cap in enumerate(payload["caps"]):
        task = {"model": payload["model"], "ddp": {"bucket_cap_mb": cap}, "steps": payload["steps"],
                "warmup": payload["warmup"], "local": i == 0, "calibrate": payload["calibrate"] if i == 0 else None}
        profiling = prof is not None and prof["index"] == i
        with _profiler() if profiling else contextlib.nullcontext() as p:
            out.append(rank_task(ctx, task))
        if profiling:
            p.export_chrome_trace(os.path.join(prof["dir"], f"rank{ctx.rank}.json"))
    return out


def _profiler():
    """torch.profiler on the CPU (gloo ranks): every op and collective of the wrapped steps, with shapes."""
    from torch.profiler import ProfilerActivity, profile
    return profile(activities=[ProfilerActivity.CPU], record_shapes=True)


# --- FSDP2: predicted then measured (lesson 06) ----------------------------------------------------------------
def fsdp_predict_measure(model, variants: dict, nproc: int = 2, steps: int = 3, warmup: int = 1,
                         timeout: float = 240.0) -> dict:
    """Real ``fully_shard`` (runtime.parallel.fsdp.run) for each variant (label -> fsdp options) in one launch of
    ``nproc`` gloo ranks, with the calibration runtime.fsdp_validate uses; then the simulator's prediction on
    the calibrated cluster. Returns {"rows": per variant {variant, collectives, sequence_match, predicted_s,
    measured_s, error_pct}, "results", "cluster", "traces": per variant the measured collectives as a Trace}."""
    from distlab.runtime.parallel.fsdp.run import measured_sequence, run, to_trace
    from distlab.runtime.parallel.fsdp.validate import calibrated_cluster, calibration_sizes, measured_step, predict
    from distlab.sim.parallel.fsdp.plan import build_fsdp, collective_sequence
    from distlab.sim.models import model_from_spec
    model = model_from_spec(model)
    opts = list(variants.values())
    plans = [build_fsdp(model, nproc, o) for o in opts]
    watch = Watch()
    results = run(model, nproc, opts, steps=fewer(steps, 1), warmup=fewer(warmup, 1),
                  calibrate=calibration_sizes(plans), local=True, timeout=timeout)
    background = watch.stop()
    cluster = calibrated_cluster(results, model, nproc)
    rows = []
    for i, (label, o) in enumerate(variants.items()):
        predicted, measured = predict(model, nproc, o, cluster), measured_step(results, i)
        seq = collective_sequence(plans[i])
        rows.append({"variant": label, "collectives": len(seq), "sequence_match": seq == measured_sequence(results, i),
                     "predicted_s": predicted, "measured_s": measured,
                     "error_pct": 100.0 * (predicted - measured) / measured})
    return {"rows": rows, "results": results, "cluster": cluster,
            "traces": [to_trace(results, i) for i in range(len(opts))], "background": background}


# --- pipeline parallelism: predicted, then measured (lesson 07) ------------------------------------------------
PIPELINE_SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zbh1", 1), ("zbv", 2))


def pipeline_predict_measure(schedules=PIPELINE_SCHEDULES, nproc: int = 2, microbatches: int = 8,
                             blocks_per_rank: int = 4, width: int = 512, rows: int = 64, steps: int = 3,
                             timeout: float = 240.0) -> dict:
    """Real torch.distributed.pipelining (runtime/parallel/pipeline.py) for each (schedule, v) in one launch of ``nproc``
    gloo ranks: ``blocks_per_rank`` x nproc blocks of Linear(width, width) + ReLU, ``rows`` rows per microbatch.
    The launch also calibrates (runtime/pipeline_validate.py, shared with benchmarks/pipeline_accuracy.py):
    before each schedule, a shorter probe run of it (nproc microbatches) gives the p2p latency a pipeline sees
    and the runtime's CPU time per action; every rank times one block's F, B, I and W alone; a send/recv
    ping-pong gives the p2p bandwidth. The simulator, its ranks sharing this machine's cores, then predicts
    each schedule from those numbers alone; ``replay_s`` runs the same plan with each (stage, kind)'s mean
    measured action time instead, a check of the schedule and p2p model alone.
    Returns {"rows": per schedule {schedule, v, predicted_s, measured_s (median step), error_pct, replay_s,
    predicted_bubble, measured_bubble (fastest step), ideal_bubble}, "measured", "predicted" (Traces),
    "calibration": {F, B, I, W (rank 0, one block), latency_s, overhead_s (first schedule's probe), p2p}}.
    Quick mode (runtime/lessons/common.py): one measured step, 3 probe steps (else 6), and each block timing the
    median of 3 rounds of 4 (runtime.parallel.pipeline.run.calibrate; else 5 rounds of 10)."""
    import statistics

    from distlab.runtime.parallel.pipeline.validate import measure_and_predict
    from distlab.sim.parallel.pipeline import metrics as M
    cfgs = [dict(schedule=s, stages=nproc, microbatches=microbatches, virtual_stages=v, width=width, rows=rows,
                 layers=nproc * blocks_per_rank, steps=fewer(steps, 1), warmup=1, probe_steps=fewer(6, 3),
                 calibrate_repeat=fewer(10, 4), calibrate_rounds=fewer(5, 3)) for s, v in schedules]
    watch = Watch()
    results = measure_and_predict(cfgs, nproc, timeout=timeout)
    background = watch.stop()
    r0 = results[0]
    out = {"rows": [], "measured": [], "predicted": [], "background": background,
           "calibration": {**r0["calibration"][0], "latency_s": r0["latency"], "overhead_s": r0["overhead"],
                           "p2p": r0["p2p"]}}
    for r in results:
        cfg, measured, predicted, meta = r["cfg"], r["measured"], r["predicted"], r["plan"].meta["pipeline"]
        mp, mm = M.compute(predicted, meta), M.compute(measured, meta)
        t_meas = statistics.median(measured.meta["step_makespans"])
        out["rows"].append({"schedule": cfg["schedule"], "v": cfg["virtual_stages"], "predicted_s": mp.makespan,
                            "measured_s": t_meas, "error_pct": 100.0 * (mp.makespan - t_meas) / t_meas,
                            "replay_s": r["replayed"].makespan,
                            "predicted_bubble": mp.bubble, "measured_bubble": mm.bubble,
                            "ideal_bubble": M.ideal_bubble(cfg["schedule"], nproc, microbatches,
                                                           cfg["virtual_stages"])})
        out["measured"].append(measured)
        out["predicted"].append(predicted)
    return out
