"""The planner's Pareto figure: step time against memory per GPU for every layout that fits, the Pareto front
(no other layout is both faster and smaller) drawn as a line, the simulated ones marked, #1 named."""
from __future__ import annotations


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points (memory, step) that no other point beats on both, by memory."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front, best = [], float("inf")
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def pareto(search):
    """The figure: one colour and marker per family (legend outside the axes, with the Pareto front, the simulated
    layouts and the GPU's memory), '#1' at the best layout and its full label under the title, wrapped; no text
    overlaps another or leaves the axes (sim/figure_text.py)."""
    import textwrap

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from distlab.sim.figure_text import place_labels
    cands = search.ranked
    pts = [(c.memory_bytes / 2**30, c.step_s * 1e3) for c in cands]
    fig, ax = plt.subplots(figsize=(10, 5.5))
    families = sorted({c.layout.family for c in cands})
    colors, markers = plt.get_cmap("tab10").colors, "osD^vP"
    for i, fam in enumerate(families):
        xs = [p for p, c in zip(pts, cands) if c.layout.family == fam]
        ax.scatter([x for x, _ in xs], [y for _, y in xs], s=12, alpha=0.6, label=fam, color=colors[i % 10],
                   marker=markers[i // 10 % len(markers)])
    front = pareto_front(pts)
    ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], color="black", lw=1, label="Pareto front")
    sim = [p for p, c in zip(pts, cands) if c.simulated_s is not None]
    ax.scatter([x for x, _ in sim], [y for _, y in sim], s=60, facecolors="none", edgecolors="red",
               label="simulated")
    ax.axvline(search.gpu_GiB, color="grey", ls="--", lw=1, label=f"GPU memory ({search.gpu_GiB:g} GiB)")
    ax.set_xlabel("memory per GPU (GiB)")
    ax.set_ylabel("step (ms)")
    q = search.question
    best = "#1: " + cands[0].layout.label() if cands else ""
    ax.set_title(f"{len(cands)} layouts that fit: {q['world_size']} x {search.cluster.gpu.name}, global batch "
                 f"{q['global_batch']}\n" + "\n".join(textwrap.wrap(best, 110)), fontsize=9, loc="left")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    if cands:
        place_labels(fig, ax, [(pts[0][0], pts[0][1], "#1")], fontsize=8)
    return fig
