"""`distlab simulate`: simulate one training step of a scenario (model, parallelism, cluster)."""
from __future__ import annotations

import copy
import os

from distlab.sim.cli import print_json, print_table, progress
from distlab.sim.errors import ConfigError

NAME = "simulate"
HELP = ("Simulate a training step (DDP by default): step, compute, communication and exposed time, "
        "per-bucket table, Chrome trace and timeline.")
DDP_FLAGS = {"bucket_cap_mb": float, "iteration": int, "grad_accum": int, "compress": str, "algorithm": str,
             "optimizer": str}
SWEEPABLE = ("nodes", "world_size", "micro_batch") + tuple(DDP_FLAGS) + (
    "microbatches", "stages", "virtual_stages", "schedule", "data_parallel")     # pipeline (sim/pipeline/scenario.py)


def add_arguments(p) -> None:
    p.add_argument("scenario", nargs="?", help="a scenario .yaml (default: gpt2-small DDP on one DGX H100)")
    p.add_argument("--model", help="a model preset (gpt2-small, gpt2-medium, llama-7b, llama-70b)")
    p.add_argument("--micro-batch", type=int, help="sequences per rank per micro-batch")
    p.add_argument("--cluster", help="a cluster preset or .yaml (default dgx-h100)")
    p.add_argument("--nodes", type=int, help="number of nodes")
    p.add_argument("--world-size", type=int, help="number of ranks (default: every GPU)")
    g = p.add_argument_group("DDP")
    g.add_argument("--bucket-cap-mb", type=float, help="DDP bucket_cap_mb (default: PyTorch's 25, first bucket 1)")
    g.add_argument("--iteration", type=int, help="0 = the first step (one bucket); 1 = steady state (default)")
    g.add_argument("--grad-accum", type=int, help="micro-batches per step, all but the last under no_sync()")
    g.add_argument("--compress", choices=["fp16", "bf16"], help="fp16/bf16_compress_hook: all-reduce half the bytes")
    g.add_argument("--algo", dest="algorithm", help="all-reduce algorithm (auto, ring, tree, ...)")
    g.add_argument("--optimizer", help="adam (default), sgd or none")
    p.add_argument("--sweep", metavar="KEY=V1,V2,...",
                   help=f"simulate each value and plot step time, e.g. bucket_cap_mb=1,5,10,25,50,100,400 "
                        f"(keys: {', '.join(SWEEPABLE)})")
    p.add_argument("--out", default="distlab-out", help="folder for trace.json and PNGs (default ./distlab-out)")
    p.add_argument("--no-files", action="store_true", help="write no trace or figures")
    p.add_argument("--json", action="store_true", help="print results as JSON")


def scenario_from_args(args) -> dict:
    from distlab.sim import scenario as sc
    d = sc.load(args.scenario) if args.scenario else copy.deepcopy(sc.DEFAULT)
    if args.model:
        d["model"] = {"preset": args.model}
    if args.micro_batch is not None:
        set_value(d, "micro_batch", args.micro_batch)
    for key in ("cluster", "nodes", "world_size"):
        if getattr(args, key) is not None:
            d[key] = getattr(args, key)
    if args.nodes is not None and not args.world_size:
        d.pop("world_size", None)
    for key in DDP_FLAGS:
        if getattr(args, key, None) is not None:
            d["parallelism"][key] = getattr(args, key)
    cap = d["parallelism"].get("bucket_cap_mb")
    if isinstance(cap, float) and cap.is_integer():
        d["parallelism"]["bucket_cap_mb"] = int(d["parallelism"]["bucket_cap_mb"])
    return sc.validate(d, args.scenario or "scenario")


def set_value(d: dict, key: str, value) -> None:
    if key == "micro_batch":
        if isinstance(d["model"], str):
            d["model"] = {"preset": d["model"]}
        if not isinstance(d["model"], dict):
            raise ConfigError("micro_batch needs a preset or gpt model", "--micro-batch")
        d["model"]["micro_batch" if d["model"].get("kind") != "mlp" else "batch"] = value
    elif key in ("nodes", "world_size"):
        d[key] = value
    else:
        d["parallelism"][key] = value


def parse_sweep(text: str) -> tuple[str, list]:
    key, eq, values = text.partition("=")
    key = key.strip().replace("-", "_")
    if not eq or key not in SWEEPABLE:
        raise ConfigError(f"{text!r}: write KEY=V1,V2,... with KEY one of {', '.join(SWEEPABLE)}", "--sweep")
    out = []
    for v in values.split(","):
        v = v.strip()
        try:
            out.append(int(v) if v.lstrip("-").isdigit() else float(v))
        except ValueError:
            out.append(None if v in ("none", "default") else v)
    if not out or out == [""]:
        raise ConfigError("no values given", "--sweep")
    return key, out


