"""Lesson helpers for DDP and FSDP/ZeRO (lessons 05 and 06): scenarios, sweeps, tables and figures. No torch."""
from __future__ import annotations

from distlab.sim.lessons.helpers import Figure, Table
from distlab.sim.plan import format_bytes


# --- timelines, DDP and FSDP (lessons 05 and 06) ---------------------------------------------------------------
# The models the real runs of lessons 05 and 06 use (small enough for 2 gloo ranks on a 2-core machine).
CPU_DDP_MODEL = {"kind": "mlp", "widths": [512] * 13, "batch": 32}           # 12 x Linear(512, 512), 12 MiB
CPU_PIPE_MODEL = {"kind": "mlp", "widths": [512] * 9, "batch": 512}           # lesson 07: 8 x Linear(512, 512)
CPU_FSDP_MODEL = {"kind": "gpt", "arch": "llama", "layers": 4, "hidden": 256, "heads": 4, "seq_len": 128,
                  "vocab": 2001, "micro_batch": 2, "dtype": "float32"}       # scenarios/fsdp-cpu.yaml, 5.2M params


def from_pyplot(fig) -> Figure:
    """Wrap a figure made by sim.plots (pyplot) so that Jupyter shows it once, as a PNG."""
    import matplotlib.pyplot as plt
    plt.close(fig)                                  # drop it from pyplot: no second copy from the inline backend
    f = Figure.__new__(Figure)
    f.fig, f.axes = fig, list(fig.axes)
    f.ax = f.axes[0]
    return f


def plot_timeline(trace, ranks=None, title: str | None = None, **kw) -> Figure:
    """distlab.sim.plots.timeline of ``trace`` (default: the first two ranks), compute and comm streams per rank."""
    from distlab.sim.plots import timeline
    ranks = ranks if ranks is not None else sorted({o.rank for o in trace.ops})[:2]
    return from_pyplot(timeline(trace, ranks=ranks, title=title, **kw))


def scenario(model="gpt2-medium", parallelism: str = "ddp", cluster: str = "dgx-h100", nodes: int | None = None,
             micro_batch: int | None = None, **options):
    """The typed Scenario (sim/scenario/spec.py), parsed and checked here once, from keywords: ``model`` a preset
    name or a model spec mapping; ``options`` go to ``parallelism`` (bucket_cap_mb=..., zero=...,
    reshard_after_forward=...). What the lessons do with it: :func:`simulate`, :func:`sweep`, sweep_results."""
    from distlab.sim import scenario as sc
    spec = {"preset": model} if isinstance(model, str) else dict(model)
    if micro_batch is not None:
        spec["micro_batch" if spec.get("kind") != "mlp" else "batch"] = micro_batch
    d = {"model": spec, "parallelism": {"kind": parallelism, **options}, "cluster": cluster}
    if nodes is not None:
        d["nodes"] = nodes
    return sc.from_dict(d, "scenario")


def fitted_cluster(workdir: str = "work") -> str:
    """Lesson 04's calibrated cluster file (``work/localhost-calibrated.yaml``) if it exists, else the uncalibrated
    ``localhost-cpu`` preset: what the 'your machine' exercises of lessons 05 and 06 predict from."""
    import os
    path = os.path.join(workdir, "localhost-calibrated.yaml")
    return path if os.path.isfile(path) else "localhost-cpu"


def simulate(d) -> dict:
    """Simulate one step of scenario ``d`` (a mapping or a Scenario): {"result" (sim.result.Result), "trace", "info", "model", "cluster",
    "plan", "summary" (step, compute, comm, exposed comm, overlap %), "buckets" (DDP: per bucket rows with
    launch times), "report" (the workload's report data, e.g. FSDP's peak memory)}."""
    from distlab.sim import scenario as sc
    r = sc.simulate(d)
    out = {"result": r, "trace": r.trace, "info": r.info, "model": r.model, "cluster": r.cluster, "plan": r.plan,
           "summary": r.summary}
    data = r.report.get("json", {})
    if "buckets" in data:
        out["buckets"] = data["buckets"]
    elif data:
        out["report"] = data
        pk = data.get("peak_memory")
        if pk:                                      # the lessons' names for FSDP's peak: total, rank, time
            out["report"] = {**data, "peak_memory": {**pk, "total": pk["total_bytes"], "rank": pk["rank"],
                                                     "time": pk["time_s"], "breakdown": pk["breakdown_bytes"]}}
    return out


