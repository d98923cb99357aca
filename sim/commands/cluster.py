"""`distlab cluster FILE`: several jobs on one cluster (sim/jobs/): each job's step alone on its nodes and shared
with the others, the slowdown, the contended links, a timeline with one track per job; what-ifs (a sweep over
placement, oversubscription and rail layout, the interference matrix, the capacity search), run on local
processes or on a Dask cluster (sim/workers.py)."""
from __future__ import annotations

import os

from distlab.sim.cli import add_file_arguments, add_output_arguments, print_json, print_table, read_sweep
from distlab.sim.errors import ConfigError

NAME = "cluster"
HELP = ("Several jobs on one cluster (a file with a jobs: list): step time alone and shared, slowdown, contended "
        "links, a timeline per job; --sweep, --matrix, --capacity what-ifs.")
SCHEMA = "distlab.cluster/1"


def add_arguments(p) -> None:
    p.add_argument("file", help="a cluster file: cluster, nodes, fabric, placement and a jobs: list of scenarios "
                                "or plans (docs/multi-job.md)")
    p.add_argument("--sweep", action="append", metavar="KEY=V1,V2,...",
                   help="simulate every combination, e.g. placement=packed,spread oversubscription=1,2,4 "
                        "layout=fat-tree,rail-optimized (keys: placement, oversubscription, nodes_per_leaf, "
                        "layout, seed); repeat the flag for more keys")
    p.add_argument("--matrix", action="store_true", help="the interference matrix: each pair of jobs together on "
                                                         "the nodes the whole mix gives them")
    p.add_argument("--capacity", type=float, metavar="SLOWDOWN",
                   help="add the mix's jobs one at a time: the most GPUs before the worst slowdown passes SLOWDOWN "
                        "(e.g. 1.1)")
    p.add_argument("--top", type=int, default=5, help="contended links shown (default 5)")
    p.add_argument("--workers", type=int, help="local processes for --sweep, --matrix, --capacity (default: the "
                                               "CPUs, at most 2)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="run them on a Dask cluster instead: its scheduler's "
                                                          "address, e.g. tcp://10.0.0.1:8786")
    from distlab.sim.workers import add_insecure_flag
    add_insecure_flag(p)                     # a scheduler off this machine needs TLS or this flag (sim/workers.py)
    add_file_arguments(p, "cluster-timeline.png", NAME)
    add_output_arguments(p)


def parse_sweeps(texts: list[str]) -> dict:
    from distlab.sim.jobs.whatif import SWEEP_KEYS
    keys: dict = {}
    for text in texts:
        key, values = read_sweep(text, SWEEP_KEYS)
        if key in keys:
            raise ConfigError(f"{key} is swept twice; give its values once", "--sweep")
        keys[key] = values
    return keys


def run(args) -> int:
    from distlab.sim.io import check_output
    from distlab.sim.jobs import spec as specs
    check_output(None if args.no_files else args.out, "--out", "dir")
    from distlab.sim.workers import check_scheduler
    check_scheduler(args.scheduler, getattr(args, "insecure_scheduler", False))
    if args.top < 0:
        raise ConfigError(f"{args.top} must be a whole number >= 0", "--top")
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"{args.workers} must be a whole number >= 1", "--workers")
    if sum(bool(x) for x in (args.sweep, args.matrix, args.capacity is not None)) > 1:
        raise ConfigError("one what-if at a time: --sweep, --matrix or --capacity", "--sweep")
    d = specs.load(args.file)
    many = {"workers": args.workers, "scheduler": args.scheduler}
    if args.sweep or args.matrix or args.capacity is not None:      # minutes at scale: say how far it got
        from distlab.sim.cli import Progress
        what = "--sweep" if args.sweep else "--matrix" if args.matrix else "--capacity"
        many["progress"] = Progress(0, f"distlab cluster {what}", enabled=not args.json).update
    if args.sweep:
        return _sweep(args, d, parse_sweeps(args.sweep), many)
    if args.matrix:
        return _matrix(args, d, many)
    if args.capacity is not None:
        return _capacity(args, d, many)
    from distlab.sim.jobs.report import (JOB_COLUMNS, LINK_COLUMNS, contended_links, job_rows, link_rows,
                                         outcome_json)
    from distlab.sim.jobs.together import simulate_jobs
    outcome = simulate_jobs(specs.resolve(d, args.file))
    files = {}
    if not args.no_files:
        from distlab.sim.files import make_folder
        from distlab.sim.io import save_figure
        from distlab.sim.jobs.figure import jobs_timeline
        make_folder(args.out, "--out")   # never through a planted link
        files["timeline"] = os.path.join(args.out, "cluster-timeline.png")
        save_figure(jobs_timeline(outcome), files["timeline"])
    if args.json:
        print_json({"schema": SCHEMA, **outcome_json(outcome, args.top), "files": files})
        return 0
    _header(outcome.spec)
    print_table("per job: mean step alone on its nodes and shared with the others; ranks simulated alone/shared",
                JOB_COLUMNS, job_rows(outcome), justify_left=5)
    links = contended_links(outcome, args.top)
    if links:
        print_table(f"contended links (top {len(links)} by bytes; the jobs whose flows share them)", LINK_COLUMNS,
                    link_rows(links))
    else:
        print("no link carries two jobs' flows: every job runs as alone")
    for path in files.values():
        print(f"wrote {path}")
    return 0


