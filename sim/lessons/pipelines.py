"""Lesson helpers for pipeline parallelism (lesson 07): ideal timelines, bubbles, tables and figures. No torch."""
from __future__ import annotations

from distlab.sim.lessons.helpers import Figure, Table


# --- pipeline parallelism (lesson 07) --------------------------------------------------------------------------
PIPELINE_SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zbh1", 1), ("zbv", 2))
# Uniform stages, free point-to-point: a forward takes 1 ms, a backward 2 ms (split: I = W = 1 ms).
UNIFORM_MS = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}


def pipeline_trace(schedule: str, p: int, m: int, v: int = 1, ms: dict | None = None):
    """The ideal timeline of ``schedule`` (sim.pipeline.metrics.ideal_trace): every action as soon as its
    input is there, free p2p, each stage (of p·v) taking ``ms[kind]`` milliseconds (default UNIFORM_MS, the
    whole model's F divided evenly: a stage of an interleaved or zbv rank costs 1/v of it)."""
    from distlab.sim.parallel.pipeline import metrics as M
    from distlab.sim.parallel.pipeline import schedules as S
    ms = {**UNIFORM_MS, **(ms or {})}
    acts = S.build(schedule, p, m, v)
    trace = M.ideal_trace(acts, lambda a: ms[a.kind] * 1e-3 / v)
    trace.meta["pipeline"] = {"schedule": S.normalise(schedule), "stages": p, "microbatches": m,
                              "virtual_stages": v, "activation_bytes": [1.0] * (p * v)}
    return trace


def pipeline_metrics(schedule: str, p: int, m: int, v: int = 1, ms: dict | None = None,
                     activation_bytes: float = 1.0):
    """distlab.sim.parallel.pipeline.metrics.compute of :func:`pipeline_trace`. A rank's layers stash ``activation_bytes`` per
    microbatch (so each of its v stages 1/v of it): peak_stage_memory, peak_rank_memory in those bytes."""
    from distlab.sim.parallel.pipeline import metrics as M
    trace = pipeline_trace(schedule, p, m, v, ms)
    return M.compute(trace, {"activation_bytes": [activation_bytes / v] * (p * v)})


def plot_pipeline(trace, title: str | None = None, p: int | None = None) -> Figure:
    """The classic pipeline diagram (sim.pipeline.diagram.draw): a row per rank, F/B/I/W boxes with their
    microbatch numbers; ``title`` defaults to the schedule, p, m, makespan and bubble."""
    from distlab.sim.parallel.pipeline import diagram
    from distlab.sim.parallel.pipeline import metrics as M
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
    from distlab.sim.parallel.pipeline import metrics as M
    from distlab.sim.parallel.pipeline import schedules as S
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
    from distlab.sim.parallel.pipeline import metrics as M
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
    """Rows of sim.scenario.pipeline.sweep_results: makespan, bubble, samples/s, peak activations, p2p."""
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
