"""Real tensor parallelism against the simulator: calibrate, simulate the same step, compare
(`distlab validate --scenario tp.yaml`).

``validate_tp`` builds the scenario's plan for ``nproc`` ranks (sim.scenario.build: TP, FSDP2 x TP when the
mesh leaves a dp_shard dimension, HSDP x TP, DDP x TP, PP x TP on (pp, tp)), runs the same model with DTensor ``parallelize_module`` (runtime/parallel/tp/run.py)
on gloo ranks with the calibration rounds of runtime/parallel/tp/calibrate.py in the same launch, simulates the plan on
the fitted cluster, and reports: the step (median over uncaptured steps of the slowest rank) predicted vs
measured; per
collective kind and size on rank 0, the time of one call predicted (simulated trace) vs measured (issue to
``wait_tensor``, median over steps of the mean over calls); and whether the collective sequence (kind, bytes,
dtype, group, phase) of every rank equals the plan's.
"""
from __future__ import annotations

import statistics

from distlab.runtime.measure.validation import case
from distlab.sim.compute import op_seconds
from distlab.sim.errors import ConfigError


def _sequence(plan, rank: int) -> list[tuple]:
    from distlab.sim.parallel.tp import compose
    from distlab.sim.parallel.tp import plan as tp_plan
    fsdp = plan.meta.get("builder") == "fsdp_tp" or "fsdp" in plan.meta.get("builder", "").split("_")
    fn = compose.collective_sequence if fsdp else tp_plan.collective_sequence
    return fn(plan, rank)


def prepare(scenario, nproc: int):
    """(built scenario Result, the run's variant, calibration sizes) for ``nproc`` ranks; refuses what the real
    run cannot do (recomputation, mesh dimensions it does not build) before starting ranks."""
    from distlab.runtime.parallel.tp.calibrate import plan_sizes
    from distlab.sim import scenario as sc
    s = sc.on_world(scenario, nproc)            # a Scenario as parsed (a mapping or a path: parsed here, once)
    if "tp" not in s.parallelisms:
        raise ConfigError("validate_tp needs a scenario with a tp: section", "tp")
    built = sc.build(s)
    opts, mesh = built.options, built.mesh
    if opts.recompute != "none":
        raise ConfigError(f"the real run does not recompute activations; got recompute {opts.recompute!r}; "
                          "allowed for a real run: none", "tp.recompute")
    extra = [k for k in mesh.names if k not in ("tp", "dp_shard", "dp", "dp_replicate", "pp")]
    if extra:
        raise ConfigError(f"the real TP run has mesh dimensions tp, dp_shard, dp_replicate, dp and pp only; got "
                          f"{', '.join(extra)}",
                          "mesh")
    if "pp" in mesh and (opts.schedule not in ("gpipe", "1f1b") or opts.virtual_stages != 1 or opts.split):
        raise ConfigError(f"the real PP x TP run has one stage per rank, split evenly, under gpipe or 1f1b; got "
                          f"schedule {opts.schedule}, virtual_stages {opts.virtual_stages}, split {opts.split}; "
                          "allowed for a real run: schedule gpipe or 1f1b, virtual_stages 1, split none", "tp.schedule")
    if "pp" in mesh and (len(mesh.names) != 2 or opts.loss_parallel):
        raise ConfigError("the real PP x TP run has mesh dimensions pp and tp only, without loss parallel; got "
                          f"{', '.join(mesh.names)}", "mesh")
    variant = {"model": built.model, "sequence_parallel": opts.sequence_parallel,
               "loss_parallel": opts.loss_parallel, "mesh": [[k, v] for k, v in mesh.as_dict().items()],
               "schedule": opts.schedule, "microbatches": opts.microbatches}
    return built, variant, plan_sizes(built.plan)


def validate_tp(scenario, nproc: int = 2, steps: int = 5, warmup: int = 1, timeout: float = 300.0) -> dict:
    """Run the scenario for real on ``nproc`` gloo ranks and compare (:func:`compare`)."""
    from distlab.runtime.measure import load
    from distlab.runtime.parallel.tp.run import run
    built, variant, sizes = prepare(scenario, nproc)
    before = load.sample()
    results = run([variant], world=nproc, steps=steps, warmup=warmup, timeout=timeout, calibrate=sizes)
    return compare(built, results, before.effective_cores(nproc) if before else None)


def timed_plan(built, overhead: float = 0.0, fsdp_host: tuple[float, float] = (0.0, 0.0), ends: dict | None = None,
               optimizer: float | None = None):
    """The plan whose time is predicted: the scenario's, except FSDP2 x TP with FSDP2 on one stream
    (FSDPOptions overlap false: on CPU with gloo every FSDP2 collective blocks) and FSDP2's host CPU per unit,
    ``fsdp_host`` = (forward, backward) seconds (runtime/parallel/tp/fit.py fsdp_host), as a Compute before each
    unit's forward all-gather and each reduce-scatter; and PP x TP with the pipelining runtime's ``overhead``
    seconds after each action (runtime/parallel/tp/pipeline.py RuntimeProbe); with ``ends`` ({"END PHASE": seconds},
    runtime/parallel/tp/ends.py ends_host) the ends' host CPU after their compute ops; with ``optimizer`` (seconds per
    DTensor parameter, runtime/parallel/tp/fit.py optimizer_host) AdamW's host CPU measured on DTensors
    (:func:`with_optimizer_host`); the same collectives."""
    from distlab.runtime.parallel.tp.ends import with_ends_host
    plan = with_ends_host(_timed_plan(built, overhead, fsdp_host), ends or {})
    return plan if optimizer is None else with_optimizer_host(plan, optimizer)


def with_optimizer_host(plan, per_param: float):
    """``plan`` with each "optimizer" Compute's DTensor ops (launches x launch_s: ADAMW_DTENSOR_OPS per DTensor
    parameter, sim/parallel/tp/plan.py, priced at the TP block's rate) replaced by a Compute "optimizer host" of
    ``per_param`` seconds per DTensor parameter after it (AdamW's elementwise ops on DTensors cost less host CPU
    than a TP block's ops, which carry hooks and redistributions); its roofline (flops, bytes) stays."""
    from dataclasses import replace

    from distlab.sim.plan import Compute, Plan
    from distlab.sim.parallel.tp.plan import ADAMW_DTENSOR_OPS
    ranks = []
    for ops in plan.ranks:
        out = []
        for o in ops:
            if isinstance(o, Compute) and o.name == "optimizer" and o.launches:
                out += [replace(o, launches=0),
                        Compute("optimizer host", seconds=per_param * o.launches / ADAMW_DTENSOR_OPS, stream=o.stream)]
            else:
                out.append(o)
        ranks.append(out)
    return Plan(ranks, name=plan.name, meta=plan.meta).validate()


def _timed_plan(built, overhead: float, fsdp_host: tuple[float, float]):
    if built.workload.name == "composed":      # sim/workloads/composed.py: FSDP2 on one stream (gloo blocks)
        from dataclasses import replace

        from distlab.sim.parallel.parallelize import parallelize
        par = replace(built.options, fsdp=replace(built.options.fsdp, overlap=False)) if built.options.fsdp \
            else built.options
        plan = parallelize(built.model, built.mesh, par, overhead=overhead)
        return with_fsdp_host(plan, *fsdp_host) if any(fsdp_host) else plan
    if built.plan.meta.get("builder") == "pp_tp" and overhead:
        from distlab.sim.parallel.pipeline.plan import PipelineSpec
        from distlab.sim.parallel.tp.pipeline import pp_tp_plan
        o, mesh = built.options, built.mesh
        spec = PipelineSpec(schedule=o.schedule, stages=mesh.size("pp"), microbatches=o.microbatches,
                            data_parallel=mesh.size("dp") if "dp" in mesh else 1)
        return pp_tp_plan(built.model, mesh, spec, o, overhead=overhead)
    if built.plan.meta.get("builder") != "fsdp_tp":
        return built.plan
    from distlab.sim.parallel.fsdp.plan import FSDPOptions
    from distlab.sim.parallel.tp.compose import fsdp_tp_plan
    plan = fsdp_tp_plan(built.model, built.mesh, FSDPOptions(overlap=False), built.options)
    return with_fsdp_host(plan, *fsdp_host) if any(fsdp_host) else plan


def with_fsdp_host(plan, forward_s: float, backward_s: float):
    """``plan`` with a Compute "fsdp host UNIT forward" of ``forward_s`` before each unit's forward all-gather
    and "fsdp host UNIT backward" of ``backward_s`` before each reduce-scatter (on the collective's stream)."""
    from distlab.sim.plan import Collective, Compute, Plan
    ranks = []
    for ops in plan.ranks:
        out = []
        for o in ops:
            if isinstance(o, Collective) and o.op == "all_gather" and o.name.endswith(" forward") \
                    and not o.name.startswith("tp "):
                out.append(Compute(f"fsdp host {o.name.split()[1]} forward", seconds=forward_s, stream=o.stream))
            elif isinstance(o, Collective) and o.op == "reduce_scatter" and not o.name.startswith("tp "):
                out.append(Compute(f"fsdp host {o.name.split()[1]} backward", seconds=backward_s, stream=o.stream))
            out.append(o)
        ranks.append(out)
    return Plan(ranks, name=plan.name, meta=plan.meta).validate()


