"""Real pipeline schedules against the simulator on this machine: calibrate, predict, compare action by action.

Model of a pipeline of CPU ranks: each action is the stage's compute (blocks x one block's F, B, I or W, timed on
a core of its own) plus the runtime's own CPU time per action (Python, torch.distributed.pipelining, posting sends
and receives: ``overhead``); the ranks of the machine share its cores for that work (the cluster's ``cpu_cores``:
processor sharing, sim/kernel/cores.py, with the cores that fair sharing beside the other processes seen before the
launch leaves them, runtime/measure/load.py effective_cores); a tensor handed to the next stage arrives after the p2p
latency a pipeline sees (``p2p_latency``) plus bytes / the ping-pong's bandwidth.

One launch of p gloo ranks (runtime.parallel.pipeline.run.measure) runs, for each configuration, its probe (the same
schedule and model with fewer microbatches, ``probe_config``) and the configuration itself, their steps
alternating (so that both see the same load), with every rank timing one block alone
(runtime.parallel.pipeline.run.calibrate_alone) before and after them, every action timed. From the probe: the p2p latency
(its measured hand-offs) and the overhead per action (fitted so that the simulated probe lasts as long as the
measured one, ``fit_overhead``; when even no overhead leaves the simulated probe longer, the load model's cores
were too few for that moment and ``fit_cores`` takes the cores that match it, so that a probe never pins the
overhead at 0 and over-predicts; of the overhead, the mean gap the probe shows between actions is a separate
"runtime" op after each action and the rest is counted in the action, so that predicted and measured bubbles
compare like with like). The prediction of the configuration is then sim.pipeline's plan with those numbers alone:
it never sees the run it predicts. A replay (the same plan with each (stage, kind)'s mean measured action time
plus the mean gap the runtime leaves between actions, which already hold their share of the cores) checks the
schedule and p2p model alone. Used by benchmarks/pipeline_accuracy.py, lesson 07 and `distlab validate --scenario`
(kind pipeline, ``pipeline_cases``).
"""
from __future__ import annotations

import statistics
from dataclasses import replace

from distlab.runtime.measure import robust
from distlab.runtime.measure.validation import case
from distlab.runtime.parallel.pipeline.run import DEFAULTS, measure
from distlab.runtime.ranks.preflight import cpu_cores


def cluster_of(p: int, p2p: dict, latency: float, cores: int | None = None):
    """``p`` CPU ranks sharing ``cores`` cores, joined by a fabric with the given one-way latency and the
    ping-pong's bandwidth."""
    from distlab.sim.cluster import PRESETS, IntraNode
    extra = max(p2p["large"] - p2p["small"], 1e-6)
    return replace(PRESETS["localhost-cpu"], name="localhost-measured", gpus_per_node=p, cpu_cores=cores,
                   intra_node=IntraNode("loopback", p2p["bytes"] / extra / 1e9, latency * 1e6))


