"""The timeline of a multi-job simulation: one track per job (its rank 0), time on x.

    fig = jobs_timeline(outcome)          # save with sim.io.save_figure(fig, "cluster-timeline.png")

Each track shows when the job's rank 0 computes (blue) and when its collectives move data (orange, the lower half
of the track), the ends of its steps shared (black ticks) and where they would end alone (grey dashed ticks,
from the job's start): the gap between the two is what its neighbours cost it. The label gives the slowdown.
"""
from __future__ import annotations

from distlab.sim.kernel.spans import union
from distlab.sim.plots import COLORS, _figure


def jobs_timeline(outcome, title: str | None = None, unit: str = "ms"):
    """A matplotlib figure of ``outcome`` (sim/jobs/together.Outcome), one track per job."""
    fig, ax = _figure(figsize=(12, 0.75 * len(outcome.runs) + 1.9))
    draw_jobs_timeline(ax, outcome, title, unit)
    fig.tight_layout()
    return fig


def draw_jobs_timeline(ax, outcome, title: str | None = None, unit: str = "ms") -> None:
    """The timeline on matplotlib axes ``ax`` (the lessons draw it into their own figure)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    runs = outcome.runs
    span = 0.0
    for y, run in enumerate(runs):
        ops, at = run.trace.for_rank(0), run.trace_offset_s
        compute = union([(at + o.start, at + o.end) for o in ops if o.kind == "compute"])
        comm = union([(at + (o.start if o.launch is None else o.launch), at + o.end) for o in ops
                      if o.kind in ("collective", "send", "recv")])
        ax.broken_barh([(a * scale, (b - a) * scale) for a, b in compute], (y - 0.38, 0.38),
                       facecolors=COLORS["compute"], linewidth=0)
        ax.broken_barh([(a * scale, (b - a) * scale) for a, b in comm], (y, 0.38),
                       facecolors=COLORS["collective"], linewidth=0)
        start, t_shared, t_alone = run.job.spec.start_s, run.job.spec.start_s, run.job.spec.start_s
        for shared, alone in zip(run.shared_s, run.alone_s):
            t_shared, t_alone = t_shared + shared, t_alone + alone
            ax.plot([t_alone * scale] * 2, [y - 0.45, y + 0.45], color="#999999", linestyle="--", linewidth=1)
            ax.plot([t_shared * scale] * 2, [y - 0.45, y + 0.45], color="black", linewidth=1.2)
        ax.plot([start * scale] * 2, [y - 0.45, y + 0.45], color="black", linewidth=0.6)
        span = max(span, t_shared, t_alone)
    ax.set_yticks(range(len(runs)))
    ax.set_yticklabels([f"{r.job.name} ({r.slowdown:.3f}x)" for r in runs])
    ax.invert_yaxis()
    ax.set_xlim(0, span * scale * 1.01)
    ax.set_xlabel(f"time ({unit})")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title or f"{outcome.spec.name}: one track per job (rank 0), slowdown shared / alone", loc="left",
                 fontsize=10)
    handles = [Patch(facecolor=COLORS["compute"], label="compute"),
               Patch(facecolor=COLORS["collective"], label="communication"),
               Line2D([], [], color="black", label="step ends (shared)"),
               Line2D([], [], color="#999999", linestyle="--", label="step ends alone")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.1 - 0.4 / max(len(runs), 1)), ncol=4,
              fontsize=8, frameon=False)
