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


def timeline(trace, ranks: list[int] | None = None, streams: list[str] | None = None, title: str | None = None,
             max_ranks: int = 4, unit: str = "ms", label_min_frac: float = 0.04, highlight=None):
    """One row per (rank, stream), time on x. ``ranks`` default: the first ``max_ranks``. ``highlight``: an
    optional function OpRecord -> label, to label only some ops (default: collectives and wide ops)."""
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    ops = [o for o in trace.ops if o.kind not in ("record", "wait")]
    all_ranks = sorted({o.rank for o in ops})
    ranks = ranks if ranks is not None else all_ranks[:max_ranks]
    names = streams or list(dict.fromkeys(o.stream for o in sorted(ops, key=lambda o: o.stream != "compute")))
    rows = [(r, s) for r in ranks for s in names if any(o.rank == r and o.stream == s for o in ops)]
    t0 = min((o.start for o in ops), default=0.0)
    span = max(trace.makespan, 1e-12) * scale
    fig, ax = _figure(figsize=(12, 0.6 * len(rows) + 1.4))
    for y, (r, s) in enumerate(rows):
        for o in ops:
            if o.rank != r or o.stream != s:
                continue
            begin = o.start if o.launch is None else o.launch
            x0, x1, xb = (o.start - t0) * scale, (o.end - t0) * scale, (begin - t0) * scale
            if xb > x0:
                ax.broken_barh([(x0, xb - x0)], (y - 0.35, 0.7), facecolors="none", edgecolors="#bbbbbb",
                               hatch="///", linewidth=0.3)
            ax.broken_barh([(xb, max(x1 - xb, span * 1e-4))], (y - 0.35, 0.7), facecolors=_color(o),
                           edgecolors="white", linewidth=0.3)
            text = highlight(o) if highlight else (o.name if o.kind == "collective" or
                                                   (x1 - xb) > label_min_frac * span else None)
            if text and (x1 - xb) > 0.025 * span:
                ax.text((xb + x1) / 2, y, text.replace("bucket ", "b"), ha="center", va="center", fontsize=7,
                        clip_on=True)
            elif text and o.kind == "collective":     # narrow: label above the bar
                ax.text((xb + x1) / 2, y - 0.38, text.replace("bucket ", "b"), ha="center", va="bottom",
                        fontsize=6, clip_on=True)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {r} {s}" for r, s in rows])
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(0, span * 1.01)
    if title:
        ax.set_title(title, loc="left", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


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
    destination. Shows a ring's 2(n-1) steps, a tree's pipeline, or flows stretched by contention."""
    import matplotlib.cm as cm
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    srcs = sorted({t.src for t in trace.transfers})[:max_ranks]
    fig, ax = _figure(figsize=(12, 0.35 * len(srcs) + 1.6))
    n = max([t.dst for t in trace.transfers] + [1]) + 1
    for y, src in enumerate(srcs):
        mine = sorted((t for t in trace.transfers if t.src == src), key=lambda t: (t.start, t.dst))
        lanes, lane_of = [], []                   # concurrent flows from one rank get separate lanes
        for t in mine:
            free = next((i for i, end in enumerate(lanes) if end <= t.start), None)
            if free is None:
                lanes.append(0.0)
                free = len(lanes) - 1
            lanes[free] = t.end
            lane_of.append(free)
        h = 0.8 / max(len(lanes), 1)
        for t, lane in zip(mine, lane_of):
            ax.broken_barh([(t.start * scale, (t.end - t.start) * scale)], (y - 0.4 + lane * h, h),
                           facecolors=cm.tab20(t.dst % 20 / 20 if n > 1 else 0), edgecolors="white",
                           linewidth=0.5)
    ax.set_yticks(range(len(srcs)))
    ax.set_yticklabels(["switch" if s < 0 else f"rank {s}" for s in srcs])
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit}); colour = destination rank")
    if title:
        ax.set_title(title, loc="left", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig
