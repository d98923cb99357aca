"""`distlab simulate`: simulate one training step of a scenario (model, mesh, parallelism, cluster) or of a plan
file. Flags, sweep keys and help of each parallelism come from its workload record (sim/workloads)."""
from __future__ import annotations

import copy
import os
import sys

from distlab.sim.cli import add_file_arguments, add_output_arguments, print_json, progress, read_sweep
from distlab.sim.errors import ConfigError

NAME = "simulate"
HELP = ("Simulate a training step of a scenario .yaml (DDP by default) or a plan .json: step, compute, "
        "communication and exposed time, the parallelism's report, Chrome trace and timeline.")
SCHEMA = "distlab.simulate/1"


def add_arguments(p) -> None:
    from distlab.sim.workloads import registry
    p.add_argument("scenario", nargs="?", help="a scenario .yaml, or a plan .json (distlab-plan/1; see README "
                                               "'Plans'); default: gpt2-small DDP on one DGX H100")
    p.add_argument("--model", help="a preset (e.g. gpt2-small, llama3.1-8b; docs/models.md), a Hugging Face "
                                    "config.json (or its folder), or pkg.module:factory")
    p.add_argument("--offload", action="store_true", help="keep the transformer blocks' saved activations in host "
                                                          "memory (sim/models/activations.py; memory only)")
    p.add_argument("--micro-batch", type=int, help="sequences per rank per micro-batch")
    p.add_argument("--cluster", help="a cluster preset or .yaml (default dgx-h100)")
    p.add_argument("--nodes", type=int, help="number of nodes")
    p.add_argument("--world-size", type=int, help="number of ranks (default: every GPU)")
    p.add_argument("--mesh", metavar="DIM=N,...", help="device mesh, outermost first; its dimensions choose the "
                                                       "parallelisms (pp pipeline, dp_shard/dp_replicate FSDP2/HSDP, "
                                                       "dp DDP, cp, tp, ep), composed in torchtitan's order, e.g. "
                                                       "pp=16,dp_shard=128,tp=8 "
                                                       f"(dims: {', '.join(registry.mesh_dims())})")
    for w in registry.REGISTRY.values():
        g = p.add_argument_group(f"{w.name} (scenario section '{w.name}:'; {w.help})")
        for f in w.fields():
            g.add_argument(w.flag(f), dest=flag_dest(w, f), metavar=f.name.upper(), help=w.help_line(f))
    p.add_argument("--sweep", metavar="KEY=V1,V2,...",
                   help="simulate each value and plot step time, e.g. bucket_cap_mb=1,5,25,100 or pp=2,4 (keys: "
                        "nodes, world_size, micro_batch, the mesh dims and the options of the scenario's "
                        "parallelism)")
    p.add_argument("--save-plan", metavar="PLAN.json", help="also write the plan that was simulated (a plan file "
                                                            "`distlab simulate` and `distlab run` take)")
    add_file_arguments(p, "trace.json and PNGs", NAME)
    add_output_arguments(p)


def flag_dest(w, f) -> str:
    return f"opt__{w.name}__{f.name}"


def is_plan_file(path: str | None) -> bool:
    return bool(path) and path.lower().endswith(".json")


def scenario_from_args(args) -> tuple[dict, list[str]]:
    """The scenario with the command-line overrides applied, and the overrides as text (for labels)."""
    from distlab.sim import scenario as sc
    from distlab.sim.workloads import registry
    d = sc.load(args.scenario) if args.scenario else copy.deepcopy(sc.DEFAULT)
    changed = []
    if args.model:
        from distlab.sim.models import spec_from_text
        d["model"] = spec_from_text(args.model, "--model")
        changed.append(f"--model {args.model}")
    if args.offload:
        d["model"] = {**_spec(d["model"]), "offload": True}
        changed.append("--offload")
    if args.micro_batch is not None:
        sc.set_value(d, "micro_batch", args.micro_batch)
        changed.append(f"--micro-batch {args.micro_batch}")
    for key in ("cluster", "nodes", "world_size"):
        if getattr(args, key) is not None:
            d[key] = getattr(args, key)
            changed.append(f"--{key.replace('_', '-')} {getattr(args, key)}")
    if args.nodes is not None and not args.world_size:
        d.pop("world_size", None)
    if args.mesh:
        d["mesh"] = parse_mesh(args.mesh)
        changed.append(f"--mesh {args.mesh}")
    rc = getattr(args, "opt__tp__recompute", None)
    tp = registry.REGISTRY["tp"]
    tp_given = "tp" in d or "tp" in (d.get("mesh") or {}) or any(
        getattr(args, flag_dest(tp, f), None) is not None for f in tp.fields() if f.name != "recompute")
    if rc is not None and not tp_given:        # --recompute without tensor parallelism: the model's recompute
        d["model"] = {**_spec(d["model"]), "recompute": rc}
        changed.append(f"--recompute {rc}")
        args.opt__tp__recompute = None
    flagged = [w for w in registry.REGISTRY.values()
               if any(getattr(args, flag_dest(w, f), None) is not None for f in w.fields())]
    if not args.scenario:
        choose_sections(d, flagged)
    for w in flagged:
        d.setdefault(w.name, {})
        for f in w.fields():
            text = getattr(args, flag_dest(w, f), None)
            if text is not None:
                d[w.name][f.name] = w.parse_text(f, text, w.flag(f))
                changed.append(f"{w.flag(f)} {text}")
    return sc.validate(d, args.scenario or "scenario"), changed


