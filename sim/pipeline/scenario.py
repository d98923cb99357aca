"""`distlab simulate` glue for ``parallelism: {kind: pipeline, schedule: 1f1b, stages: 4, microbatches: 8}``.

``build`` is sim.scenario.BUILDERS["pipeline"]. data_parallel defaults to world_size // stages when the
scenario names a world_size, else 1. ``run_sweep`` serves ``--sweep microbatches=4,8,16`` (or stages,
virtual_stages, schedule): bubble and throughput (samples/s = m x micro-batch x d / makespan) per value.
"""
from __future__ import annotations

import copy

from distlab.sim.errors import ConfigError
from distlab.sim.pipeline import metrics as M
from distlab.sim.pipeline.plan import PipelineSpec, build_plan

SWEEPABLE = ("microbatches", "stages", "virtual_stages", "schedule", "data_parallel")


def spec_of(scenario: dict) -> PipelineSpec:
    par = dict(scenario.get("parallelism", {}))
    spec = PipelineSpec.from_dict(par, "parallelism")
    if "data_parallel" not in par and scenario.get("world_size") is not None:
        ws, p = scenario["world_size"], spec.stages
        if not isinstance(p, int) or ws % p:
            raise ConfigError(f"world_size {ws} is not a multiple of stages {p!r}", "parallelism.stages")
        spec.data_parallel = ws // p
    return spec.check()


def build(scenario: dict, model, cluster):
    """Registry entry: (plan, info) with info["report"](trace) and info["figure"](trace, title=...)."""
    spec = spec_of(scenario)
    if spec.world_size > cluster.world_size:
        raise ConfigError(f"stages x data_parallel = {spec.world_size} ranks but cluster {cluster.name!r} has "
                          f"{cluster.world_size} GPUs", "parallelism")
    plan = build_plan(model, spec)
    meta = plan.meta["pipeline"]

    def report(trace) -> dict:
        met = M.compute(trace, meta)
        ideal = M.ideal_bubble(spec.schedule, spec.stages, spec.microbatches, spec.virtual_stages)
        rows = [["pipeline makespan", f"{met.makespan * 1e3:.3f} ms"], ["bubble", f"{met.bubble:.1%}"
                 + (f" (uniform stages, free p2p: {ideal:.1%})" if ideal is not None else "")],
                ["p2p time (sum of sends)", f"{met.p2p_seconds * 1e3:.3f} ms"]]
        rows += [[f"stage {s}: peak in flight, activations", f"{met.peak_in_flight[s]} mb, "
                  f"{met.peak_stage_memory[s] / 2**20:.4g} MiB"] for s in met.peak_in_flight]
        return {"rows": rows, "pipeline": met.to_dict()}

    def figure(trace, title=None):
        from distlab.sim.pipeline.diagram import draw, title_for
        ranks = list(range(spec.stages))
        return draw(trace, None, title=(title + "\n" if title else "") + title_for(meta, M.compute(trace, meta)),
                    ranks=ranks, p=spec.stages)

    return plan, {"pipeline": meta, "report": report, "figure": figure}


def sweep_results(base: dict, key: str, values: list) -> list[dict]:
    """Simulate ``base`` with parallelism[key] = each value: makespan, bubble, samples/s, peak memory."""
    from distlab.sim import scenario as sc
    if key not in SWEEPABLE:
        raise ConfigError(f"cannot sweep {key!r} for a pipeline; allowed: {', '.join(SWEEPABLE)}", "--sweep")
    out = []
    for v in values:
        d = copy.deepcopy(base)
        d["parallelism"][key] = v
        trace, info, model, cluster, plan = sc.simulate(d, f"--sweep {key}={v}")
        met = M.compute(trace, info["pipeline"])
        mb = (model.config or {}).get("micro_batch", (model.config or {}).get("batch", 1))
        samples = info["pipeline"]["microbatches"] * mb * info["pipeline"]["data_parallel"]
        out.append({key: v, "makespan_s": met.makespan, "bubble": met.bubble, "samples_per_s": samples / met.makespan,
                    "peak_activation_bytes": max(met.peak_rank_memory), "p2p_s": met.p2p_seconds,
                    "model": model.name, "cluster": cluster.name, "world_size": plan.world_size})
    return out


def sweep_figure(results: list[dict], key: str, title: str | None = None):
    """Two panels against ``key``: bubble fraction, and throughput in samples/s."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    xs = [r[key] for r in results]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    a.plot(xs, [100 * r["bubble"] for r in results], marker="o")
    a.set_ylabel("bubble (%)")
    b.plot(xs, [r["samples_per_s"] for r in results], marker="o", color="#DD8452")
    b.set_ylabel("throughput (samples/s)")
    for ax in (a, b):
        ax.set_xlabel(key)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def run_sweep(args, base: dict, key: str, values: list) -> int:
    """`distlab simulate SCENARIO --sweep microbatches=...` for a pipeline scenario."""
    import os

    from distlab.sim.cli import print_json, print_table
    results = sweep_results(base, key, values)
    files = {}
    title = f"{results[0]['model']} on {results[0]['cluster']}: pipeline {base['parallelism'].get('schedule', '1f1b')}"
    if not args.no_files and all(isinstance(v, (int, float)) for v in values):
        from distlab.sim.io import save_figure
        os.makedirs(args.out, exist_ok=True)
        files["sweep"] = os.path.join(args.out, f"sweep-{key}.png")
        save_figure(sweep_figure(results, key, title), files["sweep"])
    if args.json:
        print_json({"sweep": key, "results": results, "files": files})
        return 0
    print_table(f"{title}: sweep of {key}", [key, "ranks", "makespan (ms)", "bubble %", "samples/s",
                                             "peak activations (MiB)", "p2p (ms)"],
                [[r[key], r["world_size"], f"{r['makespan_s'] * 1e3:.3f}", f"{100 * r['bubble']:.1f}",
                  f"{r['samples_per_s']:.4g}", f"{r['peak_activation_bytes'] / 2**20:.4g}", f"{r['p2p_s'] * 1e3:.3f}"]
                 for r in results])
    for path in files.values():
        print(f"wrote {path}")
    return 0