def compare(built, results: list[dict], cores: float | None = None) -> dict:
    """Report dict from a launch whose first variant is the scenario's, run with calibration: rows [{what, op,
    bytes, calls, predicted_s, measured_s, repeats}; the step's also predicted_without_comm_cpu_s: the collectives'
    CPU work left out, sim/kernel/cores.py], sequence_match, the plan, the fitted cluster (``cores``:
    the cores the ranks shared, runtime/measure/load.py effective_cores; None: the machine's), results, ``parts``:
    rank 0's step predicted and measured in parts (:func:`parts`), and ``pipeline_overhead_s`` (PP x TP: the
    pipelining runtime's CPU per action, timed_plan), ``ends_host_s`` (runtime/parallel/tp/ends.py ends_host) and
    ``actions`` (PP x TP: :func:`action_spans`)."""
    from distlab.runtime.parallel.tp.fit import fit_cluster
    from distlab.runtime.parallel.tp.run import measured_sequence
    from distlab.sim.kernel.engine import simulate
    mesh, model, nproc = built.mesh, built.model, built.mesh.world_size
    tp_opts = built.options.tp if built.workload.name == "composed" else built.options
    group = mesh.size("tp") if "tp" in mesh else mesh.size("dp_shard")       # the calibration's group
    cluster = fit_cluster(results, model, group, nproc, tp_opts is None or tp_opts.sequence_parallel, cores)
    from distlab.runtime.parallel.tp.ends import ends_host
    from distlab.runtime.parallel.tp.fit import fsdp_host, optimizer_host, pipeline_overhead
    overhead, ends = pipeline_overhead(results), ends_host(results, cluster.gpu.launch_s)
    timed = timed_plan(built, overhead, fsdp_host(results), ends, optimizer_host(results))
    trace = simulate(timed, cluster, record_transfers=False)
    from dataclasses import replace
    without = simulate(timed, replace(cluster, comm_cpu_s=0.0, comm_cpu_s_per_byte=0.0), record_transfers=False)
    match = all([c for c in measured_sequence(results, 0, r) if c[0] not in ("send", "recv")]
                == _sequence(built.plan, r) for r in range(nproc))
    step_times = [max(r["variants"][0]["steps"][i]["plain_time"] for r in results)
                  for i in range(min(len(r["variants"][0]["steps"]) for r in results))]
    seq = _sequence(built.plan, 0)
    rows = [{"what": f"tp step ({len(seq)} collectives per rank)", "op": None, "bytes": sum(s[1] for s in seq),
             "calls": 1, "predicted_s": trace.makespan, "measured_s": statistics.median(step_times),
             "predicted_without_comm_cpu_s": without.makespan,
             "repeats": step_times}]
    rows += _collective_rows(trace, results)
    return {"rows": rows, "sequence_match": match, "plan": built.plan, "cluster": cluster, "results": results,
            "mesh": mesh.as_dict(), "model": model, "parts": parts(timed, trace, cluster, results),
            "pipeline_overhead_s": overhead, "fsdp_host_s": fsdp_host(results), "ends_host_s": ends,
            "actions": action_spans(timed, trace, results)}


def parts(plan, trace, cluster, results: list[dict]) -> dict:
    """Rank 0's step in parts, {"predicted": {...}, "measured": {...}} in seconds: ``comm`` (collectives of the
    forward and backward: simulated spans; measured issue to wait in the captured steps), ``compute`` (the rest
    of the forward and backward: measured, the uncaptured step's forward+backward minus that comm; predicted
    also split out: ``host``, DTensor dispatch, launches x launch_s, as the engine ran it), ``optimizer`` (the
    optimizer phase with its collectives; measured in the uncaptured steps) and ``step``; measured: medians
    over the steps. A pipeline rank has no phases: the step alone."""
    from distlab.sim.parallel.tp.plan import PHASES
    pred = {"comm": 0.0, "compute": 0.0, "host": 0.0, "optimizer": 0.0, "step": trace.makespan}
    ops = plan.ranks[0]
    for o in trace.for_rank(0):
        op = ops[o.index]
        if o.kind == "collective" and PHASES.get(o.name.rsplit(" ", 1)[-1]) == "optimizer" or \
                o.kind == "compute" and op.name in ("optimizer", "optimizer host"):
            pred["optimizer"] += o.duration
        elif o.kind == "collective":
            pred["comm"] += o.duration
        elif o.kind == "compute" and op.name == "runtime":         # PP x TP: the pipelining runtime's own work
            pred["runtime"] = pred.get("runtime", 0.0) + o.duration
        elif o.kind == "compute":
            pred["compute"] += o.duration
            alone = op.launches and cluster.gpu.launch_s and op.launches * cluster.gpu.launch_s
            pred["host"] += o.duration * alone / op_seconds(op, cluster.gpu) if alone else 0.0
    steps = next(r for r in results if r["rank"] == 0)["variants"][0]["steps"]
    meas = {"step": statistics.median(s.get("plain_time", s["time"]) for s in steps)}
    if steps[0].get("plain_phases"):
        comm = [sum(b - a for c, (a, b) in zip(s["calls"], s["spans"]) if c[-1] != "optimizer") for s in steps]
        meas["comm"] = statistics.median(comm)
        meas["compute"] = statistics.median(sum(s["plain_phases"][:2]) - c for s, c in zip(steps, comm))
        meas["optimizer"] = statistics.median(s["plain_phases"][2] for s in steps)
    return {"predicted": pred, "measured": meas}