def choose_sections(d: dict, flagged: list) -> None:
    """Without a scenario file: the parallelisms come from the flags given and the mesh's dimensions (each
    names its parallelism, sim/workloads/composed.py); the default DDP only when neither names another."""
    from distlab.sim.workloads.composed import OWNER
    names = {w.name for w in flagged} | {OWNER[k] for k in d.get("mesh") or {} if k in OWNER}
    if names and names != {"ddp"}:
        d.pop("ddp", None)
    if "ep" in names and "mesh" not in d:
        raise ConfigError("expert parallelism needs a mesh with ep, e.g. --mesh ep=8", "--mesh")


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


def parse_sweep(text: str, d: dict) -> tuple[str, list]:
    from distlab.sim import scenario as sc
    from distlab.sim.workloads import composed
    from distlab.sim.workloads.registry import sweep_keys
    w = sc.workload_of(d)
    keys = sc.composed_sweep_keys(d) if w is composed.WORKLOAD else sweep_keys(w)
    return read_sweep(text, keys)


def run(args) -> int:
    from distlab.sim.commands import simulate_output as out
    from distlab.sim.io import check_output
    check_output(None if args.no_files else args.out, "--out", "dir")       # before any work (sim/io.py)
    if args.save_plan:
        check_output(args.save_plan, "--save-plan", "file")
    if is_plan_file(args.scenario):
        return out.run_plan_file(args)
    d, changed = scenario_from_args(args)
    if args.sweep:
        if args.save_plan:
            raise ConfigError("a sweep simulates many plans; save one with a single run", "--save-plan")
        return run_sweep(args, d)
    from distlab.sim import scenario as sc
    result = sc.simulate(d, args.scenario or "scenario")
    files = {}
    if args.save_plan:
        result.plan.save(args.save_plan)
        files["plan"] = args.save_plan
    if not args.no_files:
        from distlab.sim.files import make_folder
        from distlab.sim.io import save_figure
        make_folder(args.out, "--out")   # never through a planted link
        files["trace"] = os.path.join(args.out, "trace.json")
        ranks = out.shown_ranks(result)
        out.sub_trace(result.trace, ranks).save(files["trace"])
        if ranks is not None:
            print(f"trace.json: {len(ranks)} of {result.plan.world_size} ranks (rank 0's group on every mesh "
                  "dimension, first 4 of each)", file=sys.stderr)
        files["timeline"] = os.path.join(args.out, "timeline.png")
        save_figure(result.figure(out.title(result)), files["timeline"])
    if args.json:
        print_json({"schema": SCHEMA, "results": [out.result_json(result, changed)], "files": files})
        return 0
    out.print_result(result, changed)
    for path in files.values():
        print(f"wrote {path}")
    return 0


def run_sweep(args, base: dict) -> int:
    from distlab.sim import scenario as sc
    from distlab.sim.commands import simulate_output as out
    key, values = parse_sweep(args.sweep, base)
    results, rows = [], []
    for v in progress(values, len(values), f"sweep of {key}"):     # a bar once it runs over 2 s
        d = copy.deepcopy(base)
        sc.set_value(d, key, v)
        r = sc.simulate(d, f"--sweep {key}={v}")
        results.append(r)
        rows.append({key: v, "world_size": r.plan.world_size, "mesh": r.mesh.as_dict(), **r.summary,
                     **(r.workload.sweep_row(r) if r.workload.sweep_row else {})})
    for row in rows:              # the step against the first value's: what the swept option buys or costs
        row["step_change_pct"] = (row["step_s"] / rows[0]["step_s"] - 1) * 100 if rows[0]["step_s"] else 0.0
    files = {}
    first = results[0]
    title = f"{first.model.name} {first.workload.name} on {first.cluster.name}: sweep of {key}"
    if not args.no_files and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        from distlab.sim.files import make_folder
        from distlab.sim.io import save_figure
        make_folder(args.out, "--out")   # never through a planted link
        files["sweep"] = os.path.join(args.out, f"sweep-{key}.png")
        save_figure(out.sweep_figure(first.workload, rows, key, title), files["sweep"])
    if args.json:
        print_json({"schema": SCHEMA, "sweep": key, "results": rows, "files": files})
        return 0
    out.print_sweep(rows, key, title)
    for path in files.values():
        print(f"wrote {path}")
    return 0
