"""Predicted (sim.engine on a calibrated cluster) against measured (real ranks), case by case.

Cases: held-out collective sizes at the calibrated world sizes, held-out world sizes (the calibration
interpolated in n), and a plan whose compute overlaps its all-reduces on two streams (a DDP-like backward:
layer i's compute, then Record; the comm stream Waits and all-reduces layer i's gradient). Compute speed is
measured at each world size, since CPU ranks share cores; the communication of every case is held out.
A collective's measured time is from its launch (last rank's arrival) to the last rank's end, which is what
the simulator's one-collective makespan means (runtime/measure/sweep.py).
error = (predicted - measured) / measured, with measured the median over the repeats; next to it, where
the repeats are known, ``worst_error`` (the repeat farthest from the prediction), ``spread``
((slowest - fastest) / median of the repeats) and ``noise`` (the median's standard error, relative; what
runtime/measure/trust.py judges a case by; runtime/measure/robust.py median_noise), so a case whose repeats scatter or whose median hides a slow tail says so. The summary gives the median and the worst |error| per kind and world size. The workloads' scenario cases
(runtime/<name>/validate.py) build their rows with ``case``; runtime/parallel/registry.py picks the workload of a scenario.
"""
from __future__ import annotations

import statistics

from distlab.sim.plan import Collective, Compute, Plan, Record, Wait


def overlap_plan(n: int, layers: int = 4, flops: float = 4e8, nbytes: int = 4 * 2**20) -> Plan:
    """``layers`` x (compute of ``flops`` on 'compute', all_reduce of ``nbytes`` on 'comm' once it is done)."""
    ops = []
    for i in range(layers):
        ops += [Compute(name=f"bwd{i}", flops=flops), Record(f"grad{i}", stream="compute"),
                Wait(f"grad{i}", stream="comm"), Collective("all_reduce", nbytes, name=f"ar{i}", stream="comm")]
    return Plan([list(ops) for _ in range(n)], name=f"overlap-{n}", meta={"layers": layers, "flops": flops,
                                                                         "bytes": nbytes}).validate()


def cluster_for(calibration: dict, compute: dict, n: int, backend: str, cpu_cores: float | None = None):
    """The calibrated cluster; ``cpu_cores``: the cores CPU ranks share (runtime/measure/load.py effective_cores(n)),
    None = one each."""
    from distlab.runtime.measure.fit import calibrated_cluster
    return calibrated_cluster(calibration, compute, n, backend, cpu_cores if backend == "gloo" else None)


def roofline_cluster(work: list[tuple[float, float]], measured_s: float, bytes_per_s: float, world: int,
                     collectives: dict):
    """localhost-cpu sized to ``world`` with the FLOP rate F at which the roofline total of ``work`` ((flops,
    bytes) per compute op: max(flops / F, bytes / M)) equals ``measured_s`` (bisection in log F; the total falls
    as F grows), memory rate M = ``bytes_per_s`` and the fitted ``collectives``."""
    from dataclasses import replace

    from distlab.sim.cluster import PRESETS
    lo, hi = 1e6, 1e15
    for _ in range(100):
        F = (lo * hi) ** 0.5
        lo, hi = (F, hi) if sum(max(f / F, b / bytes_per_s) for f, b in work) > measured_s else (lo, F)
    base = PRESETS["localhost-cpu"].with_world_size(world)
    gpu = replace(base.gpu, name="this-cpu", tflops=F / 1e12, hbm_GBps=bytes_per_s / 1e9, mfu=1.0)
    return replace(base, gpu=gpu, calibration={"collectives": collectives})


def collective_cases(rows: list[dict], calibration: dict, compute: dict, backend: str, kind: str,
                     cpu_cores: float | None = None) -> list[dict]:
    """One case per measured row: predicted by simulating that one collective on the calibrated cluster."""
    from distlab.sim.kernel.engine import simulate_collective
    out = []
    for r in rows:
        if r["op"] == "barrier":
            continue
        n = r["world_size"]
        cluster = cluster_for(calibration, compute, n, backend, cpu_cores)
        trace, _ = simulate_collective(r["op"], r["bytes"], cluster)
        out.append(case(kind, r["op"], n, r["bytes"], trace.makespan, r.get("launch_time_s", r["time_s"]),
                        r.get("launch_times_s", r.get("times_s"))))
    return out


