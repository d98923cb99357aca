"""`distlab simulate`: simulate one training step of a scenario (model, mesh, parallelism, cluster) or of a plan
file. Flags, sweep keys and help of each parallelism come from its workload record (sim/workloads)."""
from __future__ import annotations

import os
import sys

from distlab.sim.cli import add_file_arguments, add_output_arguments, print_json, progress, read_sweep
from distlab.sim.errors import ConfigError

NAME = "simulate"
HELP = ("Simulate a training step of a scenario .yaml (DDP by default) or a plan .json: step, compute, "
        "communication and exposed time, the parallelism's report, Chrome trace and timeline.")
SCHEMA = "distlab.simulate/1"


def add_arguments(p) -> None:
    """Grouped: model and batch, mesh, cluster, the flags shared by the whole composition, one group per
    parallelism (sim/scenario/flags.py), output; 100 columns, each flag once."""
    import argparse
    p.usage = "distlab simulate [SCENARIO] [--model M] [--mesh DIM=N,...] [options]"
    p.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=100, max_help_position=30)
    p.add_argument("scenario", nargs="?", help="a scenario .yaml, or a plan .json (distlab-plan/1; docs/plans.md); "
                                               "default: gpt2-small DDP, bf16 autocast, on one DGX H100")
    g = p.add_argument_group("model and batch")
    g.add_argument("--model", help="a preset (e.g. gpt2-small, llama3.1-8b; docs/models.md), a Hugging Face "
                                   "config.json (or its folder), or pkg.module:factory")
    g.add_argument("--offload", action="store_true", help="saved activations of the blocks in host memory "
                                                          "(memory only)")
    g.add_argument("--micro-batch", type=int, metavar="N", help="sequences per rank per micro-batch")
    g.add_argument("--fp8-recipe", metavar="NAME", help="float8 GEMMs' scaling recipe (te-delayed, ...)")
    g.add_argument("--global-batch", type=int, metavar="N", help="sequences per optimizer step; a pipeline's m = N / (dp x micro-batch)")
    g = p.add_argument_group("mesh")
    g.add_argument("--mesh", metavar="DIM=N,...", help="device mesh, outermost first; each dimension names its "
                                                       "parallelism (pp, dp_shard/dp_replicate FSDP2/HSDP, dp DDP, "
                                                       "cp, tp, ep), composed in torchtitan's order, e.g. "
                                                       "pp=16,dp_shard=128,tp=8")
    g = p.add_argument_group("cluster")
    g.add_argument("--cluster", help="a cluster preset or .yaml (default dgx-h100, or a plan's own)")
    g.add_argument("--nodes", type=int, metavar="N", help="number of nodes")
    g.add_argument("--world-size", type=int, metavar="N", help="number of ranks (default: every GPU)")
    from distlab.sim.scenario.flags import add_parallelism_arguments
    add_parallelism_arguments(p)
    g = p.add_argument_group("output")
    g.add_argument("--sweep", metavar="KEY=V1,V2,...",
                   help="simulate each value, e.g. pp=2,4 (keys: nodes, world_size, micro_batch, mesh "
                        "dims, options)")
    g.add_argument("--from-profile", metavar="DIR", help="simulate the job of a torch.profiler trace folder (one "
                   ".json/.json.gz per rank), saying what it could not guess (sim/ingest/scenario.py)")
    g.add_argument("--save-plan", metavar="PLAN.json", help="also write the plan simulated (for simulate and run)")
    add_file_arguments(g, "trace.json and PNGs", NAME)
    add_output_arguments(g)


def is_plan_file(path: str | None) -> bool:
    return bool(path) and path.lower().endswith(".json")


def scenario_from_args(args):
    """(the Scenario, the overrides as text) of the arguments (sim/scenario/flags.py)."""
    from distlab.sim import scenario as sc
    from distlab.sim.scenario.flags import scenario_from_args as from_flags
    try:
        return from_flags(args, sc.DEFAULT)
    except ConfigError as e:
        raise as_typed(e, args) from None


def as_typed(e: ConfigError, args) -> ConfigError:
    """A flags-only run's error at the scenario's mesh, model or cluster key named by the flag the user typed
    (``--mesh: llama3-8b has no experts; ...``), not by a scenario the user never wrote."""
    key = (e.where or "").removeprefix("scenario: ").split(".")[0].split(":")[0]
    flag = {"mesh": "--mesh", "model": "--model", "cluster": "--cluster", "world_size": "--world-size",
            "nodes": "--nodes"}.get(key)
    if args.scenario or flag is None:
        return e
    return ConfigError(str(e).removeprefix(f"{e.where}: "), flag)


def parse_sweep(text: str, scenario) -> tuple[str, list]:
    """The sweep key and its values for ``scenario`` (a Scenario)."""
    from distlab.sim import scenario as sc
    return read_sweep(text, sc.sweep_keys(scenario))


def run(args) -> int:
    from distlab.sim.commands import simulate_output as out
    from distlab.sim.io import check_output
    check_output(None if args.no_files else args.out, "--out", "dir")       # before any work (sim/io.py)
    if args.save_plan:
        check_output(args.save_plan, "--save-plan", "file")
    if args.from_profile:
        from distlab.sim.ingest.scenario import run_from_profile
        return run_from_profile(args)
    if is_plan_file(args.scenario):
        return out.run_plan_file(args)
    scenario, changed = scenario_from_args(args)
    if args.sweep:
        if args.save_plan:
            raise ConfigError("a sweep simulates many plans; save one with a single run", "--save-plan")
        return run_sweep(args, scenario)
    from distlab.sim import scenario as sc
    try:
        result = sc.simulate(scenario, args.scenario or "scenario")
    except ConfigError as e:
        raise as_typed(e, args) from None
    files = {}
    if args.save_plan:                  # with the scenario as its header (sim/scenario/header.py)
        from distlab.sim.scenario.header import with_header
        with_header(result.plan, scenario).save(args.save_plan)
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


def run_sweep(args, base) -> int:
    """Simulate the Scenario ``base`` with the sweep key at each value (sim/scenario ``vary``)."""
    from distlab.sim import scenario as sc
    from distlab.sim.commands import simulate_output as out
    key, values = parse_sweep(args.sweep, base)
    results, rows = [], []
    for v in progress(values, len(values), f"sweep of {key}"):     # a bar once it runs over 2 s
        r = sc.simulate(sc.vary(base, key, v), f"--sweep {key}={v}")
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
