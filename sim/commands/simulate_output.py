"""What `distlab simulate` prints and writes of a Result (sim/result.py): labels that follow the overrides, the
assumptions behind the numbers, the summary and the workload's tables (every marker explained), JSON; and the
plan-file path (`distlab simulate plan.json`)."""
from __future__ import annotations

import os
from dataclasses import asdict

from distlab.sim.cli import LONG_TABLE, note, print_json, print_table, say

SUMMARY_NOTE = ("communication: time rank 0 has data moving (collectives, send/recv); exposed: communication "
                "during which rank 0 computes nothing; overlap = hidden / communication")


def title(result) -> str:
    s = result.summary
    return f"{result.label}: step {s['step_s'] * 1e3:.2f} ms, overlap {s['overlap_pct']:.0f}%"


def assumptions(result) -> dict:
    """What the numbers assume: batch, sequence, dtypes, blocks, activation checkpointing (not modelled)."""
    cfg = result.model.config or {}
    out = {}
    if cfg.get("kind") == "gpt":
        out.update(micro_batch=cfg["micro_batch"], seq_len=cfg["seq_len"], blocks=cfg["layers"])
    elif cfg.get("kind") == "mlp":
        out.update(micro_batch=cfg["batch"], layers=len(cfg["widths"]) - 1)
    if "pp" in result.mesh and not any(isinstance(v, dict) and v.get("microbatches") is not None
                                       for v in result.scenario.values()):     # m not written: what set it
        out["microbatches_from"] = "global_batch" if result.scenario.get("global_batch") else "2 x pp x v"
    dtype = cfg.get("dtype") or (result.model.params[0].dtype if result.model.params else "float32")
    out["param_dtype"] = dtype
    opts = asdict(result.options)
    if result.workload.name == "fsdp":
        out["param_dtype"] = opts["param_dtype"] or dtype
        out["reduce_dtype"] = opts["reduce_dtype"] or out["param_dtype"]
        out["sharded_param_dtype"] = "float32" if result.plan.meta["zero"] == 3 else dtype
    elif result.workload.name == "ddp":
        out["grad_dtype"] = "float16" if opts["compress"] == "fp16" else dtype
    elif result.workload.name == "composed" and opts.get("fsdp"):
        out["param_dtype"] = opts["fsdp"]["param_dtype"] or dtype
        out["reduce_dtype"] = opts["fsdp"]["reduce_dtype"] or out["param_dtype"]
        if opts.get("pipeline"):
            out["fsdp_reshard_after_forward"] = opts["fsdp"]["reshard_after_forward"]
    if result.workload.name == "composed":
        tp, cp = opts.get("tp") or {}, opts.get("cp") or {}
        recompute = tp.get("recompute", cp.get("recompute", "none"))
        out["activation_checkpointing"] = recompute if recompute != "none" else False
        return out
    recompute = opts.get("recompute")                # the workloads that model it say which (tp, cp)
    out["activation_checkpointing"] = recompute if recompute not in (None, "none", False) else False
    return out


def options_lines(result) -> list[tuple[str, dict]]:
    """(section, its options) to print: the workload's; a composition's per parallelism, without TP's pipeline
    fields (the pipeline section has them)."""
    opts = asdict(result.options)
    if result.workload.name != "composed":
        return [(result.workload.name, opts)]
    hidden = {"tp": ("schedule", "microbatches", "virtual_stages", "split")}
    return [(name, {k: v for k, v in opts[name].items() if k not in hidden.get(name, ())})
            for name in result.options.names()]


def show(value) -> str:
    """A value as a scenario file writes it (YAML's words, not Python's): none, true, false, 3,3,2, k=v."""
    if value is None or isinstance(value, bool):
        return {None: "none", True: "true", False: "false"}[value]
    if isinstance(value, (list, tuple)):
        return ",".join(show(v) for v in value)
    if isinstance(value, dict):
        return " ".join(f"{k}={show(v)}" for k, v in value.items())
    return str(value)