def overlap_case(plan: Plan, results: list, calibration: dict, compute: dict, backend: str,
                 cpu_cores: float | None = None) -> dict:
    """The overlap plan: simulated makespan against the median measured makespan over the repeats. Compute speed
    and ``interference`` (compute's slowdown while an all_reduce is in flight, sim/kernel/cores.py) come from the probe
    rounds run between the plan's runs (``compute["during_plan"]``, runtime/measure/compute_probe.py) where there are
    some: on a shared machine the load then is the load the runs had; the plan's own times are never used.
    ``comm_interference`` (the all_reduce's slowdown while every rank computes) comes from the same rounds.
    ``error_without_interference``: the error of the same prediction with both factors 1 (what they change);
    ``error_without_comm_interference``: with comm_interference 1 only."""
    from distlab.runtime.execute.executor import merge_results
    from distlab.sim.kernel.engine import simulate
    n = plan.world_size
    compute = probe_compute(compute)
    spans = [merge_results(plan, results, run=k).makespan for k in range(len(results[0]["runs"]))]
    cluster = cluster_for(calibration, compute, n, backend, cpu_cores)
    predicted = simulate(plan, cluster, record_transfers=False).makespan
    c = case("overlap plan", "compute+all_reduce", n, plan.meta["bytes"], predicted, statistics.median(spans),
             spans)
    from dataclasses import replace
    without = simulate(plan, replace(cluster, interference=1.0, comm_interference=1.0),
                       record_transfers=False).makespan
    without_comm = simulate(plan, replace(cluster, comm_interference=1.0), record_transfers=False).makespan
    c.update(measured_runs_s=spans, interference=cluster.interference, flops_per_s=compute["flops_per_s"],
             comm_interference=cluster.comm_interference,
             error_without_interference=(without - c["measured_s"]) / c["measured_s"],
             error_without_comm_interference=(without_comm - c["measured_s"]) / c["measured_s"])
    return c


def probe_compute(compute: dict) -> dict:
    """The measured compute the overlap plan is predicted with: ``compute`` with the rate and both factors of
    the probe rounds run between the plan's runs (``compute["during_plan"]``), where there are some."""
    during = compute.get("during_plan")
    if not during:
        return compute
    return {**compute, "flops_per_s": during["flops_per_s"], "interference": during["interference"],
            "comm_interference": during.get("comm_interference", 1.0), "comm_alone_s": during.get("comm_alone_s")}


def case(kind: str, what: str, n: int, nbytes: int, predicted: float, measured: float,
         repeats: list[float] | None = None) -> dict:
    """One row: error = (predicted - measured) / measured; with the repeats' times, their fastest and slowest,
    spread = (slowest - fastest) / measured and worst_error = the repeat's error of largest magnitude."""
    c = {"kind": kind, "case": what, "world_size": n, "bytes": nbytes, "predicted_s": predicted,
         "measured_s": measured, "error": (predicted - measured) / measured}
    if repeats:
        errors = [(predicted - t) / t for t in repeats]
        c.update(repeats=len(repeats), measured_min_s=min(repeats), measured_max_s=max(repeats),
                 spread=(max(repeats) - min(repeats)) / measured, worst_error=max(errors, key=abs))
        if len(repeats) >= 3:
            from distlab.runtime.measure.robust import median_noise
            c["noise"] = median_noise(repeats)
    return c



NOISE_RESAMPLES = 20         # bootstrap resamples behind a held-out figure's noise (~0.05 s each on a CPU)


def held_out_cases(measured: dict, calib, held, nprocs, backend: str, cores: dict) -> tuple[dict, list[dict]]:
    """(calibration, cases): the ring model fitted to the ``calib`` sizes of the calibrated world sizes
    ``nprocs``, and one case per ``held`` size row of every measured world size (``measured``: n -> the ranks'
    results of runtime/measure/calibration.py measure; ``cores``: n -> the cpu_cores the simulator is given)."""
    from distlab.runtime.measure.fit import calibration_from_rows
    calibration = calibration_from_rows([r for n in nprocs if n in measured for r in measured[n][0]["rows"]
                                         if r["bytes"] in calib])
    cases = []
    for n, results in measured.items():
        rows = [r for r in results[0]["rows"] if r["bytes"] in held]
        cases += collective_cases(rows, calibration, results[0]["compute"], backend,
                                  "held-out size" if n in nprocs else "held-out world size", cores.get(n))
    return calibration, cases


def summary_noise(measured: dict, calib, held, nprocs, backend: str, cores: dict,
                  resamples: int = NOISE_RESAMPLES, seed: int = 0) -> dict:
    """{(kind, world size): noise}: how far the held-out median |error| moves with the timing noise of this one
    run. Each resample draws every row's samples again with replacement (the bootstrap; Efron & Tibshirani, "An
    Introduction to the Bootstrap", 1993), refits the calibration and recomputes the cases; noise = half the
    range from the 10th to the 90th percentile of the resamples' median |error| (1.28 sigma for normal
    noise). A spread, not an interval around the figure: resampling adds noise, which biases |error| upward.
    Samples of one round are drawn independently, so load that slows a whole round is under-counted."""
    import random

    import numpy as np
    rng = random.Random(seed)
    figures: dict = {}
    for _ in range(resamples):
        again = {}
        for n, results in measured.items():
            rows = []
            for r in results[0]["rows"]:
                x = r.get("launch_times_s") or r.get("times_s") or [r.get("launch_time_s", r["time_s"])]
                x = [rng.choice(x) for _ in x]
                rows.append({**r, "launch_times_s": x, "launch_time_s": statistics.median(x)})
            again[n] = [{**results[0], "rows": rows}]
        for s in summarize(held_out_cases(again, calib, held, nprocs, backend, cores)[1]):
            figures.setdefault((s["kind"], s["world_size"]), []).append(s["median_abs_error"])
    return {k: float(np.percentile(v, 90) - np.percentile(v, 10)) / 2 for k, v in figures.items()}


