"""Real DDP against the simulator: calibrate, simulate the same step, compare (`distlab validate --scenario`).

``validate_ddp`` calibrates (this machine's FLOP/s and memory bandwidth from the model run alone on every
rank, and all-reduce α and bandwidth from a few sizes, all measured in the launch of runtime/parallel/ddp/run.py),
simulates the same step, and puts predicted and measured step, backward and per-bucket times side by side.
"""
from __future__ import annotations

from distlab.runtime.parallel.ddp.run import measure, to_trace
from distlab.runtime.measure.validation import case

CAL_SIZES = [2**20, 2**22, 2**24, 2**25]

def calibrated(model, results: list[dict], base: str = "localhost-cpu", optimizer: str = "adam",
               stat: str = "median"):
    """(model, cluster) fitted to the measurements (slowest rank). The 'GPU' runs forward FLOPs at the
    measured forward rate; each layer's backward FLOPs are scaled so backward/forward is the measured ratio
    (about 2 in theory, more on CPUs); memory bandwidth makes the optimizer take the measured time; the
    all-reduce is fitted as t = 2(n-1)·α + 2(n-1)/n · S / B by the fit every calibration shares
    (runtime/measure/fit.py fit_op: robust per size and robust line, runtime/measure/robust.py), on times from launch (last
    rank's start to last rank's end, as runtime/measure/sweep.py times `distlab calibrate`): the slowest rank's own
    duration would add the ranks' wake-up skew after the barrier (scheduling delay, milliseconds on a loaded
    machine) to α once per call, so the more buckets, the more over-predicted the step; in the simulated step
    a bucket's all-reduce starts at its last rank's launch, which the slowest rank's compute already sets.
    Cores: the model alone is timed on every rank at once, alternating with the DDP steps, so it already ran
    at the share the ranks get beside the machine's other processes (runtime/measure/load.py effective_cores(n,
    alone=n) = n): the cluster gives each rank its own core (cpu_cores None). Interference (where the launch
    measured it, runtime/measure/compute_probe.py, robust centers over rounds between the steps): ``interference`` =
    the backward's slowdown while a bucket's all-reduce is in flight, ``comm_interference`` = the all-reduce's
    while the backward runs (sim/kernel/cores.py: neither counts the sharing of cores, which the compute rate holds)."""
    import copy
    from dataclasses import replace

    from distlab.runtime.measure.fit import fit_op
    from distlab.sim.cluster import PRESETS
    from distlab.sim.parallel.ddp.plan import OPTIMIZERS
    n = len(results)
    t_fwd, t_bwd, t_opt = (slowest(results, "local", k, stat=stat) for k in ("forward", "backward", "optimizer"))
    model = copy.deepcopy(model)
    scale = (t_bwd / t_fwd) / (model.bwd_flops / model.fwd_flops)
    for layer in model.layers:
        layer.bwd_flops *= scale
    gpu = replace(PRESETS[base].gpu, name="calibrated", tflops=model.fwd_flops / t_fwd / 1e12, mfu=1.0,
                  hbm_GBps=max(OPTIMIZERS[optimizer], 1) * model.param_bytes / t_opt / 1e9)
    cluster = replace(PRESETS[base], name=f"{base} (calibrated)", gpus_per_node=n, gpu=gpu)
    probe = results[0].get("interference")
    if probe:
        cluster = replace(cluster, interference=round(probe["interference"], 3),
                          comm_interference=round(probe["comm_interference"], 3))
    cal = results[0].get("calibration")
    if cal:
        sizes = [int(s) for s in cal]
        if all("calibration_spans" in r for r in results):        # from launch: last start to last end
            samples = [[max(r["calibration_spans"][s][i][1] for r in results)
                        - max(r["calibration_spans"][s][i][0] for r in results) for i in range(len(cal[s]))]
                       for s in cal]
        else:                                                     # older results: the slowest rank's duration
            samples = [[max(r["calibration"][s][i] for r in results) for i in range(len(cal[s]))] for s in cal]
        if stat == "min":
            samples = [[min(x)] for x in samples]
        cluster = replace(cluster, calibration={"collectives": {"all_reduce": {
            str(n): fit_op("all_reduce", n, sizes, samples)}}})
    return model, cluster


def validate_ddp(scenario, nproc: int = 2, steps: int = 5, warmup: int = 2, backend: str = "gloo",
                 timeout: float = 300.0, stat: str = "median") -> dict:
    """Predicted vs measured: rows of {what, predicted_s, measured_s, error_pct}; bucket launch errors are
    in % of the measured backward duration. Also the two traces and the calibrated cluster."""
    from distlab.sim import scenario as sc
    s = sc.scenario_of(scenario)               # a Scenario as parsed (a mapping or a path: parsed here, once)
    opts = s.options("ddp")
    if opts is None:
        raise ValueError("validate_ddp needs parallelism kind ddp")
    model, _ = sc.resolve(s)
    results = measure(model, {"bucket_cap_mb": opts.bucket_cap_mb, "compress": opts.compress,
                              "grad_accum": opts.grad_accum, "optimizer": opts.optimizer},
                      nproc, steps, warmup, True, CAL_SIZES, backend, timeout, interference=True)
    return compare(model, opts, results, stat)


