"""Small helpers the lesson notebooks call: tables and figures that display in Jupyter, rank layouts, the α-β
model, simulated sweeps and the error table. No torch here (real runs are in runtime/lessons.py).

Figures are built with matplotlib's object API (no pyplot, no backend switch) and wrapped in ``Figure``, which
Jupyter shows as a PNG; ``.save(path)`` writes it. Tables show as HTML in Jupyter and as text elsewhere.
"""
from __future__ import annotations

import html
import io
import os

from sim.plan import format_bytes


class Table:
    """Rows under a header; HTML in Jupyter, aligned text in print()."""

    def __init__(self, columns: list[str], rows: list[list], title: str = ""):
        self.columns, self.rows, self.title = columns, [[str(c) for c in r] for r in rows], title

    def __str__(self) -> str:
        widths = [max(len(c), *(len(r[i]) for r in self.rows)) if self.rows else len(c)
                  for i, c in enumerate(self.columns)]
        lines = [self.title] if self.title else []
        lines.append("  ".join(c.ljust(w) for c, w in zip(self.columns, widths)))
        lines += ["  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths)))
                  for r in self.rows]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>" for r in self.rows)
        cap = f"<caption style='text-align:left'>{html.escape(self.title)}</caption>" if self.title else ""
        return f"<table class='distlab-table'>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class Figure:
    """A matplotlib figure that Jupyter displays as a PNG (``fig.ax`` is its axes)."""

    def __init__(self, width: float = 7.0, height: float = 4.2, ncols: int = 1):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure as MplFigure
        self.fig = MplFigure(figsize=(width, height))
        FigureCanvasAgg(self.fig)
        axes = self.fig.subplots(1, ncols)
        self.axes = list(axes) if ncols > 1 else [axes]
        self.ax = self.axes[0]

    def png(self) -> bytes:
        buf = io.BytesIO()
        self.fig.tight_layout()
        self.fig.savefig(buf, format="png", dpi=100)
        return buf.getvalue()

    def _repr_png_(self) -> bytes:
        return self.png()

    def save(self, path: str) -> str:
        from sim.io import write_atomic
        write_atomic(path, self.png())
        return path


def _log_y(ax) -> None:
    """A log y axis labelled 0.1, 1, 10 (and 20, 50, ... between) rather than 10^-1 or 4x10^2."""
    from matplotlib.ticker import FuncFormatter
    ax.set_yscale("log")
    label = FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "1235" else "")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(label)


def workdir(name: str = "work") -> str:
    """A folder for the files a lesson writes (rank scripts, cluster YAMLs), under the current directory."""
    path = os.path.abspath(name)
    os.makedirs(path, exist_ok=True)
    return path


def ranks_table(nodes: int, procs_per_node: int) -> Table:
    """What torchrun gives each process of ``nodes`` x ``procs_per_node``: RANK, LOCAL_RANK, WORLD_SIZE."""
    world = nodes * procs_per_node
    rows = [[node, local, node * procs_per_node + local, world, procs_per_node]
            for node in range(nodes) for local in range(procs_per_node)]
    return Table(["node (--node-rank)", "LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"], rows,
                 f"torchrun --nnodes {nodes} --nproc-per-node {procs_per_node}")


def alpha_beta(op: str, n: int, nbytes: float, alpha_s: float, bandwidth_Bps: float) -> float:
    """The ring α-β model in seconds: steps(op, n) x α + factor(op, n) x S / B (sim.collectives.ring_cost)."""
    from sim.collectives import ring_cost
    steps, factor = ring_cost(op, n)
    return steps * alpha_s + factor * nbytes / bandwidth_Bps


def simulate_sweep(op: str, sizes, cluster, algorithm: str = "auto") -> list[dict]:
    """One simulated collective per size on ``cluster`` (a Cluster or a preset name / YAML path):
    rows with bytes, algorithm, time_s, algbw_GBps, busbw_GBps (nccl-tests definitions)."""
    from sim.cluster import load_cluster
    from sim.collectives import metrics
    from sim.engine import simulate_collective
    if isinstance(cluster, str):
        cluster = load_cluster(cluster)
    n = cluster.world_size
    rows = []
    for s in sizes:
        trace, used = simulate_collective(op, int(s), cluster, algorithm)
        rows.append({"op": op, "bytes": int(s), "algorithm": used, "world_size": n, "nodes": cluster.nodes,
                     "cluster": cluster.name, **metrics(op, n, s, trace.makespan)})
    return rows


