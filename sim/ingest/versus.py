"""A plan's prediction held against a torch.profiler trace of the real job: `distlab compare PLAN PROFILE_DIR`.

    c = compare_profile(predicted_trace, load_profile("traces/"))    # {"ranks": [...], "collectives": [...]}

Per traced rank, over one profiled step (scenario.py ``step_events``; kineto.py's HTA rules), measured and
predicted side by side, per kind: step (first kernel's start to last kernel's end; the simulated makespan),
compute (union of compute kernels / ops), communication (union of NCCL kernels / collectives), exposed
communication (communication not under compute), overlap (HTA's: overlapped / communication) and idle (step -
union of everything). Compute is also held kind by kind (GEMM, attention, memory-bound, other), the measured
kernels matched in order to the plan's compute ops (compute_match.py), with what was left unmatched.
Collectives are matched in issue order per op: the k-th measured all_reduce of a rank with the plan's k-th
all_reduce of that rank; each pair's measured (NCCL kernel) and predicted duration and bytes. A collective's
duration includes waiting for its peers on both sides (the NCCL kernel spins until they arrive).
``merged_chrome`` writes one Perfetto trace: a process per rank, threads "measured stream N" (the kernels, from
the step's first kernel) above "predicted <stream>" (the simulated ops).
"""
from __future__ import annotations

from distlab.sim.errors import ConfigError
from distlab.sim.kernel.spans import overlap, union, union_length

COMM_KINDS = ("collective", "send", "recv")


def _parts(spans_all, spans_comp, spans_comm, step: float) -> dict:
    comp, comm = union(spans_comp), union(spans_comm)
    comm_t, comp_t = sum(e - s for s, e in comm), sum(e - s for s, e in comp)
    both = overlap(comm, comp)
    return {"step_s": step, "compute_s": comp_t, "communication_s": comm_t, "exposed_communication_s": comm_t - both,
            "overlap": both / comm_t if comm_t else None, "idle_s": step - union_length(spans_all)}


def measured_rank(events) -> dict:
    """The measured kinds of one rank's step (seconds)."""
    from distlab.sim.ingest.kineto import per_kind
    from types import SimpleNamespace
    live = [e for e in events if e.dur_us > 0]
    if not live:
        return {}
    t0 = min(e.start_us for e in live)
    step = (max(e.end_us for e in live) - t0) * 1e-6

    def sp(es):
        return [((e.start_us - t0) * 1e-6, (e.end_us - t0) * 1e-6) for e in es]
    out = _parts(sp(live), sp([e for e in live if e.hta_compute]), sp([e for e in live if e.kind == "communication"]),
                 step)
    kinds = per_kind(SimpleNamespace(events=live))
    out["by_kernel"] = {k: v * 1e-6 for k, v in kinds.items()}
    return out


def predicted_rank(trace, rank: int) -> dict:
    ops = [o for o in trace.ops if o.rank == rank and o.end > o.start]
    if not ops:
        return {}
    return _parts([(o.start, o.end) for o in ops], [(o.start, o.end) for o in ops if o.kind == "compute"],
                  [(o.start, o.end) for o in ops if o.kind in COMM_KINDS], max(o.end for o in ops))


def match_collectives(trace, rank: int, events) -> list[dict]:
    """The k-th measured collective of each op against the plan's k-th of that op, on one rank."""
    measured: dict[str, list] = {}
    for e in sorted(events, key=lambda e: e.start_us):
        if e.kind == "communication" and e.op and e.op != "send_recv":
            measured.setdefault(e.op, []).append(e)
    predicted: dict[str, list] = {}
    for o in sorted((o for o in trace.ops if o.rank == rank and o.kind == "collective"), key=lambda o: o.start):
        predicted.setdefault(o.op, []).append(o)
    out = []
    for op, ms in measured.items():
        for k, (m, p) in enumerate(zip(ms, predicted.get(op, []))):
            meas, pred = m.dur_us * 1e-6, p.end - p.start
            out.append({"rank": rank, "op": op, "k": k, "measured_bytes": m.nbytes, "predicted_bytes": p.bytes,
                        "algorithm": m.algorithm, "protocol": m.protocol, "measured_s": meas, "predicted_s": pred,
                        "error": (pred - meas) / meas if meas > 0 else None})
    return out


