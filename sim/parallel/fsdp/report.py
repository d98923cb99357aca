"""What `distlab simulate` shows of an FSDP step: peak memory with its breakdown (as FSDP2 holds it), whether it
fits the GPU, and a timeline with the memory curve beneath it. Hooks of the fsdp workload (sim/workloads/fsdp.py).

FSDP2 with a MixedPrecisionPolicy (param_dtype bf16) keeps the sharded parameters, their gradients and Adam's
m and v in fp32 and gathers bf16 copies for compute (torch.distributed.fsdp.MixedPrecisionPolicy docs): per
parameter element 4 + 4 + 8 = 16 bytes sharded, the same total as ZeRO's 2 + 2 + 12 accounting that the plan's
memory meta uses (sim/parallel/fsdp/memory.py); the breakdown shown here follows FSDP2's split.
"""
from __future__ import annotations

from distlab.sim.parallel.fsdp.memory import DYNAMIC, STATIC, memory_curve, peak
from distlab.sim.plan import DTYPE_BYTES


def fsdp2_breakdown(plan, breakdown: dict) -> dict:
    """``breakdown`` (plan accounting) with labels saying what FSDP2 holds: for ZeRO-3 with a 16-bit
    param_dtype, fp32 sharded params 4n, fp32 sharded grads 4n, Adam m and v 8n (n = shard elements), and the
    gathered units in param_dtype; ZeRO 1/2 keep the ZeRO accounting, labelled so."""
    meta = plan.meta
    pdt, zero = meta["param_dtype"], meta["zero"]
    b = DTYPE_BYTES[pdt]
    out = {}
    if zero == 3 and b < 4:
        n = breakdown["params"] // b
        out[f"params (fp32 shards; {pdt} gathered below)"] = 4 * n
        out["grads (fp32 shards)"] = 4 * n
        out["optimizer (Adam m, v: fp32 shards)"] = 8 * n
    else:
        sharded = {1: ("optimizer",), 2: ("optimizer", "grads"), 3: ("optimizer", "grads", "params")}[zero]
        for k in STATIC:
            out[f"{k} ({pdt if k != 'optimizer' else 'fp32'}, {'sharded' if k in sharded else 'replicated'})"] \
                = breakdown[k]
    out[f"unsharded params ({pdt}, gathered)"] = breakdown["unsharded params"]
    out[f"unsharded grads ({pdt})"] = breakdown["unsharded grads"]
    out["activations"] = breakdown["activations"]
    return out


def report(result) -> dict:
    """Memory per GPU as every command reports it (sim/parallel/memory.py), then the simulated step's peak on
    the memory curve (the figure beneath the timeline: FSDP2's transient units and gradients as they come and
    go) with its breakdown."""
    from distlab.sim.parallel.memory import memory_section
    plan, trace, gpu_GiB = result.plan, result.trace, result.cluster.gpu.memory_GiB
    mem = memory_section(result)
    pk = peak(plan, trace)
    shown = fsdp2_breakdown(plan, pk["breakdown"])
    rows = mem["rows"] + [[f"simulated peak on the memory curve (rank {pk['rank']}, t={pk['time'] * 1e3:.3f} ms)",
                           _gib(pk["total"])]]
    rows += [[f"  {k}", _gib(v)] for k, v in shown.items()]
    out = {"rows": rows, "json": {"memory": mem["json"], "fits": mem["json"]["fits"], "gpu_memory_GiB": gpu_GiB,
                                  "peak_memory": {"rank": pk["rank"], "time_s": pk["time"], "total_bytes": pk["total"],
                                                  "breakdown_bytes": pk["breakdown"], "fsdp2_breakdown_bytes": shown}}}
    if mem["warnings"]:
        out["warnings"] = mem["warnings"]
    return out


def figure_of(result, title=None):
    return figure(result.plan, result.trace, result.cluster.gpu.memory_GiB, title=title)


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