def rows_table(rows: list[dict], title: str = "", extra: tuple[str, ...] = ()) -> Table:
    """Sweep rows (simulated or measured) as a table: size, time, algbw, busbw (+ ``extra`` keys)."""
    cols = ["op", "size", "time (ms)", "algbw (GB/s)", "busbw (GB/s)", *extra]
    out = [[r["op"], format_bytes(r["bytes"]), f"{r['time_s'] * 1e3:.4g}", f"{r['algbw_GBps']:.4g}",
            f"{r['busbw_GBps']:.4g}", *[r.get(k, "") for k in extra]] for r in rows]
    return Table(cols, out, title)


def plot_rows(series: dict[str, list[dict]], y: str = "busbw_GBps", ylabel: str = "busbw (GB/s)",
              title: str = "", logy: bool = False, dashed: tuple[str, ...] = ()) -> Figure:
    """One line per label of rows (x = message size, log2 axis); labels in ``dashed`` are drawn dashed."""
    f = Figure()
    for label, rows in series.items():
        xs = [r["bytes"] for r in rows]
        ys = [r[y] * (1e3 if y == "time_s" else 1) for r in rows]
        f.ax.plot(xs, ys, marker="x" if label in dashed else "o", linestyle="--" if label in dashed else "-",
                  label=label)
    f.ax.set_xscale("log", base=2)
    if logy:
        _log_y(f.ax)
    ticks = sorted({r["bytes"] for rows in series.values() for r in rows})
    step = max(1, len(ticks) // 8)
    f.ax.set_xticks(ticks[::step])
    f.ax.set_xticklabels([format_bytes(t).replace(" ", "") for t in ticks[::step]], rotation=30)
    f.ax.set_xlabel("message size")
    f.ax.set_ylabel("time (ms)" if y == "time_s" else ylabel)
    if title:
        f.ax.set_title(title, loc="left", fontsize=10)
    f.ax.grid(alpha=0.3, which="both")
    f.ax.legend(fontsize=8)
    return f


def plot_xy(xs, series: dict[str, list[float]], xlabel: str, ylabel: str, title: str = "", logx: bool = False,
            logy: bool = False) -> Figure:
    """Lines of ``series`` (label -> ys) against ``xs`` (e.g. busbw against the number of nodes)."""
    f = Figure()
    for label, ys in series.items():
        f.ax.plot(xs, ys, marker="o", label=label)
    if logx:
        f.ax.set_xscale("log", base=2)
    if logy:
        _log_y(f.ax)
    f.ax.set_xticks(list(xs))
    f.ax.set_xticklabels([f"{x:g}" for x in xs])
    f.ax.set_xlabel(xlabel)
    f.ax.set_ylabel(ylabel)
    if title:
        f.ax.set_title(title, loc="left", fontsize=10)
    f.ax.grid(alpha=0.3)
    f.ax.legend(fontsize=8)
    return f


def presets_table() -> Table:
    """The cluster presets side by side: what is inside a node and what is between nodes."""
    from sim.cluster import PRESETS
    rows = []
    for name, c in PRESETS.items():
        i, e = c.intra_node, c.inter_node
        rows.append([name, f"{c.gpus_per_node} x {c.gpu.name}", i.kind, f"{i.bandwidth_GBps:g}", f"{i.efficiency:g}",
                     "yes" if i.nvls else "no", e.kind if e else "-", f"{e.nics_per_node} x {e.bandwidth_GBps:g}"
                     if e else "-", f"{e.fabric}" + (f" {e.oversubscription:g}:1" if e and e.oversubscription > 1
                                                     else "") if e else "-"])
    return Table(["preset", "GPUs per node", "inside a node", "GB/s per GPU", "efficiency", "NVLS", "between nodes",
                  "NICs x GB/s", "fabric"], rows, "bandwidths per direction; GB/s = 1e9 bytes/s")


def plot_bars(labels: list[str], values: list[float], ylabel: str, title: str = "", logy: bool = False) -> Figure:
    f = Figure(7, 3.8)
    f.ax.bar(labels, values, color="#3182bd")
    for i, v in enumerate(values):
        f.ax.text(i, v, f"{v:.3g}", ha="center", va="bottom", fontsize=8)
    if logy:
        f.ax.set_yscale("log")
    f.ax.set_ylabel(ylabel)
    if title:
        f.ax.set_title(title, loc="left", fontsize=10)
    f.ax.tick_params(axis="x", labelrotation=20)
    f.ax.grid(axis="y", alpha=0.3)
    return f


def error_table(cases: list[dict]) -> Table:
    """runtime.validation cases: what, ranks, size, predicted, measured, error."""
    return Table(["case", "kind", "ranks", "size", "predicted (ms)", "measured (ms)", "error"],
                 [[c["case"], c["kind"], c["world_size"], format_bytes(c["bytes"]), f"{c['predicted_s'] * 1e3:.3f}",
                   f"{c['measured_s'] * 1e3:.3f}", f"{c['error'] * 100:+.1f}%"] for c in cases],
                 "simulated (calibrated) against measured; error = (predicted - measured) / measured")


def plot_predicted_vs_measured(cases: list[dict], band: float = 0.2) -> Figure:
    """Predicted against measured, log-log, with y = x and a +-``band`` region."""
    f = Figure(5.5, 4.8)
    markers = {"held-out size": "o", "held-out world size": "s", "overlap plan": "*", "calibration size": "^"}
    for kind in dict.fromkeys(c["kind"] for c in cases):
        cs = [c for c in cases if c["kind"] == kind]
        f.ax.scatter([c["measured_s"] * 1e3 for c in cs], [c["predicted_s"] * 1e3 for c in cs],
                     marker=markers.get(kind, "x"), s=50, label=kind)
    values = [v * 1e3 for c in cases for v in (c["measured_s"], c["predicted_s"])]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    f.ax.plot([lo, hi], [lo, hi], color="black", lw=1)
    f.ax.fill_between([lo, hi], [lo * (1 - band), hi * (1 - band)], [lo * (1 + band), hi * (1 + band)],
                      color="grey", alpha=0.2, label=f"±{band:.0%}")
    f.ax.set_xscale("log")
    f.ax.set_yscale("log")
    f.ax.set_xlabel("measured (ms)")
    f.ax.set_ylabel("predicted (ms)")
    f.ax.grid(alpha=0.3, which="both")
    f.ax.legend(fontsize=8)
    return f


def demo_table(per_rank: list[dict], title: str = "") -> Table:
    """Every rank's tensor before and after a collective (runtime.lessons.collectives_demo)."""
    keys = [k for k in ("before", "after", "note") if any(k in r for r in per_rank)]
    return Table(["rank", *keys], [[r["rank"], *[_short(r.get(k, "")) for k in keys]] for r in per_rank], title)


def plot_collective(per_rank: list[dict], op: str) -> Figure:
    """Every rank's tensor before and after ``op`` as two annotated grids (rank = row, element = column)."""
    f = Figure(8, 0.5 * len(per_rank) + 1.6, ncols=2)
    for ax, key in zip(f.axes, ("before", "after")):
        rows = [r[key] if isinstance(r[key], list) else [] for r in per_rank]
        width = max((len(r) for r in rows), default=1) or 1
        grid = [[float("nan")] * width for _ in rows]
        for i, r in enumerate(rows):
            for j, v in enumerate(r):
                grid[i][j] = v
                ax.text(j, i, f"{v:g}", ha="center", va="center", fontsize=8)
        ax.imshow(grid, cmap="Oranges", aspect="auto", alpha=0.7)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([f"rank {r['rank']}" for r in per_rank])
        ax.set_xticks(range(width))
        ax.set_xlabel("element")
        ax.set_title(f"{op}: {key}", loc="left", fontsize=10)
    return f


def _short(v) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v) + "]"
    return str(v)


