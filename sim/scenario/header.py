"""A plan file's scenario header: the typed Scenario a plan was built from, written beside its ranks as plain data
and read back as any scenario is, so that a plan says what it is a plan of.

    distlab simulate --mesh pp=2,tp=4 --save-plan plan.json      # plan.json: {"format": ..., "scenario": {...}}
    s = scenario_of_plan(Plan.load("plan.json"), "plan.json")      # the same Scenario (==), or None (no header)

The rule: data files never run code, and a reader checks what it reads. The header is a scenario mapping (the
keys of sim/scenario/__init__.py, JSON values only): ``to_data`` writes the completed mesh and the options that
differ from their defaults (a parallelism whose defaults depend on the layout, e.g. FSDP2's resharding inside a
pipeline, is written whole: it is parsed back once to find them). ``scenario_of_plan``
validates it as any scenario (sim/scenario/parse.py: every key, type and range; errors name
``plan.json: scenario: <key>``), refuses a model given as a factory (``pkg.module:fn`` is code), and checks that
its world size is the plan's. A plan written before headers has none and loads as before.
"""
from __future__ import annotations

import dataclasses
import json

from distlab.sim.errors import ConfigError


def to_data(s) -> dict | None:
    """The header of Scenario ``s`` (plain data), or None when it cannot be one: a factory model (code)."""
    if s.model.form == "factory":
        return None
    d = {k: v for k, v in (("name", s.name), ("description", s.description)) if v is not None}
    d["model"] = s.model_spec()
    d["mesh"] = dict(s.mesh)
    sections = {name: _changed(opts) for name, opts in s.parallelisms.items()}
    d.update(sections)
    d["cluster"], d["nodes"], d["world_size"] = s.cluster.source, s.cluster.nodes, s.cluster.world_size
    if s.batch.global_batch is not None:
        d["global_batch"] = s.batch.global_batch
    if s.stragglers:
        d["stragglers"] = dict(s.stragglers)
    if s.degraded_links:
        d["degraded_links"] = dict(s.degraded_links)
    from distlab.sim.scenario.parse import KEYS, from_dict
    for key in KEYS:                        # a scenario key this writer does not know yet: as written
        if key not in d and s.source.get(key) is not None:
            d[key] = s.source[key]
    d = _ranks(json.loads(json.dumps(d)))  # as a file holds it (tuples as lists)
    back = from_dict(d, "scenario header").parallelisms
    for name, opts in s.parallelisms.items():
        if back.get(name) != opts:          # a default the layout sets: written whole
            d[name] = json.loads(json.dumps(dataclasses.asdict(opts)))
    return d


def _ranks(d: dict) -> dict:
    """``d`` with its stragglers' ranks whole numbers again (JSON writes every object key as a string)."""
    slow = d.get("stragglers")
    if isinstance(slow, dict):
        d["stragglers"] = {int(k) if isinstance(k, str) and k.isdigit() else k: v for k, v in slow.items()}
    return d


def _changed(opts) -> dict:
    """The options that differ from their defaults (lists for JSON)."""
    defaults = type(opts)()
    return {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)
            if getattr(opts, f.name) != getattr(defaults, f.name)}


def scenario_of_plan(plan, where: str = "plan"):
    """The Scenario of ``plan``'s header, validated (module docstring); None for a plan without one."""
    header = getattr(plan, "scenario", None)
    return None if header is None else from_data(header, f"{where}: scenario", plan.world_size)


def from_data(header, at: str, world_size: int | None = None):
    """The Scenario of a header (a plan's, or a trace's meta ``scenario``), validated; ``world_size``: the ranks
    it must have."""
    if not isinstance(header, dict):
        raise ConfigError("must be a scenario mapping (model, mesh, a section per parallelism, cluster)", at)
    model = header.get("model")
    if isinstance(model, dict) and "factory" in model:
        raise ConfigError("a model factory is code and a plan file is data: give a preset, a kind or an "
                          "hf_config", f"{at}: model")
    from distlab.sim.scenario.parse import from_dict
    s = from_dict(_ranks(dict(header)), at)
    if world_size is not None and s.cluster.world_size != world_size:
        raise ConfigError(f"world_size {s.cluster.world_size} is not the plan's {world_size} ranks", at)
    return s


def describe(s) -> str:
    """One line for a plan's header: the model, the mesh and the parallelisms, e.g. ``llama3-8b · mesh pp 2 x tp 4
    · pipeline, tp, fsdp · 1 x dgx-h100``."""
    model = s.model.source if isinstance(s.model.source, str) else s.model.form
    mesh = " x ".join(f"{k} {v}" for k, v in s.mesh)
    return (f"{model} · mesh {mesh} · {', '.join(s.parallelisms)} · {s.cluster.nodes} x {s.cluster.source}"
            + (f" ({s.name})" if s.name else ""))


def with_header(plan, s):
    """``plan`` carrying Scenario ``s`` as its header (the ops shared, not copied)."""
    return dataclasses.replace(plan, scenario=to_data(s))


def shown(plan, where: str) -> dict | None:
    """What a command shows of ``plan``'s header: {"label": one line, "scenario": the header}, or None without
    one (validated here: a bad header is a one-line error naming ``where``)."""
    s = scenario_of_plan(plan, where)
    return None if s is None else {"label": describe(s), "scenario": plan.scenario}
