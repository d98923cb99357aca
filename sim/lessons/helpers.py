"""Small helpers the lesson notebooks call: tables and figures that display in Jupyter, rank layouts, the α-β
model, simulated sweeps and the error table. No torch here (real runs are in runtime/lessons/).

Figures are built with matplotlib's object API (no pyplot, no backend switch) and wrapped in ``Figure``, which
Jupyter shows as a PNG; ``.save(path)`` writes it. Tables show as HTML in Jupyter and as text elsewhere.
"""
from __future__ import annotations

import html
import io
import os

from distlab.sim.plan import format_bytes


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

    def __repr__(self) -> str:
        """The titles, as text (what a screen reader or a text-only front end shows, and what the lesson tests
        search for answers shown too early)."""
        sup = self.fig._suptitle.get_text() if self.fig._suptitle is not None else ""
        titles = [t for t in [sup] + [ax.get_title() for ax in self.axes] if t]
        return "Figure: " + " | ".join(titles) if titles else "Figure"

    def save(self, path: str) -> str:
        from distlab.sim.io import write_atomic
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
    from distlab.sim.files import make_folder
    path = os.path.abspath(name)
    make_folder(path, "workdir")             # never through a link, in a folder only you write (sim/files.py)
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
    from distlab.sim.collectives import ring_cost
    steps, factor = ring_cost(op, n)
    return steps * alpha_s + factor * nbytes / bandwidth_Bps


def simulate_sweep(op: str, sizes, cluster, algorithm: str = "auto", protocol: str = "auto",
                   group=None) -> list[dict]:
    """One simulated collective per size on ``cluster`` (a Cluster or a preset name / YAML path), over the whole
    cluster or ``group`` (ranks), with NCCL ``protocol`` (auto, LL, LL128, Simple): rows with bytes, algorithm,
    protocol, time_s, algbw_GBps, busbw_GBps (nccl-tests definitions)."""
    from distlab.sim.cluster import load_cluster
    from distlab.sim.collectives import metrics
    from distlab.sim.kernel.engine import simulate_collective
    if isinstance(cluster, str):
        cluster = load_cluster(cluster)
    n = cluster.world_size if group is None else len(group)
    rows = []
    for s in sizes:
        trace, used = simulate_collective(op, int(s), cluster, algorithm, group=group, protocol=protocol)
        rows.append({"op": op, "bytes": int(s), "algorithm": used,
                     "protocol": ",".join(trace.meta.get("protocols", [])) or "-", "world_size": n,
                     "nodes": cluster.nodes, "cluster": cluster.name, **metrics(op, n, s, trace.makespan)})
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
    from distlab.sim.cluster import PRESETS
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
    """distlab.runtime.measure.validation cases: what, ranks, size, predicted, measured, error."""
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