# --- timelines, DDP and FSDP (lessons 05 and 06) ---------------------------------------------------------------
# The models the real runs of lessons 05 and 06 use (small enough for 2 gloo ranks on a 2-core machine).
CPU_DDP_MODEL = {"kind": "mlp", "widths": [512] * 13, "batch": 32}           # 12 x Linear(512, 512), 12 MiB
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
    """sim.plots.timeline of ``trace`` (default: the first two ranks), compute and comm streams per rank."""
    from sim.plots import timeline
    ranks = ranks if ranks is not None else sorted({o.rank for o in trace.ops})[:2]
    return from_pyplot(timeline(trace, ranks=ranks, title=title, **kw))


def scenario(model="gpt2-medium", parallelism: str = "ddp", cluster: str = "dgx-h100", nodes: int | None = None,
             micro_batch: int | None = None, **options) -> dict:
    """A scenario dict (sim/scenario.py) from keywords: ``model`` a preset name or a model spec mapping;
    ``options`` go to ``parallelism`` (bucket_cap_mb=..., zero=..., reshard_after_forward=...)."""
    from sim import scenario as sc
    spec = {"preset": model} if isinstance(model, str) else dict(model)
    if micro_batch is not None:
        spec["micro_batch" if spec.get("kind") != "mlp" else "batch"] = micro_batch
    d = {"model": spec, "parallelism": {"kind": parallelism, **options}, "cluster": cluster}
    if nodes is not None:
        d["nodes"] = nodes
    return sc.validate(d)