def summarize(cases: list[dict]) -> list[dict]:
    """Per (kind, world size), and over all held-out collective sizes: the median and the worst |error| of
    the cases (error of the median), with the case that has the worst one."""
    groups: dict[tuple, list[dict]] = {}
    for c in cases:
        groups.setdefault((c["kind"], c["world_size"]), []).append(c)
    sizes = [c for c in cases if c["kind"] == "held-out size"]
    rows = [_summary(k, n, v) for (k, n), v in sorted(groups.items())]
    return rows + ([_summary("held-out size", "all", sizes)] if sizes else [])


def _summary(kind: str, n, group: list[dict]) -> dict:
    from distlab.sim.plan import format_bytes
    worst = max(group, key=lambda c: abs(c["error"]))
    return {"kind": kind, "world_size": n, "cases": len(group),
            "median_abs_error": statistics.median(abs(c["error"]) for c in group),
            "worst_abs_error": abs(worst["error"]),
            "worst_case": f"{worst['case']} {format_bytes(worst['bytes'])} on {worst['world_size']} ranks"}


def scenario_kind(spec: dict):
    """``parallelism.kind`` of a flat-format scenario (for messages), else the names of its sections."""
    parallelism = spec.get("parallelism")
    return parallelism.get("kind") if isinstance(parallelism, dict) else parallelism or ", ".join(spec)


def workload_section(spec: dict, name: str) -> dict | None:
    """A scenario's options for workload ``name``, without ``kind``: its ``parallelism`` mapping when that says
    ``kind: name`` (the flat format), else its top-level ``name:`` section (the mesh format: ``mesh:`` plus one
    section per parallelism); None when it has neither."""
    parallelism = spec.get("parallelism")
    if isinstance(parallelism, dict) and parallelism.get("kind") == name:
        return {k: v for k, v in parallelism.items() if k != "kind"}
    section = spec.get(name)
    if name in spec and (section is None or isinstance(section, dict)):
        return dict(section or {})
    return None


def plot(cases: list[dict], path: str) -> None:
    """Write ``figure(cases)`` to ``path``."""
    from distlab.sim.io import save_figure
    save_figure(figure(cases), path)


def figure(cases: list[dict]):
    """Predicted against measured (log-log), the y = x line and a +-20% band; an untrusted case
    (runtime/measure/trust.py) hollow."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 5))
    markers = {"held-out size": "o", "held-out world size": "s", "overlap plan": "*"}
    colors = {2: "#1f77b4", 3: "#2ca02c", 4: "#d62728"}
    for c in cases:
        color = colors.get(c["world_size"], "#555555")
        ax.scatter(c["measured_s"] * 1e3, c["predicted_s"] * 1e3, marker=markers.get(c["kind"], "x"),
                   color=color, facecolors=color if c.get("trusted", True) else "none",
                   s=40 if c["kind"] != "overlap plan" else 120)
    lo = min(min(c["measured_s"], c["predicted_s"]) for c in cases) * 1e3 / 1.5
    hi = max(max(c["measured_s"], c["predicted_s"]) for c in cases) * 1e3 * 1.5
    xs = [lo, hi]
    ax.plot(xs, xs, color="black", lw=1)
    ax.fill_between(xs, [x * 0.8 for x in xs], [x * 1.2 for x in xs], color="grey", alpha=0.2, label="+-20%")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured (ms)")
    ax.set_ylabel("predicted (ms)")
    for kind, m in markers.items():
        ax.scatter([], [], marker=m, color="grey", label=kind)
    for n, col in colors.items():
        if any(c["world_size"] == n for c in cases):
            ax.scatter([], [], marker="o", color=col, label=f"{n} ranks")
    if any(not c.get("trusted", True) for c in cases):
        ax.scatter([], [], marker="o", color="grey", facecolors="none", label="not trustworthy (spread)")
    ax.plot([], [], color="black", lw=1, label="predicted = measured")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title("distlab validate: simulated against measured")
    ax.grid(True, alpha=0.3, which="both")
    fig.tight_layout()
    return fig

