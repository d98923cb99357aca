"""The runtime's workloads: per parallelism, its real run and its validation cases (runtime/parallel/<name>/).

A workload is one folder ``runtime/parallel/<name>/`` holding ``run.py`` (the real run on torch.distributed ranks) and
``validate.py`` (calibrate, simulate the same step, compare); its record below is the only other place it
appears. ``distlab validate --scenario`` looks the scenario's workload up here (``scenario_workload``) and
calls its ``cases``; nothing else branches on the kind. Named like the simulator's workloads (sim/parallel/ddp, sim/parallel/fsdp,
sim/parallel/pipeline), so a scenario's workload name is the same on both sides.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from distlab.runtime.parallel.composed import run as composed_run
from distlab.runtime.parallel.composed import validate as composed_validate
from distlab.runtime.parallel.cp import run as cp_run
from distlab.runtime.parallel.cp import validate as cp_validate
from distlab.runtime.parallel.ddp import run as ddp_run
from distlab.runtime.parallel.ddp import validate as ddp_validate
from distlab.runtime.parallel.ep import run as ep_run
from distlab.runtime.parallel.ep import validate as ep_validate
from distlab.runtime.parallel.fsdp import run as fsdp_run
from distlab.runtime.parallel.fsdp import validate as fsdp_validate
from distlab.runtime.parallel.pipeline import run as pipeline_run
from distlab.runtime.parallel.pipeline import validate as pipeline_validate
from distlab.runtime.parallel.tp import run as tp_run
from distlab.runtime.parallel.tp import validate as tp_validate
from distlab.sim.errors import ConfigError


@dataclass(frozen=True)
class RuntimeWorkload:
    """One parallelism run for real. ``run`` launches gloo/NCCL ranks and returns their results; ``validate``
    runs a scenario for real and predicts it (a report dict); ``cases`` is the `distlab validate --scenario`
    hook: (the typed Scenario, parsed args) -> rows in runtime.measure.validation.case's format."""
    name: str
    summary: str
    run: Callable
    validate: Callable
    cases: Callable[[str, object], list]


WORKLOADS: dict[str, RuntimeWorkload] = {w.name: w for w in (
    RuntimeWorkload("ddp", "DistributedDataParallel: bucket launches and ends, step time", ddp_run.measure,
                    ddp_validate.validate_ddp, ddp_validate.ddp_cases),
    RuntimeWorkload("fsdp", "FSDP2 fully_shard: the collective sequence and the step time", fsdp_run.run,
                    fsdp_validate.validate_fsdp, fsdp_validate.fsdp_cases),
    RuntimeWorkload("pipeline", "torch.distributed.pipelining schedules: every action", pipeline_run.measure,
                    pipeline_validate.validate_pipeline, pipeline_validate.pipeline_cases),
    RuntimeWorkload("tp", "DTensor tensor parallelism (+ FSDP2 x TP): the collective sequence and the step time",
                    tp_run.run, tp_validate.validate_tp, tp_validate.tp_cases),
    RuntimeWorkload("cp", "context parallelism: torch's ring attention (+ FSDP2), collective sequence and step time",
                    cp_run.run, cp_validate.validate_cp, cp_validate.cp_cases),
    RuntimeWorkload("ep", "expert parallelism: all_to_all_single dispatch and combine with split sizes, step time",
                    ep_run.run, ep_validate.validate_ep, ep_validate.ep_cases),
    RuntimeWorkload("composed", "compositions as torchtitan builds them (pp, FSDP2/HSDP, tp): the collectives per "
                                "mesh dimension and the step time", composed_run.run,
                    composed_validate.validate_composed, composed_validate.composed_cases),
)}


def scenario_workload(spec, where: str) -> str:
    """The workload a scenario runs for real: ``parallelism.kind`` (the flat format), or the one top-level section
    named after a registered workload (the mesh format: ``mesh:`` plus ``ddp:``, ``fsdp:`` or ``pipeline:``).
    Anything else is a one-line ConfigError listing the allowed workloads."""
    allowed = ", ".join(WORKLOADS)
    if not isinstance(spec, dict):
        raise ConfigError(f"a scenario is a mapping with keys model, cluster and parallelism (or mesh and one "
                          f"section per parallelism); allowed workloads: {allowed}", where)
    if "parallelism" in spec:
        parallelism = spec["parallelism"]
        kind = parallelism.get("kind") if isinstance(parallelism, dict) else parallelism
        if kind not in WORKLOADS:
            raise ConfigError(f"scenario kind {kind!r} not supported yet; allowed: {allowed}", where)
        return kind
    from distlab.sim.workloads import composed
    from distlab.sim.workloads.registry import get, names as simulated
    sections = [name for name in spec if name in simulated()]
    implied = {composed.OWNER.get(k) for k in spec.get("mesh") or {}} - {None}
    if composed.is_composed(spec, sections, lambda name: get(name).dims) and (sections or len(implied) > 1):
        return "composed"                       # several sections, or a mesh of several parallelisms
    sections = [name for name in spec if name in WORKLOADS or name in simulated()]
    if len(sections) == 1 and sections[0] not in WORKLOADS:
        raise ConfigError(f"workload {sections[0]!r} is simulated but has no real run yet; allowed: {allowed}", where)
    if len(sections) != 1:
        found = f"sections {', '.join(sections)}" if sections else "no workload section"
        raise ConfigError(f"a real run needs exactly one workload section, found {found}; allowed: {allowed}",
                          where)
    return sections[0]


def scenario_cases(path: str, args, scenario=None) -> list[dict]:
    """`distlab validate --scenario` rows: run the scenario's workload for real, predict it on a cluster
    calibrated in the same launch (runtime/<name>/validate.py). ``scenario``: the file's typed Scenario, as
    `validate` parsed it (its ``workload`` names the runtime's); each workload's cases take it, never the file
    again. Without it the file is parsed here, once."""
    if scenario is None:
        from distlab.sim import scenario as sc
        scenario = sc.from_dict(path)
    if scenario.workload not in WORKLOADS:
        scenario_workload(scenario.source, path)          # the one-line refusal naming the allowed workloads
        raise ConfigError(f"workload {scenario.workload!r} has no real run yet; allowed: {', '.join(WORKLOADS)}",
                          path)
    return WORKLOADS[scenario.workload].cases(scenario, args)
