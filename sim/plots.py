"""Figures from traces: a per-rank, per-stream timeline (Trace -> matplotlib Figure) and simple sweeps.

Generic: any plan's trace works. Compute ops are blue (forward lighter, backward darker, others grey-blue),
collectives orange-red, point-to-point green; a collective's wait for its peers is hatched. Ops wide enough
get their name written on them. Save with ``sim.io.save_figure(fig, path)``.
"""
from __future__ import annotations

COLORS = {"fwd": "#9ecae1", "bwd": "#3182bd", "forward": "#9ecae1", "backward": "#3182bd", "compute": "#6b8fb3",
          "collective": "#e6550d", "send": "#31a354", "recv": "#74c476"}
PALETTE = ["#e6550d", "#fd8d3c", "#d94801", "#fdae6b"]


def _figure(**kw):
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    return plt.subplots(**kw)


def _color(o) -> str:
    if o.kind == "compute":
        head = o.name.split(" ", 1)[0].lower()
        return COLORS.get(head, COLORS["compute"])
    if o.kind == "collective":
        return PALETTE[o.index % len(PALETTE)]
    return COLORS.get(o.kind, "#999999")


LEGEND = {"forward": COLORS["fwd"], "backward": COLORS["bwd"], "compute": COLORS["compute"],
          "collective": COLORS["collective"], "send": COLORS["send"], "recv": COLORS["recv"]}


def _legend_key(o) -> str:
    if o.kind == "compute":
        head = o.name.split(" ", 1)[0].lower()
        return {"fwd": "forward", "bwd": "backward"}.get(head, head if head in LEGEND else "compute")
    return o.kind if o.kind in LEGEND else "compute"


def timeline(trace, ranks: list[int] | None = None, streams: list[str] | None = None, title: str | None = None,
             max_ranks: int = 4, unit: str = "ms", label_min_frac: float = 0.04, highlight=None):
    """One row per (rank, stream), time on x, streams in ``Trace.stream_order()`` (compute above comm, as the
    Chrome trace). ``ranks`` default: the first ``max_ranks``. ``highlight``: an optional function
    OpRecord -> label, to label only some ops (default: collectives and wide ops). One ``broken_barh`` per
    row (a PolyCollection), not one call per op, so a large trace draws quickly."""
    from matplotlib.patches import Patch
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    ops = [o for o in trace.ops if o.kind not in ("record", "wait")]
    all_ranks = sorted({o.rank for o in ops})
    ranks = ranks if ranks is not None else all_ranks[:max_ranks]
    names = streams or trace.stream_order()
    by_row: dict = {}
    for o in ops:
        by_row.setdefault((o.rank, o.stream), []).append(o)
    rows = [(r, s) for r in ranks for s in names if (r, s) in by_row]
    t0 = min((o.start for o in ops), default=0.0)
    span = max(trace.makespan, 1e-12) * scale
    fig, ax = _figure(figsize=(12, 0.6 * len(rows) + 1.8))
    shown, waited, labels = set(), False, []
    for y, key in enumerate(rows):
        bars, colors, waits = [], [], []
        for o in by_row[key]:
            begin = o.start if o.launch is None else o.launch
            x0, x1, xb = (o.start - t0) * scale, (o.end - t0) * scale, (begin - t0) * scale
            if xb > x0:
                waits.append((x0, xb - x0))
            bars.append((xb, max(x1 - xb, span * 1e-4)))
            colors.append(_color(o))
            shown.add(_legend_key(o))
            text = highlight(o) if highlight else (o.name if o.kind == "collective" or
                                                   (x1 - xb) > label_min_frac * span else None)
            if text and (x1 - xb) > 0.025 * span:
                labels.append((x1 - xb, y, (xb + x1) / 2, text.replace("bucket ", "b"), "center"))
            elif text and o.kind == "collective":     # narrow: label above the bar
                labels.append((x1 - xb, y, (xb + x1) / 2, text.replace("bucket ", "b"), "above"))
        if waits:
            waited = True
            ax.broken_barh(waits, (y - 0.35, 0.7), facecolors="none", edgecolors="#bbbbbb", hatch="///",
                           linewidth=0.3)
        ax.broken_barh(bars, (y - 0.35, 0.7), facecolors=colors, edgecolors="white", linewidth=0.3)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {r} {s}" for r, s in rows])
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(0, span * 1.01)
    if title:
        ax.set_title(title, loc="left", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(facecolor=c, label=k) for k, c in LEGEND.items() if k in shown]
    if waited:
        handles.append(Patch(facecolor="none", edgecolor="#999999", hatch="///", label="waiting for peers"))
    if handles:
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.08 - 0.35 / max(len(rows), 1)),
                  ncol=len(handles), fontsize=8, frameon=False)
    fig.tight_layout()
    if labels:                 # widest ops first; a label that would overlap another or leave the axes goes
        from distlab.sim.figure_text import keep_fitting
        texts = [ax.text(x, y if where == "center" else y - 0.38, text, ha="center", clip_on=True,
                         va="center" if where == "center" else "bottom", fontsize=7 if where == "center" else 6)
                 for _, y, x, text, where in _spaced_labels(labels, span, fig.get_size_inches()[0])]
        keep_fitting(fig, texts, within=ax)
    return fig