def compare_profile(trace, profile, step: int = 0, plan=None, gpu=None) -> dict:
    """{"ranks": [{rank, measured, predicted}], "collectives": [pairs], "compute": [per rank]} (module
    docstring); ``plan`` and ``gpu`` (the plan simulated and its GPU spec) give the compute ops their kinds."""
    from distlab.sim.ingest.compute_match import match_compute
    from distlab.sim.ingest.scenario import step_events
    world = 1 + max(o.rank for o in trace.ops) if trace.ops else 0
    outside = [r for r in profile.ranks if r >= world]
    if outside:
        raise ConfigError(f"the profile has rank {outside[0]}; the prediction has {world} ranks (simulate the "
                          "plan at the job's world size)", profile.directory)
    ranks, pairs, compute = [], [], []
    for r, t in profile.ranks.items():
        events = step_events(t, step)
        ranks.append({"rank": r, "measured": measured_rank(events), "predicted": predicted_rank(trace, r)})
        pairs += match_collectives(trace, r, events)
        compute.append(match_compute(trace, plan, gpu, r, events))
    return {"profile": profile.directory, "step": step, "ranks": ranks, "collectives": pairs, "compute": compute}


def merged_chrome(trace, profile, step: int = 0) -> dict:
    """One Chrome/Perfetto trace of the profile's step and the prediction (module docstring)."""
    from distlab.sim.ingest.scenario import step_events
    events = []
    for r, t in profile.ranks.items():
        es = [e for e in step_events(t, step) if e.dur_us > 0]
        if not es:
            continue
        t0 = min(e.start_us for e in es)
        events.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
        streams = sorted({e.stream for e in es})
        for i, s in enumerate(streams):
            events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": 1000 + i,
                           "args": {"name": f"measured stream {s}"}})
        for e in es:
            events.append({"ph": "X", "name": e.name.split("(")[0][:120], "cat": f"measured {e.kind}", "pid": r,
                           "tid": 1000 + streams.index(e.stream), "ts": e.start_us - t0, "dur": e.dur_us,
                           "args": {k: v for k, v in (("op", e.op), ("bytes", e.nbytes)) if v is not None}})
        mine = [o for o in trace.ops if o.rank == r and o.end > o.start]
        names = sorted({o.stream for o in mine})
        for i, s in enumerate(names):
            events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": 2000 + i,
                           "args": {"name": f"predicted {s}"}})
        for o in mine:
            events.append({"ph": "X", "name": o.name or o.op or o.kind, "cat": f"predicted {o.kind}", "pid": r,
                           "tid": 2000 + names.index(o.stream), "ts": o.start * 1e6, "dur": (o.end - o.start) * 1e6,
                           "args": {"op": o.op, "bytes": o.bytes}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": "distlab compare: predicted against a torch.profiler trace"}}


def predicted_trace(path: str, cluster: str | None, profile):
    """(trace, plan or None, GPU spec): the prediction: a scenario .yaml simulated as it says, or a plan (or a
    distlab trace, which names no plan) on ``cluster`` (by default the preset of the profile's GPU, fit.py
    preset_for; localhost-cpu for a CPU profile)."""
    if path.endswith((".yaml", ".yml")):
        from distlab.sim import scenario as sc
        result = sc.simulate(sc.load(path), path)
        return result.trace, result.plan, result.cluster.gpu
    from distlab.sim.cluster import load_cluster
    from distlab.sim.compare import load_trace
    from distlab.sim.ingest.fit import preset_for
    from distlab.sim.io import load_json
    from distlab.sim.plan import FORMAT, Plan
    devices = [t.device for t in profile.ranks.values() if t.device]
    gpu = any(t.gpu for t in profile.ranks.values())
    cluster = cluster or (preset_for(devices)[0] if gpu else "localhost-cpu")
    trace = load_trace(path, cluster)
    data = load_json(path, "plan")
    plan = Plan.from_dict(data, path) if isinstance(data, dict) and data.get("format") == FORMAT else None
    return trace, plan, load_cluster(cluster).gpu


def run(args) -> int:
    """`distlab compare SCENARIO_OR_PLAN PROFILE_DIR` (runtime/commands/compare.py hands over here)."""
    import json

    from distlab.sim.cli import print_json
    from distlab.sim.ingest.kineto import load_profile
    from distlab.sim.io import check_output, write_atomic
    from distlab.sim.output import print_table, say
    if args.out is not None:
        check_output(args.out, "--out", "trace")
    profile = load_profile(args.measured)
    trace, plan, gpu = predicted_trace(args.predicted, None if args.cluster == "localhost-cpu" else args.cluster,
                                       profile)
    c = compare_profile(trace, profile, args.step, plan, gpu)
    if args.out:
        write_atomic(args.out, json.dumps(merged_chrome(trace, profile, args.step), separators=(",", ":")))
    if args.json:
        print_json({**c, "predicted": args.predicted, "measured": args.measured, "cluster": trace.meta.get("cluster"),
                    "out": args.out})
        return 0
    ms = _ms
    for r in c["ranks"]:
        m, p = r["measured"], r["predicted"]
        rows = [[k, ms(m.get(key)), ms(p.get(key)), _err(p.get(key), m.get(key))]
                for k, key in (("step", "step_s"), ("compute", "compute_s"), ("communication", "communication_s"),
                               ("exposed communication", "exposed_communication_s"), ("idle", "idle_s"))]
        rows.append(["overlap (of communication)", _pct(m.get("overlap")), _pct(p.get("overlap")), ""])
        print_table(f"rank {r['rank']}, profiled step {c['step']}: measured ({args.measured}) against predicted "
                    f"({args.predicted})", ["", "measured (ms)", "predicted (ms)", "error"], rows, justify_left=1)
    print_compute(c["compute"])
    pairs = c["collectives"]
    if pairs:
        print_table(f"collectives matched in issue order ({len(pairs)})",
                    ["rank", "op", "#", "bytes", "NCCL algo/proto", "measured (ms)", "predicted (ms)", "error"],
                    [[p["rank"], p["op"], p["k"], _bytes(p["measured_bytes"], p["predicted_bytes"]),
                      f"{p['algorithm']}/{p['protocol']}" if p["algorithm"] else "-", ms(p["measured_s"]), ms(p["predicted_s"]),
                      _err(p["predicted_s"], p["measured_s"])] for p in pairs[:20]], justify_left=2)
    else:
        say("no collective matched (the trace's NCCL kernels carry no op, or the plan has none)", indent="  ")
    if args.out:
        say(f"wrote {args.out}")
    return 0


def print_compute(per_rank: list[dict]) -> None:
    """Compute kind by kind per rank, the first matched ops, and what was left unmatched (compute_match.py)."""
    from distlab.sim.output import print_table, say
    for m in per_rank:
        rows = [[k, _ms(v["measured_s"]), _ms(v["predicted_s"]), _err(v["predicted_s"], v["measured_s"]),
                 f"{v['matched_kernels']}/{v['measured_kernels']}", v["plan_ops"]]
                for k, v in m["kinds"].items() if v["measured_kernels"] or v["plan_ops"]]
        print_table(f"rank {m['rank']}: compute by kind", ["kind", "measured (ms)", "predicted (ms)", "error",
                    "kernels matched", "plan ops"], rows, justify_left=1)
        left = m["unmatched"]
        for kind, u in left["measured"].items():
            say(f"unmatched measured {kind}: {u['kernels']} kernels, {_ms(u['seconds'])} ms "
                f"({', '.join(u['names'])})", indent="  ")
        if left["plan_ops"]:
            more = len(left["plan_ops"]) - 4
            say(f"unmatched plan ops: {', '.join(left['plan_ops'][:4])}" + (f" and {more} more" if more > 0 else ""),
                indent="  ")
    pairs = [p for m in per_rank for p in m["matched"]]
    if pairs:
        print_table(f"compute ops matched by kind in order ({len(pairs)}; the first 12)",
                    ["rank", "plan op", "kind", "kernels", "measured (ms)", "predicted (ms)", "error"],
                    [[p["rank"], p["op"][:32], p["kind"], f"{p['kernels']}/{p['plan_kernels']}",
                      _ms(p["measured_s"]), _ms(p["predicted_s"]), _err(p["predicted_s"], p["measured_s"])]
                     for p in pairs[:12]], justify_left=3)


def _bytes(measured, predicted) -> str:
    """The measured size, and the plan's when it differs (the k-th collective of the plan is another one)."""
    return f"{measured or '?'}" if measured == predicted else f"{measured or '?'} (plan {predicted})"


def _ms(x) -> str:
    return "" if x is None else f"{x * 1e3:.3f}"


def _pct(x) -> str:
    return "" if x is None else f"{x * 100:.1f}%"


def _err(pred, meas) -> str:
    return "" if pred is None or not meas else f"{(pred - meas) / meas * 100:+.1f}%"