def compare(model, opts, results: list[dict], stat: str = "median") -> dict:
    """Calibrate on ``results`` (from :func:`measure`), simulate, and compare (see validate_ddp)."""
    from distlab.sim.parallel.ddp.plan import bucket_rows, ddp_plan
    from distlab.sim.kernel.engine import simulate
    nproc = len(results)
    model, cluster = calibrated(model, results, optimizer=opts.optimizer, stat=stat)
    plan, info = ddp_plan(model, nproc, opts)
    predicted = simulate(plan, cluster, record_transfers=False)
    pb = bucket_rows(predicted, info)
    step = slowest(results, "steps", "step", stat=stat)
    fwd = slowest(results, "steps", "forward_end", stat=stat)
    for r in results:
        for st in r["steps"]:
            st["backward"] = max(st["ready"]) - st["forward_end"]
    bwd = slowest(results, "steps", "backward", stat=stat)
    p_fwd = max(o.end for o in predicted.for_rank(0) if o.name.startswith("fwd"))
    p_bwd = max(o.end for o in predicted.for_rank(0) if o.name.startswith("bwd")) - p_fwd
    rows = [_row("step", predicted.makespan, step), _row("forward", p_fwd, fwd), _row("backward", p_bwd, bwd)]
    same = [b["bytes"] for b in info["buckets"]] == results[0]["rebuilt_bucket_sizes"]
    for k, b in enumerate(pb):
        ml = slowest(results, "steps", "buckets", lambda bs, k=k: bs[k]["launch"], stat)
        me = slowest(results, "steps", "buckets", lambda bs, k=k: bs[k]["end"], stat)
        rows.append({**_row(f"bucket {k} launch", _ddp_launch(pb, k), ml), "error_pct_of_backward":
                     100.0 * abs(_ddp_launch(pb, k) - ml) / bwd})
        rows.append(_row(f"bucket {k} end", b["end_s"], me))
    return {"rows": rows, "buckets_match": same, "model": model,
            "predicted_buckets": [b["bytes"] for b in info["buckets"]],
            "measured_buckets": results[0]["rebuilt_bucket_sizes"], "cluster": cluster,
            "predicted": predicted, "measured": to_trace(results), "results": results}


def _robust_center(samples) -> float:
    from distlab.runtime.measure.robust import center
    return center(samples)


STAT = {"median": _robust_center, "min": min}


def slowest(results: list[dict], key: str, field: str, get=None, stat: str = "median") -> float:
    """``stat`` over iterations of the slowest rank's value (``get`` maps the field's value to a number);
    "median" is the robust center (median of medians, runtime/measure/robust.py).
    ("min" discounts other processes' bursts, but mixes the luckiest moments of different quantities.)"""
    get = get or (lambda v: v)
    n = min(len(r[key]) for r in results)
    return STAT[stat]([max(get(r[key][i][field]) for r in results) for i in range(n)])


def _ddp_launch(rows: list[dict], k: int) -> float:
    return rows[k]["ddp_launch_s"]          # DDP's launch rule: sim.ddp.buckets.bucket_launch_times


def _row(what: str, predicted: float, measured: float) -> dict:
    return {"what": what, "predicted_s": predicted, "measured_s": measured,
            "error_pct": 100.0 * (predicted - measured) / measured if measured else float("nan")}


def ddp_cases(scenario, args) -> list[dict]:
    """`distlab validate --scenario ddp.yaml` rows (runtime.measure.validation.case format): step, forward, backward
    and per-bucket launch/end, predicted (calibrated here) against measured real DDP."""
    from distlab.runtime.commands.common import scenario_nproc
    r = validate_ddp(scenario, nproc=scenario_nproc(args, 2), steps=max(getattr(args, "iters", 5), 2),
                     warmup=max(getattr(args, "warmup", 2), 2))
    out = []
    sizes = dict(zip(range(len(r["measured_buckets"])), r["measured_buckets"]))
    for row in r["rows"]:
        k = int(row["what"].split()[1]) if row["what"].startswith("bucket") else None
        c = case("ddp scenario", f"ddp {row['what']}", nproc, sizes.get(k, r["model"].param_bytes),
                 row["predicted_s"], row["measured_s"])
        if "error_pct_of_backward" in row:
            c["error_of_backward"] = row["error_pct_of_backward"] / 100
        out.append(c)
    return out