def summary_rows(s: dict) -> list[list]:
    rows = [["step time", f"{s['step_s'] * 1e3:.3f} ms"], ["compute", f"{s['compute_s'] * 1e3:.3f} ms"],
            ["communication", f"{s['comm_s'] * 1e3:.3f} ms"],
            ["exposed communication", f"{s['exposed_comm_s'] * 1e3:.3f} ms"], ["overlap", f"{s['overlap_pct']:.1f} %"]]
    if "mfu" in s:
        rows += [[f"MFU (HFU), bf16 peak {s['mfu_peak_tflops']:g} TFLOP/s",
                  f"{100 * s['mfu']:.1f} % ({100 * s['hfu']:.1f} %)"]]
        if s["compute_peak_tflops"] != s["mfu_peak_tflops"]:      # e.g. float32: the CUDA cores' peak
            rows += [[f"MFU, {s['compute_dtype']} peak {s['compute_peak_tflops']:g} TFLOP/s",
                      f"{100 * s['mfu_of_compute_peak']:.1f} %"]]
        if "global_batch" in s and s.get("seq_len", 1) > 1:
            rows += [["global batch (sequences x length)", f"{s['global_batch']:,} x {s['seq_len']:,}"],
                     ["tokens per step", f"{s['tokens_per_step']:,}"]]
        elif "global_batch" in s:                                  # an MLP: samples, no sequence
            rows += [["global batch (samples)", f"{s['global_batch']:,}"]]
        rows += [["TFLOP/s per GPU", f"{s['tflops_per_gpu']:.1f}"],
                 ["tokens/s per GPU", f"{s['tokens_per_s_per_gpu']:,.0f}"],
                 ["model FLOPs per token", f"{s['model_flops_per_token'] / 1e9:.3g} GFLOP (6N + 12 l h s)"]]
    return rows


def mesh_json(result) -> dict:
    gpn = result.cluster.gpus_per_node
    return {"dims": result.mesh.as_dict(),
            "placement": [{"dim": p.dim, "size": p.size, "nodes_per_group": p.nodes_per_group,
                           "intra_node": p.intra_node} for p in result.mesh.placement(gpn)],
            "warnings": result.workload.placement_warnings(result.mesh, gpn)}


MAX_SHOWN_RANKS = 64      # beyond: trace.json and the per-rank JSON keep rank 0's groups (:func:`shown_ranks`)


def shown_ranks(result) -> list[int] | None:
    """The ranks the trace file and the per-rank JSON keep: every rank up to MAX_SHOWN_RANKS, else (a world of
    thousands: 16,384 ranks x their ops would not fit a file or a minute) rank 0's group on every mesh dimension,
    each cut to its first 4 ranks, and the last rank; None for all."""
    world = result.plan.world_size
    if world <= MAX_SHOWN_RANKS:
        return None
    ranks = {0, world - 1}
    for d in result.mesh.names:
        ranks.update(result.mesh.group_of(0, d)[:4])
    return sorted(ranks)


def sub_trace(trace, ranks: list[int] | None):
    """``trace`` with only ``ranks``' op records (no transfers), or itself for None."""
    if ranks is None:
        return trace
    from distlab.sim.trace import Trace
    return Trace([o for r in ranks for o in trace.for_rank(r)], [], {**trace.meta, "ranks_shown": ranks})


def result_json(result, changed: list[str]) -> dict:
    from distlab.sim.analysis import straggler_report, time_breakdown
    rep = result.report
    c = result.cluster
    shown = sub_trace(result.trace, shown_ranks(result))
    return {"scenario": result.scenario, "name": result.name, "label": result.label, "overrides": changed,
            "workload": result.workload.name, "options": asdict(result.options), "mesh": mesh_json(result),
            "model": {"name": result.model.name, "summary": result.model.summary(),
                      "params": result.model.num_params, "param_bytes": result.model.param_bytes},
            "cluster": {"name": c.name, "nodes": c.nodes, "gpus_per_node": c.gpus_per_node,
                        "gpu_memory_GiB": c.gpu.memory_GiB},
            "world_size": result.plan.world_size, "assumptions": assumptions(result), **result.summary,
            **rep.get("json", {}), "time_by_rank": [vars(b) for b in time_breakdown(shown)],
            "stragglers": straggler_report(shown), "warnings": warnings(result)}


def warnings(result) -> list[str]:
    return result.workload.placement_warnings(result.mesh, result.cluster.gpus_per_node) \
        + result.report.get("warnings", [])


