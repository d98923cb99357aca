"""Real FSDP2 against the simulator on this machine: calibrate, predict the step, compare with the measured one.

Calibration (micro-measurements taken in the same launch, interleaved with the FSDP steps, never the FSDP step
itself): ring α and bandwidth per collective at the plan's own sizes; a compute rate from one unsharded rank's
forward+backward; a memory rate from Adam on plain tensors the size of the rank's shards. The prediction is
the fsdp plan on one stream per rank (gloo blocks in every call) simulated on that calibrated cluster. Used by
benchmarks/fsdp_accuracy.py and `distlab validate --scenario` (kind fsdp).
"""
from __future__ import annotations

from distlab.runtime.parallel.fsdp.run import measured_sequence, run, to_trace
from distlab.runtime.measure.validation import case, roofline_cluster


def calibration_sizes(plans) -> dict:
    """op -> the distinct byte counts of that collective in ``plans`` (what to time for calibration)."""
    from distlab.sim.parallel.fsdp.plan import collective_sequence
    out = {}
    for plan in plans:
        for op, nbytes, _ in collective_sequence(plan):
            if op in ("all_gather", "reduce_scatter"):
                out.setdefault(op, set()).add(nbytes)
    return {op: sorted(v) for op, v in out.items()}


def calibrated_cluster(results: list[dict], model, world: int):
    """localhost-cpu with (a) per collective the ring α and bandwidth, t = (n-1)α + (n-1)/n·S/B, fitted by the
    fit every calibration shares (runtime/measure/fit.py fit_op: robust center per size of the rounds' slowest-rank
    times, robust line) at the plan's own sizes, plus one size band per plan size holding that size's own
    robust time (sim/calibration.py bands): the plan's sizes are few and close (here 4.10 and 4.20 MB), a line
    through them is ill-conditioned (its slope is the noise), and the relative-error fit then clamps α to 0
    and leans to the faster size (measured: block all-gathers predicted 2.3 ms, timed 3.6 ms); and (b) a compute rate F (bisection) and memory rate M such
    that the roofline max(flops/F, bytes/M) reproduces one unsharded rank's forward+backward, and Adam on plain
    tensors the size of the rank's shards (robust centers of the rounds, slowest rank). Cores: those are timed
    on every rank at once, between the FSDP steps, so at the share the ranks get beside the machine's other
    processes (runtime/measure/load.py effective_cores(n, alone=n) = n): one core per rank in the cluster. (c) The
    compute jitter J (sim/kernel/skew.py) from the spread between the ranks' forward+backward times of each round
    (runtime/compute_probe.compute_jitter): every collective of the step waits for its last member."""
    from distlab.runtime.measure.fit import fit_op
    from distlab.runtime.measure.robust import center
    from distlab.sim.parallel.fsdp.plan import ADAM_BYTES, padded_numel
    n, coll = world, {}
    for op, table in results[0]["calibration"].items():
        sizes = sorted(table, key=int)
        samples = [_slowest([r["calibration"][op][k] for r in results]) for k in sizes]
        bands = [_size_band(op, n, int(k), center(x)) for k, x in zip(sizes, samples)]
        if len(sizes) > 1:                      # the line for other readers; each plan size its own time
            coll[op] = {str(n): {**fit_op(op, n, [int(k) for k in sizes], samples), "bands": bands}}
        else:                                   # one size: α = 0, B from it
            coll[op] = {str(n): {k: v for k, v in bands[0].items() if k not in ("min_bytes", "max_bytes")}}
    fb = center(_slowest([r["local"]["rounds"][0] for r in results]))
    shard = sum(padded_numel(q.shape, n) for q in model.params) // n
    M = ADAM_BYTES * shard / center(_slowest([r["local"]["rounds"][1] for r in results]))
    work = [(L.fwd_flops, L.activation_bytes + L.param_bytes) for L in model.layers]
    work += [(L.bwd_flops, 2 * L.activation_bytes + L.param_bytes) for L in model.layers]
    from dataclasses import replace

    from distlab.runtime.measure.compute_probe import compute_jitter
    jitter = compute_jitter([r["local"]["rounds"][0] for r in results])
    return replace(roofline_cluster(work, fb, M, world, coll), compute_jitter=min(jitter, 1.0))


def _size_band(op: str, n: int, nbytes: int, seconds: float) -> dict:
    """A band of one size (sim/calibration.py) whose ring time steps·α + factor·S/B is ``seconds`` (α ~ 0)."""
    from distlab.runtime.measure.fit import ring_cost
    steps, factor = ring_cost(op, n)
    return {"min_bytes": nbytes, "max_bytes": nbytes, "latency_us": 1e-3,
            "bandwidth_GBps": factor * nbytes / max(seconds - steps * 1e-9, 1e-9) / 1e9}


def _slowest(per_rank: list) -> list[float]:
    """Per round, the slowest rank's time (a rank's entry: a list of rounds, or one number)."""
    lists = [v if isinstance(v, list) else [v] for v in per_rank]
    return [max(x) for x in zip(*lists)]


