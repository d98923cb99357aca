"""A scenario from `distlab simulate`'s command line: the flags edit the scenario mapping (a file's, or the
default), which is then parsed once into the typed Scenario (sim/scenario/parse.py).

    distlab simulate --model llama3-8b --mesh pp=4,dp_shard=8,tp=8 --microbatches 16 --recompute selective

One flag per idea: the micro-batches per step, the pipeline schedule, virtual stages and split, activation
recompute and communication overlap are set once for the whole composition (``SHARED``), whichever parallelisms
the layout has; the flag goes to every parallelism of the layout that has the option (a pipeline's options to
the pipeline, to EP's own pipeline with an ep mesh, or to a file's tp section that writes PP x TP: ``owners``).
The old per-parallelism spellings (``--tp-microbatches``, ``--cp-recompute``, ``--ep-overlap``, ...) stop with
one line naming the new flag. A ``--mesh`` naming several
parallelisms composes all of them (a section each), so a flag of one of them does not pick another builder:
the same layout gives the same scenario whatever flags spell it (tests/test_scenario_typed.py).
"""
from __future__ import annotations

import argparse
import copy

from distlab.sim.errors import ConfigError

# idea -> (its flag, its help); each is an option of several workloads (sim/workloads/registry.py)
SHARED = {
    "microbatches": ("--microbatches", "micro-batches per step (pipeline's m; EP's with an ep mesh)"),
    "schedule": ("--schedule", "pipeline schedule (gpipe, 1f1b, interleaved, zbh1, zbv, dualpipev, ...)"),
    "virtual_stages": ("--virtual-stages", "model chunks per pipeline rank (v; 2 for zbv, dualpipev)"),
    "split": ("--split", "transformer blocks per pipeline stage, p x v numbers (none = even)"),
    "recompute": ("--recompute", "activation recompute (none, selective, full) of TP, CP or the model"),
    "overlap": ("--overlap", "overlap communication and compute (FSDP2, CP's ring, DualPipe)"),
}
PIPELINE_IDEAS = ("microbatches", "schedule", "virtual_stages", "split")     # a pipeline's: EP's own with ep
RETIRED = {"--tp-schedule": "--schedule", "--tp-microbatches": "--microbatches", "--tp-split": "--split",
           "--tp-virtual-stages": "--virtual-stages", "--cp-recompute": "--recompute", "--cp-overlap": "--overlap",
           "--ep-schedule": "--schedule", "--ep-microbatches": "--microbatches", "--ep-split": "--split",
           "--ep-overlap": "--overlap"}


def flag_dest(w, f) -> str:
    return f"opt__{w.name}__{f.name}"


def add_parallelism_arguments(p) -> None:
    """The shared flags (one group), then one group per workload with its own options; the retired spellings
    are accepted by the parser only to be refused with the new name (hidden from --help)."""
    from distlab.sim.workloads import registry
    g = p.add_argument_group("schedule, recompute and overlap (one flag for the whole composition)")
    for idea, (flag, text) in SHARED.items():
        g.add_argument(flag, dest=f"shared__{idea}", metavar="LIST" if idea == "split" else "N" if idea in (
            "microbatches", "virtual_stages") else "BOOL" if idea == "overlap" else "NAME", help=text)
    for w in registry.REGISTRY.values():
        own = [f for f in w.fields() if f.name not in SHARED]
        if not own:
            continue
        title = f"{w.name}: {w.help} (scenario section '{w.name}:')"
        g = p.add_argument_group(title if len(title) <= 100 else title.replace(w.help, short(w.help)))
        for f in own:
            g.add_argument(w.flag(f), dest=flag_dest(w, f), metavar=metavar(w, f), help=w.help_line(f))
    for old in RETIRED:
        p.add_argument(old, dest="retired__" + old.strip("-").replace("-", "_"), help=argparse.SUPPRESS)


def short(text: str) -> str:
    """The first clause of a workload's help (up to its first colon or semicolon), for a --help group title that
    would pass 100 columns with the whole help."""
    for mark in (":", ";"):
        text = text.split(mark)[0]
    return text.strip()


