"""Real expert parallelism against the simulator: calibrate, simulate the same forward and backward, compare
(benchmarks/ep_accuracy.py, `distlab validate --scenario` of an ep scenario).

One launch of N gloo ranks (runtime/parallel/ep/run.py): even all_to_all_single calls of a few sizes are timed first;
then a probe (the first variant's model with balanced routing), then each variant, ``steps`` times each.
Fits, from the probe and the all_to_all timings only: the all_to_all's α and bandwidth (least squares of
t = α + (n-1)/n · S / B over the median time per size, the slowest rank's), and the FLOP rate F of this CPU
(bisection in log F until the simulated probe lasts as long as the measured one; the runtime's Python work per
op is folded into F). Each variant is then simulated (sim/parallel/ep/plan.py, forward and backward only) on the
fitted cluster, its ranks sharing the cores left to them (processor sharing, sim/kernel/cores.py; a skew leaves
the cold ranks idle in the all_to_all, so the hot rank gets more of the machine): predicted step vs measured
(the median over steps of the slowest rank's step); spread = the steps' (slowest - fastest) / median.
The prediction never sees the run it predicts.
"""
from __future__ import annotations

import statistics

from distlab.runtime.measure.validation import case
from distlab.sim.errors import ConfigError

SIZES = [1 << 14, 1 << 17, 1 << 20]


def fit_all_to_all(results: list[dict], n: int) -> dict:
    """calibration.collectives entry {all_to_all: {n: {latency_us, bandwidth_GBps}}} (module docstring)."""
    import numpy as np
    sizes = sorted(int(k) for k in results[0]["all_to_all_s"])
    times = [statistics.median(max(r["all_to_all_s"][str(s)][k] for r in results)
                               for k in range(len(results[0]["all_to_all_s"][str(s)]))) for s in sizes]
    A = np.array([[1.0, (n - 1) / n * s] for s in sizes])
    (alpha, inv_bw), *_ = np.linalg.lstsq(A, np.array(times), rcond=None)
    alpha, inv_bw = max(float(alpha), 1e-6), max(float(inv_bw), 1e-12)
    return {"all_to_all": {str(n): {"latency_us": alpha * 1e6, "bandwidth_GBps": 1 / inv_bw / 1e9}}}


def measured_steps(results: list[dict], variant: int) -> list[float]:
    """Per captured step, the slowest rank's step time."""
    steps = [r["variants"][variant]["steps"] for r in results]
    return [max(s[k]["time"] for s in steps) for k in range(len(steps[0]))]


def cluster_for(F: float, calibration: dict, n: int, cores: float | None = None):
    """n ranks on this machine: FLOP rate F per core, the fitted all_to_all, ``cores`` shared by the ranks'
    compute (processor sharing, sim/kernel/cores.py; None: a core each)."""
    from dataclasses import replace

    from distlab.sim.cluster import PRESETS
    base = replace(PRESETS["localhost-cpu"], gpus_per_node=n)      # n ranks on this one machine
    gpu = replace(base.gpu, name="this-cpu", tflops=F / 1e12, hbm_GBps=1e6, mfu=1.0)
    return replace(base, gpu=gpu, calibration={"collectives": calibration}, cpu_cores=cores)


def predict(model, skew: float, n: int, cluster) -> float:
    from distlab.sim.kernel.engine import simulate
    from distlab.sim.mesh import Mesh
    from distlab.sim.parallel.ep.plan import EPOptions, ep_plan
    return simulate(ep_plan(model, Mesh({"ep": n}), EPOptions(skew=skew), optimizer=False), cluster).makespan


def measure_and_predict(variants: list[dict], n: int, steps: int = 5, warmup: int = 1, timeout: float = 300.0,
                        probe_skew: float = 0.0, cores: float | None = None) -> dict:
    """{calibration, flop_rate, cores, load, rows: [{what, skew, predicted_s, measured_s, repeats, received}]} for
    ``variants`` [{model, skew}] on ``n`` gloo ranks (module docstring). ``cores``: the cores the ranks share
    (default: what runtime/measure/load.py finds left to them before the launch, when fewer than n)."""
    from distlab.runtime.parallel.ep.run import run
    from distlab.runtime.measure.load import sample
    load = sample()
    if cores is None and load is not None and load.available_cores < n:
        cores = load.available_cores
    probe = {"model": variants[0]["model"], "skew": probe_skew}
    results = run([probe] + variants, world=n, steps=steps, warmup=warmup, timeout=timeout, calibrate=SIZES)
    cal = fit_all_to_all(results, n)
    target = statistics.median(measured_steps(results, 0))
    lo, hi = 1e6, 1e14
    for _ in range(40):
        F = (lo * hi) ** 0.5
        lo, hi = (F, hi) if predict(probe["model"], probe_skew, n, cluster_for(F, cal, n, cores)) > target else (lo, F)
    cluster = cluster_for(F, cal, n, cores)
    rows = []
    for i, v in enumerate(variants, start=1):
        times = measured_steps(results, i)
        rows.append({"what": f"{v['model'].name} skew {v['skew']}", "skew": v["skew"],
                     "predicted_s": predict(v["model"], v["skew"], n, cluster), "measured_s": statistics.median(times),
                     "repeats": times, "received": results[0]["variants"][i]["received"]})
    return {"calibration": cal, "flop_rate": F, "probe_s": target, "cores": cores,
            "load": load.to_dict() if load else None, "rows": rows, "results": results}


def prepare(scenario, nproc: int):
    """(model, skew) of an ep scenario for ``nproc`` ranks; refuses what the real run cannot do."""
    from distlab.sim import scenario as sc
    s = sc.scenario_of(scenario)               # a Scenario as parsed (a mapping or a path: parsed here, once)
    if "ep" not in s.parallelisms:
        raise ConfigError("validate_ep needs a scenario with an ep: section", "ep")
    built = sc.build(s)                  # the scenario's own world: the model and options do not depend on it
    c = built.model.config
    ep_only = built.mesh.world_size == built.mesh.size("ep")
    if c.get("attention") != "none" or c.get("embed") or c.get("first_dense") or not ep_only:
        raise ConfigError("the real EP run has MoE layers alone on an ep mesh; allowed: model attention: none, "
                          "embed: false, first_dense: 0, mesh {ep: N}", "ep")
    from distlab.sim.parallel.ep.model import config_of
    from distlab.sim.parallel.ep.plan import check_ep
    check_ep(config_of(built.model), nproc, "nproc")
    return built.model, built.options.skew


def validate_ep(scenario, nproc: int = 4, steps: int = 5, warmup: int = 1, timeout: float = 300.0) -> dict:
    model, skew = prepare(scenario, nproc)
    return measure_and_predict([{"model": model, "skew": skew}], nproc, steps, warmup, timeout)


def ep_cases(scenario, args) -> list[dict]:
    """`distlab validate --scenario ep.yaml` rows (runtime.measure.validation.case format): the step, predicted vs
    measured."""
    from distlab.runtime.commands.common import scenario_nproc
    nproc = scenario_nproc(args, 4)
    r = validate_ep(scenario, nproc=nproc, steps=max(getattr(args, "iters", 5), 2),
                    warmup=max(getattr(args, "warmup", 1), 1))
    return [case("ep scenario", row["what"], nproc, 0, row["predicted_s"], row["measured_s"], row["repeats"])
            for row in r["rows"]]
