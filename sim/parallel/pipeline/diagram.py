"""The classic pipeline diagram: one row per rank, time across, a box per action coloured by kind
(F forward, B full backward, I input-gradient backward, W weight-gradient backward), the microbatch number
inside; a virtual stage's later chunks are drawn lighter, as in Megatron-LM's figure 4 (2104.04473)."""
from __future__ import annotations

from distlab.sim.parallel.pipeline.metrics import actions_of

COLOURS = {"F": "#4C72B0", "B": "#55A868", "I": "#8FD19E", "W": "#DD8452"}
LABELS = {"F": "F forward", "B": "B backward", "I": "I backward, input grad (paper's B)",
          "W": "W backward, weight grad"}


def _lighter(hex_colour: str, amount: float) -> tuple:
    r, g, b = (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return tuple(c + (1 - c) * amount for c in (r, g, b))


def draw(trace, path: str | None = None, title: str | None = None, ranks: list[int] | None = None,
         p: int | None = None, ax=None):
    """Draw ``trace``'s pipeline actions; save a PNG to ``path`` if given. Returns the matplotlib figure.
    ``p`` (pipeline ranks) sets how light later virtual stages are drawn (chunk = stage // p)."""
    import matplotlib
    if ax is None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    acts = actions_of(trace)
    shown = sorted({o.rank for _, o in acts}) if ranks is None else list(ranks)
    if p is None:
        p = max(1, len({o.rank for _, o in acts}))
    t0 = min((o.start for _, o in acts), default=0.0)
    span = max((o.end for _, o in acts), default=1.0) - t0 or 1.0
    scale, unit = (1e3, "ms") if span < 10 else (1.0, "s")
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(8.0, min(24.0, 0.35 * len(acts) / max(1, len(shown)))),
                                        0.6 * len(shown) + 1.6))
    else:
        fig = ax.figure
    row = {r: i for i, r in enumerate(shown)}
    for a, o in acts:
        if o.rank not in row:
            continue
        colour = _lighter(COLOURS[a.kind], min(0.6, 0.35 * (a.stage // p)))
        x, w = (o.start - t0) * scale, (o.end - o.start) * scale
        ax.barh(row[o.rank], w, left=x, height=0.8, color=colour, edgecolor="white", linewidth=0.5)
        if w > span * scale / 150:
            ax.text(x + w / 2, row[o.rank], str(a.mb), ha="center", va="center", fontsize=7, color="black")
    ax.set_yticks(range(len(shown)), [f"rank {r}" for r in shown])
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    kinds = [k for k in COLOURS if any(a.kind == k for a, _ in acts)]
    ax.legend(handles=[Patch(color=COLOURS[k], label=LABELS[k]) for k in kinds], loc="upper center",
              bbox_to_anchor=(0.5, -0.25), ncol=len(kinds), fontsize=8, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig


def title_for(meta: dict, metrics) -> str:
    """e.g. ``1f1b  p=4 m=8  makespan 12.3 ms  bubble 27.3%``."""
    v = meta.get("virtual_stages", 1)
    d = meta.get("data_parallel", 1)
    parts = [str(meta.get("schedule", "pipeline")), f"p={meta.get('stages')} m={meta.get('microbatches')}"
             + (f" v={v}" if v > 1 else "") + (f" d={d}" if d > 1 else ""),
             f"makespan {metrics.makespan * 1e3:.4g} ms", f"bubble {metrics.bubble:.1%}"]
    return "   ".join(parts)