def summary_table(summary: dict, title: str = "") -> Table:
    """Step, compute, communication, exposed communication (ms) and overlap (%) of ``simulate(...)["summary"]``."""
    ms = lambda k: f"{summary[k] * 1e3:.3f}"  # noqa: E731
    return Table(["step (ms)", "compute (ms)", "communication (ms)", "exposed comm (ms)", "overlap"],
                 [[ms("step_s"), ms("compute_s"), ms("comm_s"), ms("exposed_comm_s"),
                   f"{summary['overlap_pct']:.1f}%"]], title)


def bucket_table(rows: list[dict], title: str = "buckets (rank 0; times in ms)") -> Table:
    """DDP buckets: size, parameters, first .. last, ready, launch (the Reducer's rule), all-reduce end."""
    ms = lambda t: "-" if t is None else f"{t * 1e3:.3f}"  # noqa: E731
    return Table(["bucket", "MiB", "params", "first .. last", "ready", "launch", "end"],
                 [[r["index"], f"{r['bytes'] / 2**20:.2f}", r["params"], f"{r['first']} .. {r['last']}",
                   ms(r["ready_s"]), ms(r.get("ddp_launch_s")), ms(r["end_s"])] for r in rows], title)


def sweep(d, key: str, values) -> list[dict]:
    """Simulate scenario ``d`` (a Scenario or a mapping) once per value of ``key`` (as `distlab simulate --sweep KEY=...`): rows with
    the value, world_size, buckets, step_s, compute_s, comm_s, exposed_comm_s, overlap_pct."""
    from distlab.sim import scenario as sc
    base = sc.scenario_of(d)                        # parsed once; each value a Scenario (sim/scenario vary)
    rows = []
    for v in values:
        r = simulate(sc.vary(base, key, v))
        rows.append({key: v, **r["summary"], "buckets": len(r["info"].get("buckets", [])),
                     "world_size": r["plan"].world_size})
        if "report" in r:                           # fsdp: the peak memory per GPU
            rows[-1]["peak_GiB"] = r["report"]["peak_memory"]["total"] / 2**30
    return rows


def sweep_table(rows: list[dict], key: str, title: str = "") -> Table:
    """Rows of :func:`sweep`; DDP rows show their bucket count, FSDP rows their peak memory per GPU."""
    fsdp = all("peak_GiB" in r for r in rows)
    cols = [key, "ranks", "peak memory (GiB)" if fsdp else "buckets", "step (ms)", "compute (ms)", "comm (ms)",
            "exposed (ms)", "overlap"]
    return Table(cols, [[r[key], r["world_size"], f"{r['peak_GiB']:.2f}" if fsdp else r["buckets"],
                         f"{r['step_s'] * 1e3:.3f}", f"{r['compute_s'] * 1e3:.3f}", f"{r['comm_s'] * 1e3:.3f}",
                         f"{r['exposed_comm_s'] * 1e3:.3f}", f"{r['overlap_pct']:.1f}%"] for r in rows], title)


def fastest(rows: list[dict], key: str, field: str = "step_s"):
    """The value of ``key`` whose row has the smallest ``field``."""
    return min(rows, key=lambda r: r[field])[key]


def zero_bytes(model, world: int, zero: int, shard_size: int | None = None) -> dict:
    """Per-GPU bytes of params, grads and optimizer state (Adam) at ZeRO stage ``zero`` (0 = DDP), and total:
    sim/parallel/memory.py, the one model of `distlab memory` and `simulate` (ZeRO-3 as FSDP2 keeps it: fp32
    shards of params and grads, 4 + 4 + 8 bytes per parameter)."""
    from distlab.sim.models import model_from_spec
    from distlab.sim.parallel.memory import estimate
    parts = estimate(model_from_spec(model), world, zero, shard_size)
    out = {k: parts[k] for k in ("params", "grads", "optimizer")}
    return {**out, "total": sum(out.values())}


