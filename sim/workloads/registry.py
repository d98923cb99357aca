"""The workload registry: name -> record (sim/workloads/base.py). A new parallelism is one module with a
``WORKLOAD`` record and one line in BUILTIN (or ``register(record)`` at run time)."""
from __future__ import annotations

from distlab.sim.errors import ConfigError
from distlab.sim.workloads import cp, ddp, ep, fsdp, pipeline, tp
from distlab.sim.workloads.base import Workload

# a scenario's own keys (sim/scenario.py); a workload's section key is its name, so names must differ from these
SCENARIO_KEYS = ("name", "description", "model", "mesh", "cluster", "nodes", "world_size", "global_batch",
                 "stragglers", "degraded_links", "fp8_recipe")
BUILTIN = (ddp.WORKLOAD, fsdp.WORKLOAD, pipeline.WORKLOAD, tp.WORKLOAD, cp.WORKLOAD, ep.WORKLOAD)
REGISTRY: dict[str, Workload] = {w.name: w for w in BUILTIN}


def register(workload: Workload) -> Workload:
    """Add ``workload`` (its name must be new and must not be a scenario key)."""
    if workload.name in REGISTRY or workload.name in SCENARIO_KEYS + ("parallelism",):
        raise ValueError(f"workload name {workload.name!r} is taken")
    REGISTRY[workload.name] = workload
    return workload


def unregister(name: str) -> None:
    REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def get(name: str, where: str = "scenario") -> Workload:
    if name not in REGISTRY:
        raise ConfigError(f"unknown parallelism {name!r}; allowed: {', '.join(REGISTRY)}", where)
    return REGISTRY[name]


def mesh_dims() -> tuple[str, ...]:
    """Every mesh dimension some workload uses, in registration order."""
    out: list[str] = []
    for w in REGISTRY.values():
        out += [d for d in w.dims if d not in out]
    return tuple(out)


def sweep_keys(workload: Workload) -> tuple[str, ...]:
    """What `--sweep` takes for ``workload``: the scenario's own keys, its mesh dims, its old names, its options."""
    return ("nodes", "world_size", "micro_batch") + workload.dims + tuple(workload.legacy_keys) + workload.keys()