def print_result(result, changed: list[str]) -> None:
    """The summary first (what ran, the step's times, the workload's key figures), then the workload's tables,
    each cut to its first and last rows without --verbose; every line within 100 columns unless --wide."""
    from distlab.sim.analysis import straggler_report, time_breakdown
    c = result.cluster
    name = result.scenario.get("name")
    if name and changed:
        say(f"scenario: {result.label} (from {name!r}, with {' '.join(changed)})", indent="          ")
    else:
        say(f"scenario: {name or result.label}", indent="          ")
    say(f"model:    {result.model.summary()}", indent="          ")
    say(f"cluster:  {c.name}, {result.plan.world_size} ranks ({c.nodes} node(s) x {c.gpus_per_node}, "
        f"{c.gpu.memory_GiB:g} GiB per GPU)", indent="          ")
    place = ", ".join(f"{p.dim}={p.size} ({'inside a node' if p.intra_node else f'across {p.nodes_per_group} nodes'})"
                      for p in result.mesh.placement(c.gpus_per_node))
    say(f"mesh:     {place}", indent="          ")
    for name, opts in options_lines(result):
        say(f"{name}: {', '.join(f'{k}={show(v)}' for k, v in opts.items())}", indent="          ")
    say("assumes:  " + ", ".join(f"{k}={show(v)}" for k, v in assumptions(result).items()), indent="          ")
    rep = result.report
    print_table(None, ["", "value"], [[k, show(v)] for k, v in summary_rows(result.summary) + rep.get("rows", [])])
    note(SUMMARY_NOTE)
    if result.scenario.get("stragglers") or result.scenario.get("degraded_links"):
        shown = sub_trace(result.trace, shown_ranks(result))
        print_table("where the time went (per rank, ms)", ["rank", "compute", "waiting for peers", "moving data"],
                    [[b.rank, f"{b.compute_s * 1e3:.3f}", f"{b.waiting_s * 1e3:.3f}", f"{b.transfer_s * 1e3:.3f}"]
                     for b in time_breakdown(shown)], max_rows=LONG_TABLE)
        for line in straggler_report(shown):
            say(line, indent="  ")
    for table in rep.get("tables", []):
        print_table(table["title"], table["columns"], table["rows"], justify_left=1, max_rows=LONG_TABLE)
        for text in table.get("notes", []):
            note(text)
    for line in warnings(result):
        say(f"warning: {line}", indent="  ")
    for line in result.summary.get("compute_notes", []):
        say(f"note: {line}", indent="  ")


def sweep_figure(workload, rows: list[dict], key: str, title: str):
    if workload.sweep_figure is not None:
        return workload.sweep_figure(rows, key, title)
    from distlab.sim.plots import sweep
    ms = lambda k: [r[k] * 1e3 for r in rows]  # noqa: E731
    values = [r[key] for r in rows]
    return sweep(values, {"step": ms("step_s"), "exposed communication": ms("exposed_comm_s")}, key, "time (ms)",
                 title=title, logx=key == "bucket_cap_mb" and min(v for v in values if v is not None) > 0)


# a step summary's fields a sweep table leaves to --json: conventions, peaks and notes, the same in every row
SWEEP_HIDDEN = {"mesh", "compute_notes", "flops_convention", "mfu_peak", "mfu_peak_tflops", "compute_dtype",
                "compute_peak_tflops", "model_flops_per_token", "hardware_flops_per_token", "hfu",
                "mfu_of_compute_peak", "tflops_per_gpu", "seq_len"}


def print_sweep(rows: list[dict], key: str, title: str) -> None:
    """One row per swept value: what varies first (step, its change, MFU, exposed communication, overlap, the
    workload's columns), then the rest; columns the same in every row are said once under the table
    (sim/output.py print_table)."""
    first = [key, "step_s", "step_change_pct", "mfu", "exposed_comm_s", "overlap_pct"]
    generic = ["compute_s", "comm_s", "tokens_per_s_per_gpu", "world_size", "global_batch", "tokens_per_step"]
    own = [k for k in rows[0] if k not in first and k not in generic and k not in SWEEP_HIDDEN]
    cols = [k for k in first + own + generic if k in rows[0]]       # the workload's own before the generic
    seconds = lambda k: k.endswith("_s") and not k.endswith("_per_s")  # noqa: E731
    fmt = (lambda k, v: f"{v * 1e3:.3f}" if seconds(k) else f"{v:+.1f}" if k == "step_change_pct"
           else f"{100 * v:.1f}" if k == "mfu" else f"{v:.1f}" if k.endswith("pct")
           else f"{v:,}" if k.startswith("tokens_per_step") or k == "global_batch"
           else f"{v / 2**20:.4g}" if k.endswith("bytes") else f"{v:.4g}" if isinstance(v, float) else v)
    head = {"step_s": "step (ms)", "compute_s": "compute (ms)", "comm_s": "comm (ms)", "mfu": "MFU %",
            "exposed_comm_s": "exposed (ms)", "overlap_pct": "overlap %", "world_size": "ranks",
            "step_change_pct": "step vs first (%)", "tokens_per_s_per_gpu": "tokens/s/GPU"}
    header = (lambda k: head.get(k) or (k.removesuffix("_s").replace("_", " ") + " (ms)" if seconds(k) else
                                         k.replace("_per_s", "/s").removesuffix("_bytes").replace("_", " ")
                                         + (" (MiB)" if k.endswith("_bytes") else "")))
    print_table(title, [header(k) for k in cols],
                [[fmt(k, r[k]) if k != key else show(r[k]) for k in cols] for r in rows])
    best = min(rows, key=lambda r: r["step_s"])
    say(f"fastest: {key}={show(best[key])} ({best['step_s'] * 1e3:.3f} ms)")


