"""`distlab simulate`: simulate one training step of a scenario (model, mesh, parallelism, cluster) or of a plan
file. Flags, sweep keys and help of each parallelism come from its workload record (sim/workloads)."""
from __future__ import annotations

import copy
import os

from distlab.sim.cli import print_json, progress
from distlab.sim.errors import ConfigError

NAME = "simulate"
HELP = ("Simulate a training step of a scenario .yaml (DDP by default) or a plan .json: step, compute, "
        "communication and exposed time, the parallelism's report, Chrome trace and timeline.")
SCHEMA = "distlab.simulate/1"


def add_arguments(p) -> None:
    from distlab.sim.workloads import registry
    p.add_argument("scenario", nargs="?", help="a scenario .yaml, or a plan .json (distlab-plan/1; see README "
                                               "'Plans'); default: gpt2-small DDP on one DGX H100")
    p.add_argument("--model", help="a model preset (gpt2-small, gpt2-medium, llama-7b, llama-70b)")
    p.add_argument("--micro-batch", type=int, help="sequences per rank per micro-batch")
    p.add_argument("--cluster", help="a cluster preset or .yaml (default dgx-h100)")
    p.add_argument("--nodes", type=int, help="number of nodes")
    p.add_argument("--world-size", type=int, help="number of ranks (default: every GPU)")
    p.add_argument("--mesh", metavar="DIM=N,...", help="device mesh, outermost first, e.g. dp_replicate=2,dp_shard=8 "
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
    p.add_argument("--out", default="distlab-out", help="folder for trace.json and PNGs (default ./distlab-out)")
    p.add_argument("--no-files", action="store_true", help="write no trace or figures")
    p.add_argument("--json", action="store_true", help="print results as JSON (schema distlab.simulate/1)")


def flag_dest(w, f) -> str:
    return f"opt__{w.name}__{f.name}"


def is_plan_file(path: str | None) -> bool:
    return bool(path) and path.lower().endswith(".json")


def scenario_from_args(args) -> tuple[dict, list[str]]:
    """The scenario with the command-line overrides applied, and the overrides as text (for labels)."""
    from distlab.sim import scenario as sc
    from distlab.sim.workloads import registry
    d = sc.load(args.scenario) if args.scenario else copy.deepcopy(sc.DEFAULT)
    w = sc.workload_of(d)
    changed = []
    if args.model:
        d["model"] = {"preset": args.model}
        changed.append(f"--model {args.model}")
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
    for other in registry.REGISTRY.values():
        for f in other.fields():
            text = getattr(args, flag_dest(other, f), None)
            if text is None:
                continue
            flag = other.flag(f)
            if other is not w:
                raise ConfigError(f"is a {other.name} option but this scenario's parallelism is {w.name} "
                                  f"(its flags: {', '.join(w.flag(x) for x in w.fields())})", flag)
            d[w.name][f.name] = w.parse_text(f, text, flag)
            changed.append(f"{flag} {text}")
    return sc.validate(d, args.scenario or "scenario"), changed


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
    from distlab.sim.workloads.registry import sweep_keys
    keys = sweep_keys(sc.workload_of(d))
    key, eq, values = text.partition("=")
    key = key.strip().replace("-", "_")
    if not eq or key not in keys:
        raise ConfigError(f"{text!r}: write KEY=V1,V2,... with KEY one of {', '.join(keys)}", "--sweep")
    out = []
    for v in values.split(","):
        v = v.strip()
        try:
            out.append(int(v) if v.lstrip("-").isdigit() else float(v))
        except ValueError:
            out.append({"none": None, "default": None, "true": True, "false": False}.get(v.lower(), v))
    if not out or out == [""]:
        raise ConfigError("no values given", "--sweep")
    return key, out


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
        from distlab.sim.io import save_figure
        os.makedirs(args.out, exist_ok=True)
        files["trace"] = os.path.join(args.out, "trace.json")
        result.trace.save(files["trace"])
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
        from distlab.sim.io import save_figure
        os.makedirs(args.out, exist_ok=True)
        files["sweep"] = os.path.join(args.out, f"sweep-{key}.png")
        save_figure(out.sweep_figure(first.workload, rows, key, title), files["sweep"])
    if args.json:
        print_json({"schema": SCHEMA, "sweep": key, "results": rows, "files": files})
        return 0
    out.print_sweep(rows, key, title)
    for path in files.values():
        print(f"wrote {path}")
    return 0