def simulate(d: dict) -> dict:
    """Simulate one step of scenario ``d``: {"trace", "info", "model", "cluster", "plan", "summary"
    (step, compute, comm, exposed comm, overlap %), "buckets" (DDP: per bucket rows with launch times)}."""
    from sim import scenario as sc
    from sim.ddp.plan import bucket_rows, summarize
    trace, info, model, cluster, plan = sc.simulate(d)
    out = {"trace": trace, "info": info, "model": model, "cluster": cluster, "plan": plan,
           "summary": summarize(trace)}
    if "buckets" in info:
        rows, prev = bucket_rows(trace, info), float("-inf")
        for r in rows:                              # Reducer::mark_bucket_ready: launch k = max(ready k, launch k-1)
            prev = r["ddp_launch_s"] = max(r["ready_s"], prev)
        out["buckets"] = rows
    if "report" in info:
        out["report"] = info["report"](trace)
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


def sweep(d: dict, key: str, values) -> list[dict]:
    """Simulate scenario ``d`` once per value of ``key`` (as `distlab simulate --sweep KEY=...`): rows with
    the value, world_size, buckets, step_s, compute_s, comm_s, exposed_comm_s, overlap_pct."""
    import copy

    from sim.commands.simulate import set_value
    rows = []
    for v in values:
        e = copy.deepcopy(d)
        set_value(e, key, v)
        r = simulate(e)
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
    """Per-GPU bytes of params, grads and optimizer state (Adam) at ZeRO stage ``zero`` (0 = DDP), and total."""
    from sim.fsdp.memory import static_bytes
    from sim.models import model_from_spec
    out = static_bytes(model_from_spec(model), world, zero, shard_size)
    return {**out, "total": sum(out.values())}


def zero_table(model, world: int) -> Table:
    """What each ZeRO stage keeps per GPU (GiB) on ``world`` ranks: DDP, ZeRO-1 (optimizer sharded),
    ZeRO-2 (+ gradients), ZeRO-3 / FSDP (+ parameters)."""
    from sim.models import model_from_spec
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
    from sim.collectives import ring_cost
    from sim.plan import Collective
    total = 0.0
    for o in plan.ranks[rank]:
        if isinstance(o, Collective):
            n = len(plan.group_of(o))
            if n > 1:
                total += ring_cost(o.op, n)[1] * o.bytes
    return total


def comm_per_step(model, world: int, zero: int) -> float:
    """Bytes one GPU sends per step under DDP (zero=0) or ZeRO stage 1/2/3 (ring collectives)."""
    from sim.ddp.plan import ddp_plan
    from sim.fsdp.plan import build_fsdp
    from sim.models import model_from_spec
    m = model_from_spec(model)
    plan = ddp_plan(m, world)[0] if zero == 0 else build_fsdp(m, world, {"zero": zero})
    return bytes_sent(plan)


def world_sweep(model, worlds, stages=(0, 1, 2, 3)) -> dict:
    """Per GPU static memory (GiB) and bytes sent per step (GiB) for each stage across ``worlds``:
    {"memory": {label: [...]}, "comm": {label: [...]}}."""
    names = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
    return {"memory": {names[z]: [zero_bytes(model, n, z)["total"] / 2**30 for n in worlds] for z in stages},
            "comm": {names[z]: [comm_per_step(model, n, z) / 2**30 for n in worlds] for z in stages}}


def collectives_table(plan, rank: int = 0, title: str = "") -> Table:
    """The collectives of ``plan`` on ``rank`` in issue order: name, op, size, dtype, stream."""
    from sim.plan import Collective
    rows = [[i, o.name or o.op, o.op, format_bytes(o.bytes), o.dtype, o.stream]
            for i, o in enumerate([o for o in plan.ranks[rank] if isinstance(o, Collective)])]
    return Table(["#", "name", "op", "size", "dtype", "stream"], rows, title)