def probe_config(cfg: dict) -> dict:
    """The calibration run of ``cfg``: the same schedule and model with about half the microbatches (the
    largest multiple of p up to m / 2, at least p, which every schedule accepts; 2p when m = p), so that a
    prediction is never fitted on the run it predicts. Twice the steps (at least 6): its median steers all;
    ``probe_steps`` in ``cfg`` sets them instead (the lessons' quick mode: fewer)."""
    p, m = cfg["stages"], cfg["microbatches"]
    probe = max(p, m // 2 // p * p)
    steps = cfg.get("probe_steps") or max(2 * cfg["steps"], 6)
    return {**cfg, "microbatches": 2 * p if probe == m else probe, "steps": steps}


def _sources(trace):
    from distlab.sim.parallel.pipeline.metrics import actions_of
    acts = actions_of(trace)
    end = {(a.stage, a.kind if a.kind == "F" else "B", a.mb): o.end for a, o in acts if a.kind != "W"}
    return acts, end, lambda a: (a.stage - 1, "F", a.mb) if a.kind == "F" else (a.stage + 1, "B", a.mb)


def p2p_latency(trace) -> float:
    """Robust center (median of medians, runtime/measure/robust.py) of the delays from the end of an action whose output another rank needs to the start of the action that
    needs it, where that action waited for nothing else: the effective one-way p2p latency of a real pipeline
    (gloo's threads hand messages over more slowly than a ping-pong shows); a hand-off another process delayed
    does not count."""
    acts, end, source = _sources(trace)
    prev_end, delays = {}, []
    for a, o in acts:
        src = source(a)
        if a.kind != "W" and src in end and end[src] > prev_end.get(o.rank, 0.0):
            delays.append(o.start - end[src])
        prev_end[o.rank] = o.end
    return robust.center(delays) if delays else 0.0


def action_gap(trace) -> float:
    """Robust center (runtime/measure/robust.py) of the gaps between consecutive actions of a rank when the second had
    nothing to wait for: the time the runtime leaves between actions (Python, posting sends and receives)."""
    acts, end, source = _sources(trace)
    prev_end, gaps = {}, []
    for a, o in acts:
        if o.rank in prev_end and end.get(source(a), 0.0) <= prev_end[o.rank]:
            gaps.append(o.start - prev_end[o.rank])
        prev_end[o.rank] = o.end
    return robust.center(gaps) if gaps else 0.0


def block_seconds(cfg: dict, calib: list[dict], extra: float = 0.0) -> dict:
    """(stage, kind) -> seconds from per-rank block costs (stage 0: I = 0, W = full backward, as torch's
    PipelineStage.backward_weight_one_chunk does), plus ``extra`` per action."""
    from distlab.sim.parallel.pipeline import schedules as S
    from distlab.sim.parallel.pipeline.plan import split_layers
    p, v = cfg["stages"], cfg["virtual_stages"]
    placement = S.stage_to_rank(cfg["schedule"], p, v)
    seconds = {}
    for s, r in enumerate(split_layers(cfg["layers"], p * v, cfg.get("split"))):
        c, n = calib[placement[s]], len(r)
        seconds.update({(s, k): n * c[k] for k in "FBIW"})
        if s == 0:
            seconds[s, "I"], seconds[s, "W"] = 0.0, n * c["B"]
    return {k: t + extra for k, t in seconds.items()}


def replay_seconds(trace, fallback: dict | None = None) -> dict:
    """(stage, kind) -> mean measured seconds of that action (``fallback``'s where it never ran)."""
    from distlab.sim.parallel.pipeline.metrics import actions_of
    times: dict = {}
    for a, o in actions_of(trace):
        times.setdefault((a.stage, a.kind), []).append(o.end - o.start)
    return {**(fallback or {}), **{k: statistics.fmean(v) for k, v in times.items()}}


def simulate_cfg(cfg: dict, seconds: dict, cluster, overhead: float = 0.0):
    """(trace, plan): the pipeline plan of runtime config ``cfg`` with the given (stage, kind) seconds and
    ``overhead`` seconds of runtime work after each action."""
    from distlab.sim.kernel.engine import simulate
    from distlab.sim.models import Layer, Model
    from distlab.sim.parallel.pipeline.plan import PipelineSpec, build_plan
    act = cfg["rows"] * cfg["width"] * 4
    model = Model("blocks", [Layer(f"b{i}", [], fwd_flops=1.0, activation_bytes=act) for i in range(cfg["layers"])])
    full = {(s, k): seconds.get((s, k), 0.0) for s in range(cfg["stages"] * cfg["virtual_stages"]) for k in "FBIW"}
    plan = build_plan(model, PipelineSpec(cfg["schedule"], cfg["stages"], cfg["microbatches"],
                                          cfg["virtual_stages"], split=cfg.get("split")), seconds=full,
                      overhead=overhead)
    return simulate(plan, cluster), plan


def fit_overhead(cfg: dict, calib: list[dict], cluster, target: float) -> float:
    """The runtime's CPU seconds per action that make the simulated ``cfg`` last ``target`` seconds (bisection:
    the makespan grows with it); 0 when the plan without overhead already lasts longer."""
    seconds = block_seconds(cfg, calib)

    def makespan(o):
        return simulate_cfg(cfg, seconds, cluster, o)[0].makespan
    if makespan(0.0) >= target:
        return 0.0
    lo, hi = 0.0, 1e-3
    while makespan(hi) < target and hi < 1.0:
        lo, hi = hi, 2 * hi
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if makespan(mid) < target else (lo, mid)
    return (lo + hi) / 2


def fit_cores(cfg: dict, calib: list[dict], cluster, target: float) -> float:
    """The cores (between the cluster's and one per rank) with which the simulated ``cfg``, without runtime
    overhead, lasts ``target`` seconds (bisection: the makespan falls as the cores grow): for a probe that ran
    faster than the load model's cores allow even with no overhead (fit_overhead = 0), the cores it shows."""
    seconds = block_seconds(cfg, calib)
    lo, hi = cluster.cpu_cores or cluster.gpus_per_node, float(cluster.gpus_per_node)

    def makespan(c):
        return simulate_cfg(cfg, seconds, replace(cluster, cpu_cores=c))[0].makespan
    if lo >= hi or makespan(lo) <= target:
        return lo
    if makespan(hi) >= target:
        return hi
    for _ in range(20):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if makespan(mid) > target else (lo, mid)
    return round((lo + hi) / 2, 3)


def measure_and_predict(cfgs: list[dict], n: int, timeout: float = 600.0, count_pids=()) -> list[dict]:
    """One launch of ``n`` gloo ranks: every runtime config in ``cfgs`` (stages = n), each after its probe,
    calibrated and run (``measure_runs``), then predicted (``predict_runs``)."""
    return predict_runs(measure_runs(cfgs, n, timeout, count_pids))


def measure_runs(cfgs: list[dict], n: int, timeout: float = 600.0, count_pids=()) -> dict:
    """The measurements alone: {"cfgs", "runs" (probe, config, probe, ...), "res" (runtime.parallel.pipeline.run.measure),
    "load" (runtime/measure/load.py, before the ranks start)}. Each probe's steps alternate with its configuration's
    (runtime.parallel.pipeline.run.run_interleaved: both see the same load, and share one timing of the blocks alone),
    as DDP's and FSDP's calibrations alternate with their steps."""
    from distlab.runtime.measure import load as machine_load
    load = machine_load.sample(count_pids=count_pids)
    cfgs = [{**DEFAULTS, **c, "calibrate": True} for c in cfgs]
    runs = [run for c in cfgs for run in (probe_config(c), c)]
    shape = {"width": cfgs[0]["width"], "rows": cfgs[0]["rows"], "repeat": cfgs[0].get("calibrate_repeat", 10),
             "rounds": cfgs[0].get("calibrate_rounds", 5)}         # calibrate()'s effort, as the configs ask
    res = measure(runs, n, calibrate_shape=shape, timeout=timeout, interleave=2)
    return {"cfgs": cfgs, "runs": runs, "res": res, "load": load, "n": n}


def cores_for(load, n: int) -> float:
    """The cluster's ``cpu_cores`` for ``n`` ranks whose blocks were timed one rank at a time:
    load.effective_cores(n, alone=1) (runtime/measure/load.py: processor sharing with the observed background)."""
    if load is None:
        return min(n, cpu_cores())
    return round(load.effective_cores(n, alone=1), 2)


def predict_runs(measured: dict, cores: float | None = None) -> list[dict]:
    """Per config of ``measure_runs``' result: {"cfg", "plan", "measured", "predicted", "replayed" (traces),
    "probe" ({"cfg", "measured_s", "predicted_s"}), "latency", "overhead", "cores", "p2p", "calibration" (per
    rank, one block alone), "action_seconds" ((stage, kind) -> the calibrated compute of the action alone; the
    plan adds "overhead" of runtime work after each action), "cores" (the cluster's: ``cores``, else
    cores_for(load, n)), "load" (the reading before the launch, a dict), "spread" (robust CV of the probe's
    step makespans)}.
    Robust (runtime/measure/robust.py): the probe's makespan is the robust center of its steps; the overhead per action
    is a property of the runtime, not of a schedule, so with 3 or more configs a fit farther than 3 MADs from
    their median (one probe a burst of load disturbed) is replaced by the median (robust.reject)."""
    cfgs, runs, res, load, n = (measured[k] for k in ("cfgs", "runs", "res", "load", "n"))
    ranks = sorted(res["ranks"], key=lambda r: r["rank"])
    cores = cores_for(load, n) if cores is None else cores
    p2p = ranks[0]["p2p"]
    fits = []
    for i, cfg in enumerate(cfgs):
        probe = res["traces"][2 * i]
        probe_calib = [r["runs"][2 * i]["calibration"] for r in ranks]
        latency = p2p_latency(probe)
        cluster = cluster_of(n, p2p, latency, cores)
        probe_s = robust.center(probe.meta["step_makespans"])
        overhead = fit_overhead(runs[2 * i], probe_calib, cluster, probe_s)
        if overhead == 0.0:           # the probe ran faster than these cores allow: it shows more of them
            cluster = replace(cluster, cpu_cores=fit_cores(runs[2 * i], probe_calib, cluster, probe_s))
        fits.append((latency, cluster, probe_s, overhead))
    overheads = robust.reject([f[3] for f in fits])
    # a probe whose cores were fitted keeps its overhead 0 (the pair fits it; the median's would not)
    overheads = [0.0 if f[1].cpu_cores != cores else o for f, o in zip(fits, overheads)]
    out = []
    for i, cfg in enumerate(cfgs):
        probe, measured = res["traces"][2 * i], res["traces"][2 * i + 1]
        probe_calib = [r["runs"][2 * i]["calibration"] for r in ranks]
        calib = [r["runs"][2 * i + 1]["calibration"] for r in ranks]
        latency, cluster, probe_s, _ = fits[i]
        overhead = overheads[i]
        # the part of it that a measured timeline shows between actions stays between them, the rest is in them
        between = min(overhead, action_gap(probe))
        probe_pred = simulate_cfg(runs[2 * i], block_seconds(runs[2 * i], probe_calib, overhead - between),
                                  cluster, between)[0]
        seconds = block_seconds(cfg, calib, overhead - between)
        predicted, plan = simulate_cfg(cfg, seconds, cluster, between)
        predicted.meta["pipeline"] = measured.meta["pipeline"] = plan.meta["pipeline"]
        # measured action times (and gaps) already hold their share of the cores: replayed with a core each
        replayed, _ = simulate_cfg(cfg, replay_seconds(measured, seconds), replace(cluster, cpu_cores=None),
                                   action_gap(measured))
        out.append({"cfg": cfg, "plan": plan, "measured": measured, "predicted": predicted, "replayed": replayed,
                    "probe": {"cfg": runs[2 * i], "measured_s": probe_s, "predicted_s": probe_pred.makespan},
                    "latency": latency, "overhead": overhead, "cores": cluster.cpu_cores, "cores_load": cores,
                    "p2p": p2p, "calibration": calib,
                    "action_seconds": block_seconds(cfg, calib), "overhead_between": between,
                    "overhead_fitted": fits[i][3], "load": load.to_dict() if load else None,
                    "spread": robust.spread(probe.meta["step_makespans"])})
    return out


def runtime_config(scenario, steps: int = 3, warmup: int = 1) -> dict:
    """The runtime.parallel.pipeline config of a pipeline scenario. The real model is ``layers`` x (Linear(width, width)
    + ReLU), so the scenario's model must be ``{kind: mlp, widths: [w, w, ...], batch: rows per microbatch}``."""
    from distlab.sim import scenario as sc
    from distlab.sim.errors import ConfigError
    from distlab.sim.scenario.pipeline import spec_of
    s = sc.scenario_of(scenario)               # a Scenario as parsed (a mapping or a path: parsed here, once)
    if s.workload != "pipeline":
        raise ConfigError(f"needs parallelism kind pipeline, got {s.workload!r}", "parallelism.kind")
    spec = spec_of(s)
    if spec.data_parallel != 1:
        raise ConfigError(f"only data_parallel 1 runs for real, got {spec.data_parallel}", "parallelism.data_parallel")
    if spec.stages < 2:
        raise ConfigError("a real pipeline needs at least 2 stages", "parallelism.stages")
    model = s.model_spec()
    widths = model.get("widths") if isinstance(model, dict) else None
    if (not isinstance(model, dict) or model.get("kind") != "mlp" or not isinstance(widths, list) or len(widths) < 2
            or len(set(widths)) != 1 or model.get("dtype", "float32") != "float32"):
        raise ConfigError("a real pipeline run needs {kind: mlp, widths: [w, w, ...]} with equal widths, float32 "
                          "(runtime.parallel.pipeline builds Linear(w, w) + ReLU blocks)", "model")
    from distlab.sim.models import model_from_spec
    model_from_spec(model, "model")                  # checks the keys
    return {"schedule": spec.schedule, "stages": spec.stages, "microbatches": spec.microbatches,
            "virtual_stages": spec.virtual_stages, "layers": len(widths) - 1, "split": spec.split,
            "width": widths[0], "rows": model.get("batch", 32), "steps": steps, "warmup": warmup}


def validate_pipeline(scenario, steps: int = 3, warmup: int = 1, timeout: float = 300.0) -> dict:
    """Run a pipeline scenario for real on ``stages`` gloo ranks and predict it (calibrated in the same launch).
    Returns measure_and_predict's dict for it plus the metrics and the measured median step makespan."""
    from distlab.sim.parallel.pipeline import metrics as M
    from distlab.sim.parallel.pipeline import schedules as S
    cfg = runtime_config(scenario, steps, warmup)
    S.check(cfg["schedule"], cfg["stages"], cfg["microbatches"], cfg["virtual_stages"])
    r = measure_and_predict([cfg], cfg["stages"], timeout=timeout)[0]
    meta = r["plan"].meta["pipeline"]
    r["metrics"] = {k: M.compute(r[k], meta) for k in ("predicted", "measured", "replayed")}
    r["measured_median_s"] = robust.center(r["measured"].meta["step_makespans"])
    return r


def action_rows(predicted, measured) -> list[dict]:
    """Every action of the fastest measured step next to the same action in the prediction (start and end,
    seconds from each trace's first action)."""
    from distlab.sim.parallel.pipeline.metrics import actions_of
    pred = {str(a): o for a, o in actions_of(predicted)}
    out = []
    for a, o in actions_of(measured):
        q = pred.get(str(a))
        out.append({"action": str(a), "rank": o.rank, "measured_start_s": o.start, "measured_end_s": o.end,
                    "predicted_start_s": q.start if q else None, "predicted_end_s": q.end if q else None})
    return out


def pipeline_cases(scenario, args) -> list[dict]:
    """`distlab validate --scenario pipeline.yaml` rows (runtime.measure.validation.case format), on ``stages`` gloo
    ranks: the step makespan predicted (calibrated in the same launch, on a probe run) against the measured
    median; the replay (measured action times through the simulated schedule); and per (stage, kind) the mean
    simulated action time (its compute, stretched where the ranks share the cores) against the mean measured
    one. The makespan row also carries the bubbles, the probe's numbers ("p2p_latency_s", "action_overhead_s":
    the runtime's CPU time per action, "cpu_cores") and every action's predicted and measured start and end
    ("actions")."""
    r = validate_pipeline(scenario, steps=max(getattr(args, "iters", 3), 2), warmup=max(getattr(args, "warmup", 1), 1))
    cfg, mp, mm = r["cfg"], r["metrics"]["predicted"], r["metrics"]["measured"]
    n, nbytes = cfg["stages"], cfg["rows"] * cfg["width"] * 4
    label = f"{cfg['schedule']} p={n} m={cfg['microbatches']}" + (
        f" v={cfg['virtual_stages']}" if cfg["virtual_stages"] > 1 else "")
    top = case("pipeline scenario", f"pipeline makespan ({label})", n, nbytes, mp.makespan, r["measured_median_s"])
    top.update({"predicted_bubble": mp.bubble, "measured_bubble": mm.bubble, "measured_fastest_s": mm.makespan,
                "step_makespans_s": r["measured"].meta["step_makespans"], "p2p_latency_s": r["latency"],
                "action_overhead_s": r["overhead"], "cpu_cores": r["cores"], "probe": r["probe"], "load": r["load"],
                "actions": action_rows(r["predicted"], r["measured"])})
    out = [top, case("pipeline scenario", f"pipeline replay ({label})", n, nbytes,
                     r["metrics"]["replayed"].makespan, r["measured_median_s"])]
    simulated = replay_seconds(r["predicted"])
    for (s, k), t in sorted(replay_seconds(r["measured"]).items()):
        out.append(case("pipeline action", f"stage {s} {k} (mean)", n, nbytes, simulated[s, k], t))
    return out