def run_plan_file(args, plan=None, extra: dict | None = None) -> int:
    """`distlab simulate plan.json [--cluster C --nodes N]`: the plan's step on the cluster (its world size): the
    cluster of the plan's scenario header when it has one and --cluster is not given, else dgx-h100.
    ``plan``: one already built (--from-profile) instead of the file; ``extra``: more keys for --json."""
    from distlab.sim.cluster import load_cluster
    from distlab.sim.kernel.engine import simulate
    from distlab.sim.errors import ConfigError
    from distlab.sim.plan import Plan
    from distlab.sim.result import step_summary
    ignored = [f for f in ("model", "micro_batch", "mesh", "sweep") if getattr(args, f, None)]
    if ignored:
        raise ConfigError(f"--{ignored[0].replace('_', '-')} does not apply to a plan file (a plan fixes the "
                          "model and the parallelism); allowed: --cluster, --nodes, --world-size", args.scenario)
    plan = plan if plan is not None else Plan.load(args.scenario)
    from distlab.sim.scenario.header import describe, scenario_of_plan
    s = scenario_of_plan(plan, args.scenario or "plan")      # the scenario it was built from, checked
    header = None if s is None else {"label": describe(s), "scenario": plan.scenario}
    if s is not None and args.cluster is None:            # the header's cluster, unless --cluster says
        cluster = s.cluster.cluster if args.nodes is None else load_cluster(s.cluster.source, args.nodes)
    else:
        cluster = load_cluster(args.cluster or "dgx-h100", args.nodes)
    if cluster.world_size != plan.world_size:
        cluster = cluster.with_world_size(plan.world_size)
    if args.world_size is not None and args.world_size != plan.world_size:
        raise ConfigError(f"the plan has {plan.world_size} ranks", "--world-size")
    trace = simulate(plan, cluster, record_transfers=False)
    summary = step_summary(trace)
    files = {}
    if args.save_plan:
        plan.save(args.save_plan)
        files["plan"] = args.save_plan
    label = f"plan {plan.name!r} on {cluster.nodes} x {cluster.name} ({plan.world_size} ranks)"
    if not args.no_files:
        from distlab.sim.files import make_folder
        from distlab.sim.io import save_figure
        from distlab.sim.plots import timeline
        make_folder(args.out, "--out")   # never through a planted link
        files["trace"] = os.path.join(args.out, "trace.json")
        trace.save(files["trace"])
        files["timeline"] = os.path.join(args.out, "timeline.png")
        save_figure(timeline(trace, ranks=list(range(min(2, plan.world_size))),
                             title=f"{label}: step {summary['step_s'] * 1e3:.2f} ms"), files["timeline"])
    if args.json:
        print_json({"schema": "distlab.simulate/1", "results": [{
            "plan": plan.name, "label": label, "cluster": {"name": cluster.name, "nodes": cluster.nodes,
                                                           "gpus_per_node": cluster.gpus_per_node},
            "world_size": plan.world_size, **summary, **({"scenario": header["scenario"]} if header else {})}],
            "files": files, **(extra or {})})
        return 0
    say(f"plan:     {plan.name} ({plan.world_size} ranks, {sum(len(r) for r in plan.ranks)} ops)", indent="  ")
    if header:
        say(f"scenario: {header['label']}", indent="  ")
    say(f"cluster:  {cluster.name}, {cluster.nodes} node(s) x {cluster.gpus_per_node}", indent="  ")
    print_table(None, ["", "value"], summary_rows(summary))
    note(SUMMARY_NOTE)
    for path in files.values():
        print(f"wrote {path}")
    return 0