def plot_fsdp(result: dict, title: str | None = None) -> Figure:
    """The timeline of a simulated fsdp scenario (``simulate(...)``) with rank 0's memory beneath it."""
    return from_pyplot(result["info"]["figure"](result["trace"], title=title))


def predicted_measured_table(rows: list[dict], key: str, title: str = "", extra: tuple[str, ...] = ()) -> Table:
    """Rows with ``key``, predicted_s and measured_s (and error_pct): one line each, times in ms."""
    return Table([key, *extra, "predicted (ms)", "measured (ms)", "error"],
                 [[r[key], *[r[k] for k in extra], f"{r['predicted_s'] * 1e3:.2f}", f"{r['measured_s'] * 1e3:.2f}",
                   f"{(r['predicted_s'] - r['measured_s']) / r['measured_s'] * 100:+.1f}%"] for r in rows], title)


# --- pipeline parallelism (lesson 07) --------------------------------------------------------------------------
PIPELINE_SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zbh1", 1), ("zbv", 2))
# Uniform stages, free point-to-point: a forward takes 1 ms, a backward 2 ms (split: I = W = 1 ms).
UNIFORM_MS = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}


def pipeline_trace(schedule: str, p: int, m: int, v: int = 1, ms: dict | None = None):
    """The ideal timeline of ``schedule`` (sim.pipeline.metrics.ideal_trace): every action as soon as its
    input is there, free p2p, each stage (of p·v) taking ``ms[kind]`` milliseconds (default UNIFORM_MS, the
    whole model's F divided evenly: a stage of an interleaved or zbv rank costs 1/v of it)."""
    from sim.pipeline import metrics as M
    from sim.pipeline import schedules as S
    ms = {**UNIFORM_MS, **(ms or {})}
    acts = S.build(schedule, p, m, v)
    trace = M.ideal_trace(acts, lambda a: ms[a.kind] * 1e-3 / v)
    trace.meta["pipeline"] = {"schedule": S.normalise(schedule), "stages": p, "microbatches": m,
                              "virtual_stages": v, "activation_bytes": [1.0] * (p * v)}
    return trace


def pipeline_metrics(schedule: str, p: int, m: int, v: int = 1, ms: dict | None = None,
                     activation_bytes: float = 1.0):
    """sim.pipeline.metrics.compute of :func:`pipeline_trace`. A rank's layers stash ``activation_bytes`` per
    microbatch (so each of its v stages 1/v of it): peak_stage_memory, peak_rank_memory in those bytes."""
    from sim.pipeline import metrics as M
    trace = pipeline_trace(schedule, p, m, v, ms)
    return M.compute(trace, {"activation_bytes": [activation_bytes / v] * (p * v)})


def plot_pipeline(trace, title: str | None = None, p: int | None = None) -> Figure:
    """The classic pipeline diagram (sim.pipeline.diagram.draw): a row per rank, F/B/I/W boxes with their
    microbatch numbers; ``title`` defaults to the schedule, p, m, makespan and bubble."""
    from sim.pipeline import diagram
    from sim.pipeline import metrics as M
    meta = trace.meta.get("pipeline", {})
    p = p or meta.get("stages")
    ranks = sorted({o.rank for o in trace.ops})
    n = len(M.actions_of(trace))
    f = Figure(max(8.0, min(16.0, 0.3 * n / max(1, len(ranks)))), 0.55 * len(ranks) + 1.9)
    if title is None and meta:
        title = diagram.title_for(meta, M.compute(trace, meta))
    diagram.draw(trace, title=title, p=p, ax=f.ax)
    return f


def pipeline_table(configs, ms: dict | None = None, title: str = "") -> Table:
    """One row per (schedule, p, m, v): makespan, simulated bubble, the closed form where there is one, peak
    in-flight microbatches per stage, and each rank's peak activations in microbatches of a whole rank's layers."""
    from sim.pipeline import metrics as M
    from sim.pipeline import schedules as S
    rows = []
    for schedule, p, m, v in configs:
        met = pipeline_metrics(schedule, p, m, v, ms)
        ideal = M.ideal_bubble(S.normalise(schedule), p, m, v)
        rows.append([schedule, p, m, v, f"{met.makespan * 1e3:.4g}", f"{met.bubble:.1%}",
                     "-" if ideal is None else f"{ideal:.1%}", " ".join(str(k) for k in met.peak_in_flight.values()),
                     " ".join(f"{x:g}" for x in met.peak_rank_memory)])
    return Table(["schedule", "p", "m", "v", "makespan (ms)", "bubble", "formula", "peak in flight per stage",
                  "peak activations per rank"], rows,
                 title or "uniform stages: a rank's layers take F = 1 ms, B = 2 ms (I = W = 1 ms) per microbatch; "
                 "free p2p; activations in microbatches of a rank's layers")