def run(args) -> int:
    from distlab.sim import scenario as sc
    from distlab.sim.ddp.plan import bucket_rows, summarize
    from distlab.sim.io import check_output
    check_output(None if args.no_files else args.out, "--out", "dir")       # before any work (sim/io.py)
    d = scenario_from_args(args)
    files = {}
    if args.sweep:
        return run_sweep(args, d)
    trace, info, model, cluster, plan = sc.simulate(d, args.scenario or "scenario")
    summary = summarize(trace)
    extra = info["report"](trace) if "report" in info else {}     # e.g. FSDP's peak memory (sim/fsdp)
    rows = bucket_rows(trace, info) if "buckets" in info else []
    _ddp_launch(rows)
    if not args.no_files:
        from distlab.sim.io import save_figure
        from distlab.sim.plots import timeline
        os.makedirs(args.out, exist_ok=True)
        files["trace"] = os.path.join(args.out, "trace.json")
        trace.save(files["trace"])
        files["timeline"] = os.path.join(args.out, "timeline.png")
        title = (f"{d.get('name') or plan.name}: {model.name} on {cluster.name}, {plan.world_size} ranks, "
                 f"step {summary['step_s'] * 1e3:.2f} ms, overlap {summary['overlap_pct']:.0f}%")
        fig = (info["figure"](trace, title=title) if "figure" in info
               else timeline(trace, ranks=list(range(min(2, plan.world_size))), title=title))
        save_figure(fig, files["timeline"])
    from distlab.sim.analysis import straggler_report, time_breakdown
    by_rank = [vars(b) for b in time_breakdown(trace)]
    stragglers = straggler_report(trace)
    if args.json:
        print_json({"scenario": d, "model": model.summary(), "cluster": cluster.name, "world_size": plan.world_size,
                    **summary, **{k: v for k, v in extra.items() if k != "rows"}, "buckets": rows,
                    "time_by_rank": by_rank, "stragglers": stragglers, "files": files})
        return 0
    print(f"scenario: {d.get('name') or plan.name}")
    print(f"model:    {model.summary()}")
    print(f"cluster:  {cluster.name}, {plan.world_size} ranks ({cluster.nodes} node(s) x {cluster.gpus_per_node})")
    opts = {k: v for k, v in d["parallelism"].items()}
    print(f"parallelism: {', '.join(f'{k}={v}' for k, v in opts.items())}")
    print_table(None, ["", "value"], [
        ["step time", f"{summary['step_s'] * 1e3:.3f} ms"], ["compute", f"{summary['compute_s'] * 1e3:.3f} ms"],
        ["communication", f"{summary['comm_s'] * 1e3:.3f} ms"],
        ["exposed communication", f"{summary['exposed_comm_s'] * 1e3:.3f} ms"],
        ["overlap", f"{summary['overlap_pct']:.1f} %"]] + extra.get("rows", []))
    if d.get("stragglers") or d.get("degraded_links"):
        print_table("where the time went (per rank, ms)", ["rank", "compute", "waiting for peers", "moving data"],
                    [[b["rank"], f"{b['compute_s'] * 1e3:.3f}", f"{b['waiting_s'] * 1e3:.3f}",
                      f"{b['transfer_s'] * 1e3:.3f}"] for b in by_rank[:16]])
        for line in stragglers:
            print(line)
    if extra.get("warning"):
        print(f"warning: {extra['warning']}")
    if rows:
        ms = lambda t: "-" if t is None else f"{t * 1e3:.3f}"  # noqa: E731
        print_table("buckets (rank 0; times in ms; launch = DDP's launch rule, start = data moves)",
                    ["bucket", "MiB", "params", "first .. last", "ready", "launch", "start", "end"],
                    [[r["index"], f"{r['bytes'] / 2**20:.2f}", r["params"], f"{r['first']} .. {r['last']}",
                      ms(r["ready_s"]), ms(r["ddp_launch_s"]), ms(r["launch_s"]), ms(r["end_s"])] for r in rows],
                    justify_left=1)
    for path in files.values():
        print(f"wrote {path}")
    return 0


def _ddp_launch(rows: list[dict]) -> None:
    """Reducer::mark_bucket_ready: launch k = max(ready k, launch k-1)."""
    prev = float("-inf")
    for r in rows:
        prev = r["ddp_launch_s"] = None if r["ready_s"] is None else max(r["ready_s"], prev)


def run_sweep(args, base: dict) -> int:
    from distlab.sim import scenario as sc
    from distlab.sim.ddp.plan import summarize
    key, values = parse_sweep(args.sweep)
    if base["parallelism"].get("kind") == "pipeline":
        from distlab.sim.pipeline.scenario import run_sweep as pipeline_sweep
        return pipeline_sweep(args, base, key, values)
    results = []
    for v in progress(values, len(values), f"sweep of {key}"):     # a bar once it runs over 2 s
        d = copy.deepcopy(base)
        set_value(d, key, v)
        trace, info, model, cluster, plan = sc.simulate(d, f"--sweep {key}={v}")
        results.append({key: v, **summarize(trace), "buckets": len(info.get("buckets", [])),
                        "world_size": plan.world_size})
    files = {}
    numeric = all(isinstance(v, (int, float)) for v in values)
    if not args.no_files and numeric:
        from distlab.sim.io import save_figure
        from distlab.sim.plots import sweep
        os.makedirs(args.out, exist_ok=True)
        files["sweep"] = os.path.join(args.out, f"sweep-{key}.png")
        ms = lambda k: [r[k] * 1e3 for r in results]  # noqa: E731
        fig = sweep(values, {"step": ms("step_s"), "exposed communication": ms("exposed_comm_s")},
                    key, "time (ms)", title=f"{model.name} on {cluster.name}: step time vs {key}",
                    logx=key == "bucket_cap_mb" and min(values) > 0)
        save_figure(fig, files["sweep"])
    if args.json:
        print_json({"sweep": key, "results": results, "files": files})
        return 0
    print_table(f"{model.name} on {cluster.name}: sweep of {key}",
                [key, "ranks", "buckets", "step (ms)", "compute (ms)", "comm (ms)", "exposed (ms)", "overlap %"],
                [[r[key], r["world_size"], r["buckets"], f"{r['step_s'] * 1e3:.3f}", f"{r['compute_s'] * 1e3:.3f}",
                  f"{r['comm_s'] * 1e3:.3f}", f"{r['exposed_comm_s'] * 1e3:.3f}", f"{r['overlap_pct']:.1f}"]
                 for r in results])
    best = min(results, key=lambda r: r["step_s"])
    print(f"fastest: {key}={best[key]} ({best['step_s'] * 1e3:.3f} ms)")
    for path in files.values():
        print(f"wrote {path}")
    return 0