def _spaced_labels(labels: list[tuple], span: float, width_in: float) -> list[tuple]:
    """The candidate labels (op width, row, x centre, text, 'center' or 'above'), widest op first, without those
    whose estimated box (0.6 x font size per character, on an axes ~85% of the figure's width, 1.3x margin)
    would overlap a wider op's label in the same row: so a trace of thousands of ops creates a few hundred Text
    artists, and figure_text.keep_fitting checks those exactly."""
    kept, taken = [], {}
    for label in sorted(labels, key=lambda x: -x[0]):
        _, y, x, text, where = label
        points = 0.6 * (7 if where == "center" else 6) * len(text) * 1.3
        half = points / (0.85 * width_in * 72) * span / 2
        row = taken.setdefault((y, where), [])
        if any(x - half < b and a < x + half for a, b in row):
            continue
        row.append((x - half, x + half))
        kept.append(label)
    return kept


def sweep(xs, series: dict[str, list[float]], xlabel: str, ylabel: str, title: str | None = None,
          logx: bool = False, marks: dict[str, list[float]] | None = None):
    """Lines of ``series`` (label -> ys) against ``xs``; ``marks`` adds unconnected points (e.g. measured)."""
    fig, ax = _figure(figsize=(7, 4.2))
    for label, ys in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    for label, ys in (marks or {}).items():
        ax.plot(xs, ys, marker="x", linestyle="none", markersize=9, label=label)
    if logx:
        ax.set_xscale("log")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([f"{x:g}" for x in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, loc="left", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def transfers_timeline(trace, max_ranks: int = 16, title: str | None = None, unit: str = "us"):
    """One row per sending rank, one bar per point-to-point transfer (a step of a collective), coloured by
    destination. Shows a ring's 2(n-1) steps, a tree's pipeline, or flows stretched by contention. Concurrent
    transfers from one rank (NCCL's channels, a tree's two children) get separate lanes, as the channels of
    the Chrome trace (sim/chrome.py). Fast for thousands of transfers: every bar goes into one
    PolyCollection, the figure is built without pyplot and laid out by hand (one draw when saved). As a PNG
    (`collective --timeline x.png`), sim/timeline_png.py draws the same figure with Pillow, without
    matplotlib's import; rows and lanes come from sim/chrome.py ``transfer_lanes`` for both."""
    import matplotlib.cm as cm
    import numpy as np
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from distlab.sim.chrome import transfer_lanes
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    srcs, placed, lanes = transfer_lanes(trace.transfers, max_ranks)
    row = {src: y for y, src in enumerate(srcs)}
    height = 0.35 * len(srcs) + 2.0
    fig = Figure(figsize=(12, height))
    ax = fig.add_axes((0.08, 0.9 / height, 0.80, 1 - 1.5 / height))
    if placed:
        x0 = np.array([t.start for t, _ in placed]) * scale
        x1 = np.array([t.end for t, _ in placed]) * scale
        h = np.array([0.8 / lanes[t.src] for t, _ in placed])
        y0 = np.array([row[t.src] - 0.4 for t, _ in placed]) + np.array([lane for _, lane in placed]) * h
        boxes = np.stack([np.stack([x0, y0], 1), np.stack([x0, y0 + h], 1), np.stack([x1, y0 + h], 1),
                          np.stack([x1, y0], 1)], 1)
        ax.add_collection(PolyCollection(boxes, facecolors=cm.tab20([t.dst % 20 / 20 for t, _ in placed]),
                                         edgecolors="white", linewidths=0.5))
        ax.set_xlim(0, x1.max() * 1.01)
    ax.set_ylim(len(srcs) - 0.5, -0.5)
    ax.set_yticks(range(len(srcs)))
    ax.set_yticklabels(["switch" if s < 0 else f"rank {s}" for s in srcs])
    ax.set_xlabel(f"time ({unit})")
    if title:
        ax.set_title(title, loc="left", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    dsts = sorted({t.dst for t in trace.transfers})
    handles = [Patch(facecolor=cm.tab20(d % 20 / 20), label=("switch" if d < 0 else str(d))) for d in dsts[:20]]
    ax.legend(handles=handles, title="to rank" + (" (first 20)" if len(dsts) > 20 else ""), fontsize=7,
              title_fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False,
              ncol=1 if len(handles) <= 12 else 2)
    from distlab.sim.timeline_png import NOTE
    fig.text(0.08, 0.12 / height, NOTE, fontsize=7, va="bottom")       # what a bar is, under the time axis
    fig.distlab_fast = True            # laid out above: sim.io.save_figure saves it in one draw
    return fig


def size_label(nbytes: float) -> str:
    """Tick labels of a size axis: 8 B, 64 KiB, 256 MiB, 1 GiB (powers of 2)."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}"
    return f"{nbytes:g} B"


MARKERS = {"ring": "o", "tree": "^", "hierarchical": "s", "nvls": "D", "direct": "v"}


def busbw_figure(rows: list[dict], title: str, auto: bool = False):
    """busbw (GB/s) against message size, nccl-tests style: one line per op, size ticks in KiB/MiB/GiB, y from
    0. Rows with ``time_min_s``/``time_max_s`` (repeats) get error bars from the fastest to the slowest repeat
    (busbw = factor x bytes / time, so the fastest time is the top of the bar). ``auto``: each point's
    marker is the algorithm that ``--algo auto`` chose, named in the legend."""
    from matplotlib.lines import Line2D
    fig, ax = _figure(figsize=(7.5, 4.4))
    ops = list(dict.fromkeys(r["op"] for r in rows if r["op"] != "barrier"))
    for i, op in enumerate(ops):
        rs = [r for r in rows if r["op"] == op]
        xs, ys = [r["bytes"] for r in rs], [r["busbw_GBps"] for r in rs]
        color = f"C{i}"
        ax.plot(xs, ys, color=color, label=op if len(ops) > 1 or not auto else None, zorder=2)
        if all("time_min_s" in r and "time_max_s" in r for r in rs):
            factor = [r["busbw_GBps"] * r["time_s"] for r in rs]          # busbw x time: constant per case
            lo = [y - f / r["time_max_s"] for y, f, r in zip(ys, factor, rs)]
            hi = [f / r["time_min_s"] - y for y, f, r in zip(ys, factor, rs)]
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt="none", ecolor=color, capsize=3, linewidth=1, zorder=3)
        for algo in dict.fromkeys(r.get("algorithm", "") for r in rs):
            pts = [(x, y) for x, y, r in zip(xs, ys, rs) if r.get("algorithm", "") == algo]
            ax.plot(*zip(*pts), linestyle="none", marker=MARKERS.get(algo, "o") if auto else "o", color=color,
                    markersize=6, zorder=4)
    ax.set_xscale("log", base=2)
    sizes = sorted({r["bytes"] for r in rows if r["bytes"] > 0})
    step = max(1, -(-len(sizes) // 8))            # at most 8 size labels: rotated, they still fit side by side
    ticks = sizes[::step]
    ax.set_xticks(ticks)
    ax.set_xticklabels([size_label(s) for s in ticks], rotation=30 if len(ticks) > 6 else 0, fontsize=8)
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.set_xlabel("message size")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title, loc="left", fontsize=10)
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if auto:
        for algo in dict.fromkeys(r.get("algorithm", "") for r in rows):
            handles.append(Line2D([], [], linestyle="none", marker=MARKERS.get(algo, "o"), color="#555555"))
            labels.append(f"{algo} (chosen by auto)")
    if any("time_min_s" in r for r in rows):
        handles.append(Line2D([], [], color="#555555", marker="|", linestyle="none", markersize=10))
        labels.append("fastest to slowest repeat")
    if handles:
        ax.legend(handles, labels, fontsize=8)
    fig.tight_layout()
    return fig
