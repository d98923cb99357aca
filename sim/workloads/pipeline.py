"""The ``pipeline`` workload: stages over mesh dimension ``pp``, replicated over ``dp`` (each stage's gradients
all-reduced across its replicas). sim/parallel/pipeline/plan.py builds the plan; the report gives makespan, bubble,
p2p time and in-flight microbatches; the figure is the pipeline diagram. Sweeps report samples/s =
m x micro-batch x d / makespan.
Process groups (sim/kernel/communicators.py): activations and gradients move by send/recv on pair communicators
(never behind a collective); each stage's dp group all-reduces its gradients; GPT-2's tied embedding gradient is
all-reduced on the group of the first and last stage's ranks."""
from __future__ import annotations

from distlab.sim.parallel.pipeline import metrics as M
from distlab.sim.parallel.pipeline.plan import PipelineOptions, pipeline_plan
from distlab.sim.workloads.base import Workload


def build(model, mesh, opts: PipelineOptions, cluster):
    plan = pipeline_plan(model, mesh, opts.spec(mesh, model))
    return plan, {"pipeline": plan.meta["pipeline"]}


def report(result) -> dict:
    meta = result.info["pipeline"]
    met = M.compute(result.trace, meta)
    ideal = M.ideal_bubble(meta["schedule"], meta["stages"], meta["microbatches"], meta["virtual_stages"])
    rows = [["pipeline makespan", f"{met.makespan * 1e3:.3f} ms"],
            ["bubble (idle share of ranks x makespan)",
             f"{met.bubble:.1%}" + (f" (uniform stages, free p2p: {ideal:.1%})" if ideal is not None else "")],
            ["p2p time (sum of sends)", f"{met.p2p_seconds * 1e3:.3f} ms"]]
    pairs = meta.get("overlap_f_b") or []
    if any(pairs):
        rows.append(["overlapped F;B pairs per rank (torch OVERLAP_F_B, run F then B)",
                     ", ".join(f"{len(rank)}" for rank in pairs) + f" (rank 0: {' '.join(pairs[0][:3])} ...)"])
    rows += [[f"stage {s}: peak microbatches in flight, their activations", f"{met.peak_in_flight[s]}, "
              f"{met.peak_stage_memory[s] / 2**20:.4g} MiB"] for s in met.peak_in_flight]
    mem = memory(result, met)
    rows += mem["rows"]
    return {"rows": rows, "warnings": mem["warnings"], "json": {"pipeline": {**met.to_dict(), "overlap_f_b": pairs},
                                                                "memory": mem["json"]}}


def memory(result, met=None) -> dict:
    """Per-GPU memory rows of the fullest pipeline rank: sim/parallel/memory.py, the one model of every command
    (its schedule walk gives the in-flight micro-batches the stage rows above show from the simulated trace)."""
    from distlab.sim.parallel.memory import memory_section
    return memory_section(result)


def figure(result, title=None):
    from distlab.sim.parallel.pipeline.diagram import draw, title_for
    meta = result.info["pipeline"]
    p = meta["stages"]
    peers = list(result.mesh.group_of(0, "pp"))
    heading = (title + "\n" if title else "") + title_for(meta, M.compute(result.trace, meta))
    return draw(result.trace, None, title=heading, ranks=peers, p=p)


def sweep_row(result) -> dict:
    meta = result.info["pipeline"]
    met = M.compute(result.trace, meta)
    cfg = result.model.config or {}
    samples = meta["microbatches"] * cfg.get("micro_batch", cfg.get("batch", 1)) * meta["data_parallel"]
    return {"makespan_s": met.makespan, "bubble": met.bubble, "samples_per_s": samples / met.makespan,
            "peak_activation_bytes": max(met.peak_rank_memory), "p2p_s": met.p2p_seconds}


def sweep_figure(rows: list[dict], key: str, title: str | None = None):
    """Two panels against ``key``: bubble fraction, and throughput in samples/s."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    xs = [r[key] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    a.plot(xs, [100 * r["bubble"] for r in rows], marker="o")
    a.set_ylabel("bubble (%)")
    b.plot(xs, [r["samples_per_s"] for r in rows], marker="o", color="#DD8452")
    b.set_ylabel("throughput (samples/s)")
    for ax in (a, b):
        ax.set_xlabel(key)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def legacy(section: dict, mesh: dict, scenario: dict) -> None:
    """Old ``parallelism: {kind: pipeline, stages, data_parallel}``: stages default 2; without a world_size,
    data_parallel defaults to 1 and the world is stages x data_parallel (as before the mesh)."""
    mesh.setdefault("pp", 2)
    if scenario.get("world_size") is None:
        mesh.setdefault("dp", 1)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in mesh.values()):
            scenario["world_size"] = mesh["pp"] * mesh["dp"]


WORKLOAD = Workload(
    name="pipeline", help="pipeline parallelism: stages over pp (GPipe, 1F1B, interleaved, ZB-H1, ZBV, DualPipeV, "
                          "Looped BFS), "
                          "replicated over dp",
    dims=("dp", "pp"), required_dims=("pp",), fill_dim="dp", options=PipelineOptions, build=build, report=report,
    figure=figure, sweep_row=sweep_row, sweep_figure=sweep_figure,
    dim_words={"pp": "pipeline stages", "dp": "pipeline replicas"},
    legacy_keys={"stages": "pp", "data_parallel": "dp"}, legacy=legacy)