def bubble_sweep(p: int, ms_list, schedules=PIPELINE_SCHEDULES) -> dict:
    """Simulated bubble fraction (%) against the number of microbatches for each (schedule, v), and the
    closed forms: {"simulated": {label: [...]}, "formula": {formula text: [...]}} (uniform stages, free p2p)."""
    from sim.pipeline import metrics as M
    sim_, formula = {}, {}
    for schedule, v in schedules:
        label = schedule + (f" v={v}" if v > 1 else "")
        sim_[label] = [100 * pipeline_metrics(schedule, p, m, v).bubble for m in ms_list]
        ideal = [M.ideal_bubble(schedule, p, m, v) for m in ms_list]
        if None not in ideal:
            formula["(p-1)/(m+p-1)" if v == 1 else f"(p-1)/({v}m+p-1)"] = [100 * b for b in ideal]
    return {"simulated": sim_, "formula": formula}


def plot_bubble_sweep(p: int, ms_list, schedules=PIPELINE_SCHEDULES, title: str | None = None) -> Figure:
    """Bubble (%) against microbatches m: the simulated schedules as markers, the closed forms
    (p-1)/(m+p-1) and (p-1)/(v·m+p-1) as dashed lines."""
    data = bubble_sweep(p, ms_list, schedules)
    f = Figure(7.5, 4.2)
    for i, ((label, ys), marker) in enumerate(zip(data["simulated"].items(), "os^Dv<>")):
        f.ax.plot(ms_list, ys, marker=marker, linestyle=":", markersize=12 if i == 0 else 7,
                  markerfacecolor="none" if i == 0 else None, label=f"{label} (simulated)")
    for (label, ys), colour in zip(data["formula"].items(), ("black", "grey", "silver")):
        f.ax.plot(ms_list, ys, linestyle="--", color=colour, lw=1, label=label)
    f.ax.set_xscale("log", base=2)
    f.ax.set_xticks(list(ms_list))
    f.ax.set_xticklabels([str(m) for m in ms_list])
    f.ax.set_xlabel("microbatches m")
    f.ax.set_ylabel("bubble (% of p x makespan idle)")
    f.ax.set_title(title or f"p = {p} stages, uniform, B = 2F, free p2p", loc="left", fontsize=10)
    f.ax.grid(alpha=0.3)
    f.ax.legend(fontsize=8)
    return f


def pipeline_sweep_table(rows: list[dict], key: str, title: str = "") -> Table:
    """Rows of sim.pipeline.scenario.sweep_results: makespan, bubble, samples/s, peak activations, p2p."""
    return Table([key, "ranks", "makespan (ms)", "bubble", "samples/s", "peak activations (GiB)", "p2p (ms)"],
                 [[r[key], r["world_size"], f"{r['makespan_s'] * 1e3:.3f}", f"{r['bubble']:.1%}",
                   f"{r['samples_per_s']:.4g}", f"{r['peak_activation_bytes'] / 2**30:.2f}", f"{r['p2p_s'] * 1e3:.3f}"]
                  for r in rows], title)


def pipeline_measured_table(rows: list[dict], title: str = "") -> Table:
    """Rows of runtime.lessons.pipeline_predict_measure: predicted, replayed and measured step, error, and the
    bubble three ways (formula, predicted, measured)."""
    pct = lambda b: "-" if b is None else f"{b:.1%}"  # noqa: E731
    return Table(["schedule", "v", "predicted (ms)", "replay (ms)", "measured (ms)", "error", "bubble formula",
                  "bubble predicted", "bubble measured"],
                 [[r["schedule"], r["v"], f"{r['predicted_s'] * 1e3:.2f}", f"{r['replay_s'] * 1e3:.2f}",
                   f"{r['measured_s'] * 1e3:.2f}", f"{r['error_pct']:+.1f}%", pct(r["ideal_bubble"]),
                   pct(r["predicted_bubble"]), pct(r["measured_bubble"])] for r in rows], title)