def metavar(w, f) -> str:
    """A short word for an option's value in --help: N, X, BOOL, LIST, or NAME (a word or one of choices)."""
    import typing
    from distlab.sim.workloads.base import _allowed
    kinds = _allowed(typing.get_type_hints(w.options)[f.name])
    if list in kinds or bool in kinds:
        return "LIST" if list in kinds else "BOOL" if len(kinds - {type(None)}) == 1 else "V"
    return "N" if int in kinds and float not in kinds and str not in kinds else "X" if float in kinds else "NAME"


def scenario_from_args(args, default: dict):
    """(the Scenario, the overrides as text for labels) of `simulate`'s arguments on ``default`` (the mapping
    used without a scenario file)."""
    from distlab.sim import scenario as sc
    from distlab.sim.workloads import registry
    for old, new in RETIRED.items():
        if getattr(args, "retired__" + old.strip("-").replace("-", "_"), None) is not None:
            raise ConfigError(f"is now {new}, set once for the whole composition", old)
    d = sc.load(args.scenario) if args.scenario else copy.deepcopy(default)
    changed = []
    check_flags(args)
    if args.model:
        from distlab.sim.models import model_from_spec, spec_from_text
        d["model"] = spec_from_text(args.model, "--model")
        model_from_spec(d["model"], "--model")       # a bad --model is named as typed, not as scenario: model:
        changed.append(f"--model {args.model}")
    if args.offload:
        d["model"] = {**_spec(d["model"]), "offload": True}
        changed.append("--offload")
    if args.micro_batch is not None:
        sc.set_value(d, "micro_batch", args.micro_batch)
        changed.append(f"--micro-batch {args.micro_batch}")
    for key in ("cluster", "nodes", "world_size", "global_batch", "fp8_recipe"):
        if getattr(args, key, None) is not None:
            d[key] = getattr(args, key)
            changed.append(f"--{key.replace('_', '-')} {getattr(args, key)}")
    if args.nodes is not None and not args.world_size:
        d.pop("world_size", None)
    if args.mesh:
        d["mesh"] = parse_mesh(args.mesh)
        changed.append(f"--mesh {args.mesh}")
    flagged = {w.name for w in registry.REGISTRY.values()
               if any(getattr(args, flag_dest(w, f), None) is not None for f in w.fields())}
    shared = {idea: getattr(args, f"shared__{idea}") for idea in SHARED
              if getattr(args, f"shared__{idea}", None) is not None}
    written = set(d) & set(registry.names())
    layout = flagged | written | implied(d.get("mesh"))
    targets = {idea: owners(idea, layout, written, d.get("mesh")) for idea in shared}
    if "recompute" in shared and not targets["recompute"]:   # no TP, no CP: the model's recompute
        d["model"] = {**_spec(d["model"]), "recompute": shared.pop("recompute")}
        changed.append(f"--recompute {d['model']['recompute']}")
    for idea in shared:
        flagged |= set(targets[idea])
    if not args.scenario:
        choose_sections(d, flagged)
    for w in registry.REGISTRY.values():
        if w.name not in flagged:
            continue
        d.setdefault(w.name, {})
        for f in w.fields():
            text = getattr(args, flag_dest(w, f), None) if f.name not in SHARED else \
                shared.get(f.name) if w.name in targets.get(f.name, ()) else None
            if text is not None:
                flag = SHARED[f.name][0] if f.name in SHARED else w.flag(f)
                d[w.name][f.name] = w.parse_text(f, text, flag)
                if f"{flag} {text}" not in changed:
                    changed.append(f"{flag} {text}")
    if args.nodes is not None:                 # the real bound: the simulator's ranks over this cluster's nodes
        from distlab.sim.cli import check_whole
        from distlab.sim.cluster import load_cluster, nodes_bound
        check_whole(args.nodes, "--nodes", 1, *nodes_bound(load_cluster(d["cluster"])))
    for idea in PIPELINE_IDEAS:                # a pipeline's flag on a mesh without pp: named as typed
        if idea in shared and targets[idea] == ["pipeline"] and "pp" not in (d.get("mesh") or {}):
            where = "--mesh" if args.mesh or not args.scenario else "the scenario's mesh"
            raise ConfigError(f"needs a pp dimension in {where}, e.g. pp=4,dp_shard=2",
                              SHARED[idea][0])
    where = args.scenario or "scenario"
    try:
        return sc.from_dict(d, where), changed
    except ConfigError as e:                  # the global batch named as typed
        for key in ("global_batch", "fp8_recipe"):
            if getattr(args, key, None) is not None and (e.where or "").endswith(key):
                raise ConfigError(str(e).removeprefix(f"{e.where}: "), "--" + key.replace("_", "-")) from None
        raise