def _center(samples) -> float:
    from distlab.runtime.measure.robust import center
    return center(list(samples))


def measured_step(results: list[dict], variant: int = 0, stat=_center) -> float:
    """Over measured steps (``stat``: the robust center, runtime/measure/robust.py, as for the calibration; or min =
    best of N, or statistics.median), the slowest rank's step time."""
    steps = zip(*[r["variants"][variant]["steps"] for r in results])
    return stat([max(s["time"] for s in per_rank) for per_rank in steps])


def predict(model, world: int, opts: dict, cluster, parts: bool = False):
    """Simulated step seconds of the fsdp plan on one stream per rank (gloo on CPU blocks on each call); with
    ``parts``, also {"comm", "optimizer", "other"} seconds on rank 0."""
    from distlab.sim.kernel.engine import simulate
    from distlab.sim.parallel.fsdp.plan import build_fsdp
    trace = simulate(build_fsdp(model, world, {**opts, "overlap": False}), cluster, record_transfers=False)
    if not parts:
        return trace.makespan
    ops = trace.for_rank(0)
    comm = sum(o.end - o.start for o in ops if o.kind == "collective")
    opt = sum(o.end - o.start for o in ops if o.name == "optimizer")
    return trace.makespan, {"comm": comm, "optimizer": opt, "other": trace.makespan - comm - opt}


def measured_parts(results: list[dict], variant: int = 0) -> dict:
    """Rank 0, best step: seconds in collectives, in the optimizer, and the rest."""
    best = min(next(r for r in results if r["rank"] == 0)["variants"][variant]["steps"], key=lambda s: s["time"])
    comm = sum(c[4] - c[3] for c in best["calls"])
    return {"comm": comm, "optimizer": best["phases"][2], "other": best["time"] - comm - best["phases"][2]}


def validate_fsdp(scenario, nproc: int = 2, steps: int = 3, warmup: int = 1, timeout: float = 300.0) -> dict:
    """For `distlab validate --scenario` (kind fsdp): run the scenario's model with real ``fully_shard`` on
    ``nproc`` gloo ranks; compare the collective sequence (kind, bytes, dtype) with the simulated plan's and
    the predicted step time (calibrated here) with the measured one. Returns a report dict (and the trace)."""
    from distlab.sim import scenario as sc
    from distlab.sim.errors import ConfigError
    from distlab.sim.parallel.fsdp.plan import build_fsdp, collective_sequence
    from distlab.sim.models import model_from_spec
    s = sc.scenario_of(scenario)               # a Scenario as parsed (a mapping or a path: parsed here, once)
    if s.options("fsdp") is None:
        raise ConfigError(f"validate_fsdp needs parallelism kind fsdp, got {s.workload!r}", "parallelism.kind")
    # the options as written (the Scenario's validated mapping): the real run fills the rest with torch's defaults
    opts = {k: v for k, v in (s.source.get("fsdp") or {}).items() if k != "overlap"}
    if opts.get("zero", 3) != 3:
        raise ConfigError("only zero: 3 runs for real (FSDP2 is ZeRO-3)", "parallelism.zero")
    model = model_from_spec(s.model_spec(), "model")
    plan = build_fsdp(model, nproc, opts)        # validates the options before starting ranks
    sizes = calibration_sizes([plan])
    results = run(model, nproc, [opts], steps=steps, warmup=warmup, local=True, timeout=timeout, calibrate=sizes)
    simulated, measured = collective_sequence(plan), measured_sequence(results)
    out = {"model": model.summary(), "nproc": nproc, "opts": opts, "sequence_match": simulated == measured,
           "simulated_sequence": simulated, "measured_sequence": measured, "measured_step_s": measured_step(results)}
    if sizes:
        out["predicted_step_s"] = predict(model, nproc, opts, calibrated_cluster(results, model, nproc))
        out["error_pct"] = 100.0 * (out["predicted_step_s"] / out["measured_step_s"] - 1)
    out["trace"] = to_trace(results)
    return out


def fsdp_cases(scenario, args) -> list[dict]:
    """`distlab validate --scenario fsdp.yaml` rows (runtime.measure.validation.case format): the step, predicted
    (calibrated here) against measured real FSDP2; each row also says whether the collective sequences match."""
    from distlab.runtime.commands.common import scenario_nproc
    nproc = scenario_nproc(args, 2)
    r = validate_fsdp(scenario, nproc=nproc, steps=max(getattr(args, "iters", 5), 2),
                      warmup=max(getattr(args, "warmup", 2), 1))
    nbytes = sum(b for _, b, _ in r["measured_sequence"])
    c = case("fsdp scenario", f"fsdp step ({len(r['measured_sequence'])} collectives)", nproc, nbytes,
             r.get("predicted_step_s", 0.0), r["measured_step_s"])
    c["sequence_match"] = r["sequence_match"]
    return [c]