def _header(spec) -> None:
    from distlab.sim.jobs.report import fabric_words
    c = spec.cluster
    print(f"{spec.name}: {c.name}, {c.nodes} nodes x {c.gpus_per_node} GPUs ({c.world_size})")
    print(f"fabric: {fabric_words(c)}")


def _sweep(args, d: dict, keys: dict, many: dict) -> int:
    from distlab.sim.jobs.whatif import sweep
    rows = sweep(d, keys, **many)
    out = [{**{k: v for k, v in r["values"].items()},
            "jobs": [{k: j[k] for k in ("name", "nodes", "step_alone_s", "step_shared_s", "slowdown")}
                     for j in r["jobs"]],
            "worst_slowdown": r["worst_slowdown"], "contended_links": r["contended_links"][:args.top]}
           for r in rows]
    if args.json:
        print_json({"schema": SCHEMA, "sweep": keys, "results": out, "files": {}})
        return 0
    names = [j["name"] for j in rows[0]["jobs"]]
    print_table(f"sweep of {', '.join(keys)}: slowdown of each job (shared / alone)",
                list(keys) + names + ["worst"],
                [[r["values"][k] for k in keys] + [f"{j['slowdown']:.3f}x" for j in r["jobs"]]
                 + [f"{r['worst_slowdown']:.3f}x"] for r in rows], justify_left=len(keys))
    return 0


def _matrix(args, d: dict, many: dict) -> int:
    from distlab.sim.jobs.whatif import matrix
    m = matrix(d, **many)
    if args.json:
        print_json({"schema": SCHEMA, "matrix": m, "files": {}})
        return 0
    print_table("interference matrix: slowdown of the row's job beside the column's (each pair alone together)",
                ["job"] + m["jobs"], [[name] + [f"{x:.3f}x" if i != j else "-" for j, x in enumerate(row)]
                                      for i, (name, row) in enumerate(zip(m["jobs"], m["slowdown"]))])
    return 0


def _capacity(args, d: dict, many: dict) -> int:
    from distlab.sim.jobs.whatif import capacity
    c = capacity(d, args.capacity, **many)
    if args.json:
        print_json({"schema": SCHEMA, "capacity": c, "files": {}})
        return 0
    print_table(f"the mix's jobs added one at a time (threshold {c['threshold']:g}x)", ["jobs", "GPUs", "worst",
                                                                                          "mean"],
                [[r["jobs"], r["gpus"], f"{r['worst_slowdown']:.3f}x", f"{r['mean_slowdown']:.3f}x"]
                 for r in c["rows"]])
    jobs = f"{c['jobs']} job" + ("s" if c["jobs"] != 1 else "")
    print(f"the cluster gives the mix {c['gpus']} of its {c['cluster_gpus']} GPUs ({jobs}) before the worst slowdown "
          f"passes {c['threshold']:g}x")
    return 0