def action_spans(plan, trace, results: list[dict]) -> dict:
    """PP x TP: {rank: [[action, measured start, end, CPU, predicted start, end], ...]} in seconds from the step's
    start, per action in the rank's order: measured, the median over the uncaptured steps of the stage's forward or
    backward chunk (runtime/parallel/tp/pipeline.py ``plain_actions``: the chunk itself, without the wait for its input;
    CPU: the rank's main thread in it); predicted, the action's compute and collectives in the trace (the ops
    between two "runtime" ops, without the receive before them). {} for other plans."""
    measured = {r["rank"]: r["variants"][0]["steps"] for r in results}
    if not all(s and s[0].get("plain_actions") for s in measured.values()):
        return {}
    out = {}
    for rank, steps in sorted(measured.items()):
        spans, cur = [], []
        for o in trace.for_rank(rank):
            op = plan.ranks[rank][o.index]
            if o.kind == "compute" and op.name == "runtime":
                spans.append((min(c.start for c in cur), max(c.end for c in cur)) if cur else (o.start, o.start))
                cur = []
            elif o.kind in ("compute", "collective"):
                cur.append(o)
        rows = []
        for i, (a, b) in enumerate(spans[:len(steps[0]["plain_actions"])]):
            kind, mb = steps[0]["plain_actions"][i][:2]
            med = [statistics.median(s["plain_actions"][i][k] for s in steps) for k in (2, 3, 4)]
            rows.append([f"{kind}{mb}", *med, a, b])
        out[rank] = rows
    return out


def _collective_rows(trace, results: list[dict]) -> list[dict]:
    """Per (op, bytes) on rank 0: one call's predicted and measured seconds (see the module docstring)."""
    predicted: dict = {}
    for o in trace.for_rank(0):
        if o.kind == "collective":
            predicted.setdefault((o.op, o.bytes), []).append(o.end - (o.start if o.launch is None else o.launch))
    rank0 = next(r for r in results if r["rank"] == 0)["variants"][0]["steps"]
    per_step: dict = {}
    for st in rank0:
        spans: dict = {}
        for (kind, nbytes, *_), (a, b) in zip(st["calls"], st["spans"]):
            spans.setdefault((kind, nbytes), []).append(b - a)
        for key, v in spans.items():
            per_step.setdefault(key, []).append(statistics.mean(v))
    rows = []
    for key in sorted(predicted, key=lambda k: (k[0], k[1])):
        if key in per_step:
            rows.append({"what": f"tp {key[0]} (one call)", "op": key[0], "bytes": key[1],
                         "calls": len(predicted[key]), "predicted_s": statistics.mean(predicted[key]),
                         "measured_s": statistics.median(per_step[key]), "repeats": per_step[key]})
    return rows


def tp_cases(scenario, args) -> list[dict]:
    """`distlab validate --scenario tp.yaml` rows (runtime.measure.validation.case format): the step and one row per
    collective kind and size, predicted (calibrated in the same launch) against measured real DTensor TP; each
    row also says whether the collective sequences match."""
    from distlab.runtime.commands.common import scenario_nproc
    nproc = scenario_nproc(args, 2)
    r = validate_tp(scenario, nproc=nproc, steps=max(getattr(args, "iters", 5), 2),
                    warmup=max(getattr(args, "warmup", 1), 1))
    return rows_as_cases(r, nproc)


def rows_as_cases(r: dict, nproc: int) -> list[dict]:
    """A :func:`compare` report as runtime.measure.validation.case rows."""
    out = []
    for row in r["rows"]:
        what = row["what"] if row["op"] is None else f"{row['what']} x{row['calls']}"
        c = case("tp scenario", what, nproc, row["bytes"], row["predicted_s"], row["measured_s"], row["repeats"])
        c["sequence_match"] = r["sequence_match"]
        out.append(c)
    return out