def check_flags(args) -> None:
    """The whole-number flags against the bounds the simulator enforces, named as the user typed them."""
    from distlab.sim.cli import check_whole
    from distlab.sim.cluster import MAX_RANKS
    check_whole(args.world_size, "--world-size", 1, MAX_RANKS, "ranks")
    check_whole(args.micro_batch, "--micro-batch", 1, 2**20, "sequences")
    from distlab.sim.scenario.batch import MAX_GLOBAL_BATCH
    check_whole(getattr(args, "global_batch", None), "--global-batch", 1, MAX_GLOBAL_BATCH)


def implied(mesh) -> set[str]:
    """The parallelisms a written mesh names (sim/workloads/composed.py OWNER; ep: the ep workload)."""
    from distlab.sim.workloads.composed import OWNER
    if not isinstance(mesh, dict):
        return set()
    return {"ep"} if "ep" in mesh else {OWNER[k] for k in mesh if k in OWNER}


def owners(idea: str, layout: set[str], written: set[str], mesh) -> list[str]:
    """The parallelisms that take shared option ``idea`` in ``layout`` (``written``: the scenario file's
    sections). A pipeline's options go to EP's own pipeline with an ep layout, to a file's tp section when it
    writes PP x TP there (Megatron-LM's layout, sim/reproduce/scenario.py: a tp section, pp in the mesh, no
    pipeline section), else to the pipeline (a section the flag adds). Recompute goes to TP and CP (none: the
    model's, by the caller); overlap to FSDP2, CP and EP, or FSDP2 when the layout has none of them."""
    from distlab.sim.workloads import registry
    if idea in PIPELINE_IDEAS:
        if "ep" in layout and idea in registry.get("ep").keys():
            return ["ep"]
        if "tp" in written and "pipeline" not in written and "pp" in (mesh or {}):
            return ["tp"]
        return ["pipeline"]
    have = [n for n in registry.names() if n in layout and idea in registry.get(n).keys()]
    return have or (["fsdp"] if idea == "overlap" else [])


def choose_sections(d: dict, flagged: set) -> None:
    """Without a scenario file: the parallelisms come from the flags given and the mesh's dimensions (each
    names its parallelism); the default DDP only when neither names another. A mesh naming several
    parallelisms gets a section for each, so that one parallelism's flag composes the layout instead of
    choosing that parallelism's builder."""
    names = flagged | implied(d.get("mesh"))
    if names and names != {"ddp"}:
        d.pop("ddp", None)
    if "ep" in names and "mesh" not in d:
        raise ConfigError("expert parallelism needs a mesh with ep, e.g. --mesh ep=8", "--mesh")
    named = implied(d.get("mesh"))
    if len(named) > 1:
        for name in named - ({"ddp", "fsdp"} if {"ddp", "fsdp"} <= named else set()):   # both: the mesh's error
            d.setdefault(name, {})


def _spec(model) -> dict:
    return {"preset": model} if isinstance(model, str) else dict(model)


def parse_mesh(text: str) -> dict:
    out = {}
    for part in text.split(","):
        name, eq, size = part.partition("=")
        if not eq or not size.strip().isdigit():
            raise ConfigError(f"{part!r}: write DIM=N,DIM=N (outermost first), e.g. pp=2,dp=4", "--mesh")
        out[name.strip()] = int(size)
    return out
