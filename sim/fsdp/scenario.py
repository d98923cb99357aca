"""`parallelism: {kind: fsdp, zero: 3, ...}` in a scenario: the plan, then memory rows and a timeline with the
memory curve beneath it for `distlab simulate`. Options: see sim/fsdp/plan.py (KEYS)."""
from __future__ import annotations

from distlab.sim.fsdp.memory import DYNAMIC, STATIC, breakdown_line, fits, memory_curve, peak
from distlab.sim.fsdp.plan import build_fsdp


def build(scenario: dict, model, cluster):
    """Registry entry (sim.scenario.BUILDERS["fsdp"]): (plan, info); info carries the memory report and figure."""
    opts = {k: v for k, v in scenario.get("parallelism", {}).items() if k != "kind"}
    plan = build_fsdp(model, cluster.world_size, opts)
    gpu = cluster.gpu.memory_GiB
    info = {"report": lambda trace: report(plan, trace, gpu),
            "figure": lambda trace, title=None: figure(plan, trace, gpu, title=title)}
    return plan, info


def report(plan, trace, gpu_GiB: float) -> dict:
    """Peak memory (highest rank) with its breakdown, whether it fits, and rows for a table."""
    pk = peak(plan, trace)
    ok = fits(pk["total"], gpu_GiB)
    rows = [[f"peak memory (rank {pk['rank']}, t={pk['time'] * 1e3:.3f} ms)", _gib(pk["total"])]]
    rows += [[f"  {k}", _gib(v)] for k, v in pk["breakdown"].items()]
    rows.append(["fits the GPU", f"yes ({gpu_GiB:g} GiB)" if ok else f"NO: over {gpu_GiB:g} GiB"])
    out = {"peak_memory": pk, "fits": ok, "gpu_memory_GiB": gpu_GiB, "rows": rows}
    if not ok:
        out["warning"] = "does not fit: " + breakdown_line(pk["breakdown"], pk["total"], gpu_GiB)
    return out


def _gib(n: float) -> str:
    return f"{n / 2**30:.3f} GiB"


def figure(plan, trace, gpu_GiB: float | None = None, ranks: list[int] | None = None, title: str | None = None):
    """distlab.sim.plots.timeline of ``ranks`` (default the first two) and, beneath on the same time axis, rank 0's
    memory stacked by category (static: params, grads, optimizer; dynamic: unsharded, activations)."""
    from distlab.sim.plots import timeline
    ranks = ranks if ranks is not None else list(range(min(2, plan.world_size)))
    span = max(trace.makespan, 1e-12)
    wide = lambda o: o.name if o.end - o.start > 0.03 * span else None  # noqa: E731 - label only wide ops
    fig = timeline(trace, ranks=ranks, title=title, highlight=wide)
    ax0 = fig.axes[0]
    h = fig.get_figheight()
    fig.set_figheight(h + 2.6)
    gs = fig.add_gridspec(2, 1, height_ratios=[h, 2.6])
    ax0.set_subplotspec(gs[0])
    ax = fig.add_subplot(gs[1], sharex=ax0)
    draw_memory(ax, plan, trace, ranks[0], gpu_GiB)
    ax0.set_xlabel("")
    fig.tight_layout()
    return fig


def draw_memory(ax, plan, trace, rank: int = 0, gpu_GiB: float | None = None) -> None:
    times, totals, parts = memory_curve(plan, trace, rank)
    t0 = min((o.start for o in trace.ops), default=0.0)
    xs = [(t - t0) * 1e3 for t in times]
    static = plan.meta["memory"]["static"]
    layers = [[static[k] / 2**30] * len(xs) for k in STATIC] + [[p[k] / 2**30 for p in parts] for k in DYNAMIC]
    colors = ["#bdbdbd", "#969696", "#636363", "#fd8d3c", "#e6550d", "#9ecae1"]
    ax.stackplot(xs, layers, labels=list(STATIC) + list(DYNAMIC), colors=colors, step="post", alpha=0.9)
    top = max(totals) / 2**30
    if gpu_GiB is not None and gpu_GiB < 1.5 * top:
        ax.axhline(gpu_GiB, color="red", linestyle="--", linewidth=1)
        ax.text(xs[0], gpu_GiB, f" GPU {gpu_GiB:g} GiB", color="red", va="bottom", fontsize=7)
    ax.set_ylabel(f"rank {rank} memory (GiB)")
    ax.set_xlabel("time (ms)")
    ax.legend(loc="upper left", fontsize=7, ncol=3)
    ax.grid(alpha=0.3)