def zero_table(model, world: int) -> Table:
    """What each ZeRO stage keeps per GPU (GiB) on ``world`` ranks: DDP, ZeRO-1 (optimizer sharded),
    ZeRO-2 (+ gradients), ZeRO-3 / FSDP (+ parameters)."""
    from distlab.sim.models import model_from_spec
    m = model_from_spec(model)
    names = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3 / FSDP"}
    sharded = {0: "nothing", 1: "optimizer", 2: "optimizer, grads", 3: "optimizer, grads, params"}
    rows = []
    for z in (0, 1, 2, 3):
        b = zero_bytes(m, world, z)
        rows.append([names[z], sharded[z], *[f"{b[k] / 2**30:.3f}" for k in ("params", "grads", "optimizer", "total")]])
    return Table(["stage", "sharded", "params (GiB)", "grads (GiB)", "optimizer (GiB)", "total (GiB)"], rows,
                 f"{m.summary()}; per GPU on {world} ranks, Adam")


def bytes_sent(plan, rank: int = 0) -> float:
    """Bytes ``rank`` sends in one step of ``plan`` if every collective is a ring: sum of factor(op, n) x S
    (sim.collectives.ring_cost; n = the collective's group size)."""
    from distlab.sim.collectives import ring_cost
    from distlab.sim.plan import Collective
    total = 0.0
    for o in plan.ranks[rank]:
        if isinstance(o, Collective):
            n = len(plan.group_of(o))
            if n > 1:
                total += ring_cost(o.op, n)[1] * o.bytes
    return total


def comm_per_step(model, world: int, zero: int) -> float:
    """Bytes one GPU sends per step under DDP (zero=0) or ZeRO stage 1/2/3 (ring collectives). Under ZeRO only
    rank 0's program is built (sim/parallel/fsdp/plan.py ``only``; its collectives name their groups): the
    same bytes as the whole plan's rank 0, without the other world - 1 programs (64 ranks: 0.4 s -> 5 ms)."""
    from distlab.sim.mesh import Mesh
    from distlab.sim.parallel.ddp.plan import ddp_plan
    from distlab.sim.parallel.fsdp.plan import fsdp_plan, parse_config
    from distlab.sim.models import model_from_spec
    m = model_from_spec(model)
    if zero == 0:
        return bytes_sent(ddp_plan(m, world)[0])
    cfg = parse_config({"zero": zero}, world)                  # as build_fsdp: one shard group of the world
    mesh = Mesh({"dp_replicate": world // cfg.shard_size, "dp_shard": cfg.shard_size})
    return bytes_sent(fsdp_plan(m, mesh, cfg, only=[0]))


def world_sweep(model, worlds, stages=(0, 1, 2, 3)) -> dict:
    """Per GPU static memory (GiB) and bytes sent per step (GiB) for each stage across ``worlds``:
    {"memory": {label: [...]}, "comm": {label: [...]}}."""
    names = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
    return {"memory": {names[z]: [zero_bytes(model, n, z)["total"] / 2**30 for n in worlds] for z in stages},
            "comm": {names[z]: [comm_per_step(model, n, z) / 2**30 for n in worlds] for z in stages}}


def collectives_table(plan, rank: int = 0, title: str = "") -> Table:
    """The collectives of ``plan`` on ``rank`` in issue order: name, op, size, dtype, stream."""
    from distlab.sim.plan import Collective
    rows = [[i, o.name or o.op, o.op, format_bytes(o.bytes), o.dtype, o.stream]
            for i, o in enumerate([o for o in plan.ranks[rank] if isinstance(o, Collective)])]
    return Table(["#", "name", "op", "size", "dtype", "stream"], rows, title)


def plot_fsdp(result: dict, title: str | None = None) -> Figure:
    """The timeline of a simulated fsdp scenario (``simulate(...)``) with rank 0's memory beneath it."""
    return from_pyplot(result["result"].figure(title))


def predicted_measured_table(rows: list[dict], key: str, title: str = "", extra: tuple[str, ...] = ()) -> Table:
    """Rows with ``key``, predicted_s and measured_s (and error_pct): one line each, times in ms."""
    return Table([key, *extra, "predicted (ms)", "measured (ms)", "error"],
                 [[r[key], *[r[k] for k in extra], f"{r['predicted_s'] * 1e3:.2f}", f"{r['measured_s'] * 1e3:.2f}",
                   f"{(r['predicted_s'] - r['measured_s']) / r['measured_s'] * 100:+.1f}%"] for r in rows], title)
