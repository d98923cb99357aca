"""Pipeline scenarios beyond one simulation: ``sweep_results`` (lesson 07, `--sweep` on a pipeline scenario:
makespan, bubble, samples/s = m x micro-batch x d / makespan, peak activations per value) and ``spec_of``
(the PipelineSpec of a scenario, for the runtime). The workload itself is sim/workloads/pipeline.py; these sit
above it and the scenario, never in sim/parallel/ (tests/test_import_graph.py: sim/parallel/ never imports the
scenario or the workloads)."""
from __future__ import annotations

from distlab.sim import scenario as sc
from distlab.sim.parallel.pipeline.plan import PipelineSpec
from distlab.sim.workloads.pipeline import sweep_figure, sweep_row  # noqa: F401 (sweep_figure re-exported)


def spec_of(scenario) -> PipelineSpec:
    """The PipelineSpec of a pipeline scenario (a Scenario, a mapping or a path): stages and data_parallel from
    its completed mesh."""
    s = sc.scenario_of(scenario, "pipeline")
    return s.parallelisms["pipeline"].spec(s.device_mesh()).check()


def sweep_results(base, key: str, values: list) -> list[dict]:
    """Simulate ``base`` (a Scenario, a mapping or a path) with ``key`` (an option, a mesh dim, or stages /
    data_parallel) = each value."""
    s = sc.scenario_of(base, "sweep")
    out = []
    for v in values:
        r = sc.simulate(sc.vary(s, key, v), f"--sweep {key}={v}")
        out.append({key: v, **sweep_row(r), "model": r.model.name, "cluster": r.cluster.name,
                    "world_size": r.plan.world_size})
    return out
