"""The numbers behind the lessons' sliders (sim/lessons/widgets.py draws them): each a plain function of the
slider values, computed by the library, tested in tests/test_lessons_widgets.py.

    >>> memory_per_gpu("llama3-8b", gpus=64, zero=3, tp=2)["total"] / 2**30          # doctest: +SKIP
    >>> bubble(schedule="1f1b", p=4, m=8)["simulated"]                                # 3/11, as lesson 07 derives
    0.2727...

- ``memory_per_gpu``: params, grads, optimizer state and activations of the fullest GPU: sim/parallel/memory.py,
  the one model `simulate`, `plan`, `reproduce` and `distlab memory` report, for DDP (ZeRO 0), ZeRO-1 and 2
  (optimizer state, and gradients, sharded over the data-parallel ranks; Rajbhandari et al. 2020, arXiv
  1910.02054, Fig. 1) and FSDP2 (ZeRO 3).
- ``bubble``: a pipeline schedule simulated with uniform stages (sim/lessons/pipelines.py), its bubble against
  the formula (p-1)/(v·m+p-1).
- ``busbw_curve``: a collective simulated over a sweep of sizes on a cluster preset with a forced algorithm and
  protocol (sim/kernel/engine.py simulate_collective), time and busbw per size.
- ``goodput``: the expected goodput over the checkpoint interval (sim/resilience.py), Young's and Daly's
  intervals and the best one.
"""
from __future__ import annotations

GiB = 2**30
MODELS = ("llama3-8b", "llama3-70b", "llama3-405b", "llama-7b", "gpt2-medium")
RECOMPUTE = ("none", "selective", "full")
DTYPES = ("bfloat16", "float32")
CP_RECOMPUTE = ("none", "full")          # sim/planner/layouts.py CP_RECOMPUTE: ring attention has no selective


def model_spec(model: str, seq_len: int | None = None, dtype: str | None = None) -> dict:
    """The model spec of a preset name or a Hugging Face config.json path (or its folder), with ``seq_len`` and
    ``dtype`` when given. ``pkg.module:factory`` is refused here: a slider never imports code."""
    from distlab.sim.models.spec import spec_from_text
    spec = spec_from_text(model, "model")
    if "factory" in spec:
        raise ValueError(f"model {model!r}: give a preset name or a config.json path")
    return {**spec, **({"seq_len": seq_len} if seq_len else {}), **({"dtype": dtype} if dtype else {})}


def layout(gpus: int, zero: int, tp: int, pp: int, cp: int, micro_batch: int, microbatches: int, recompute: str,
           sequence_parallel: bool = True):
    """The planner's Layout the widget's controls describe (sim/planner/layouts.py), the same `simulate` builds
    from ``Layout.scenario``: ZeRO 0-2 are DDP's layout (1 and 2 then shard its optimizer state, and gradients,
    over the dp ranks), ZeRO 3 is FSDP2 over every dp rank. Raises ValueError for what torch does not build."""
    from distlab.sim.planner.layouts import Layout
    if zero not in (0, 1, 2, 3) or recompute not in RECOMPUTE:
        raise ValueError(f"zero must be 0-3 and recompute one of {', '.join(RECOMPUTE)}")
    if gpus % (tp * cp * pp):
        raise ValueError(f"tp x cp x pp = {tp * cp * pp} does not divide {gpus} GPUs")
    if cp > 1 and zero != 3:
        raise ValueError("with cp > 1 torchtitan shards the parameters with FSDP2 over dp_shard x cp "
                         "(sim/parallel/cp/plan.py): ZeRO 0-2 do not apply; choose ZeRO 3")
    if cp > 1 and recompute not in CP_RECOMPUTE:
        raise ValueError(f"with cp > 1 recompute is one of {', '.join(CP_RECOMPUTE)} (ring attention's "
                         "selective recompute is not modelled)")
    dp = gpus // (tp * cp * pp)
    return Layout(tp, pp, dp, "fsdp" if zero == 3 else "ddp", micro_batch, microbatches if pp > 1 else 1,
                  sequence_parallel and tp > 1, recompute, cp=cp)


def memory_scenario(model: str = "llama3-8b", gpus: int = 64, zero: int = 3, tp: int = 1, pp: int = 1, cp: int = 1,
                    micro_batch: int = 1, microbatches: int = 8, recompute: str = "none",
                    sequence_parallel: bool = True, seq_len: int | None = None, dtype: str | None = None,
                    cluster: str = "dgx-h100") -> dict:
    """The scenario the widget's controls describe, as `distlab simulate` and `distlab memory --scenario` take
    it: the planner's (``layout``, ``Layout.scenario``) for ZeRO 0 and 3; ZeRO-1/2 as ``fsdp: {zero: 1 or 2}``
    over the dp ranks (dp_shard), the recompute then in the model at tp 1 (`simulate` builds ZeRO-1/2 without
    TP only: with tp > 1 it refuses the scenario, `distlab memory --scenario` still counts it)."""
    L = layout(gpus, zero, tp, pp, cp, micro_batch, microbatches, recompute, sequence_parallel)
    d = L.scenario(model_spec(model, seq_len, dtype), cluster, max(1, gpus // 8))
    if zero in (1, 2) and L.dp > 1:
        d["mesh"] = {("dp_shard" if k == "dp" else k): v for k, v in d["mesh"].items()}
        d["fsdp"] = {"zero": zero, "reshard_after_forward": not L.pipelined}
        if L.pipelined:
            d["pipeline"] = {k: v for k, v in d["tp"].items()
                             if k in ("schedule", "microbatches", "virtual_stages", "split")}
        d["tp"] = {k: v for k, v in d["tp"].items() if k in ("sequence_parallel", "loss_parallel", "recompute")}
        if tp == 1:
            d["model"]["recompute"] = d.pop("tp")["recompute"]
            d["mesh"].pop("tp", None)
    return d


def memory_per_gpu(model: str = "llama3-8b", gpus: int = 64, zero: int = 3, tp: int = 1, pp: int = 1, cp: int = 1,
                   micro_batch: int = 1, microbatches: int = 8, recompute: str = "none",
                   sequence_parallel: bool = True, seq_len: int | None = None, dtype: str | None = None,
                   cluster: str = "dgx-h100") -> dict:
    """Bytes per GPU by part ({params, grads, optimizer, [unsharded params, unsharded grads,] activations[, ring
    buffers], total}) of ``model`` (a preset or a config.json path; ``seq_len`` and ``dtype``: bfloat16 =
    mixed-precision AdamW, 2 + 2 + 12 bytes per parameter, float32 = 4 + 4 + 8; None = the model's own) on
    ``gpus`` GPUs of ``cluster`` nodes laid out tp x cp x pp x dp (dp = the rest), data parallelism as ZeRO
    ``zero`` (``layout``), ``microbatches`` in flight for the pipeline's peak (1F1B), ``recompute``: what
    `distlab memory --scenario` and `distlab simulate` print for :func:`memory_scenario` (the one model,
    sim/parallel/memory.py). Also ``dp``, ``gpu_GiB`` and ``fits``. Raises ValueError for a layout torch does
    not build."""
    from types import SimpleNamespace
    from distlab.sim import scenario as sc
    from distlab.sim.errors import ConfigError
    from distlab.sim.parallel.memory import memory_section
    from distlab.sim.parallel.tp.rules import check_divides
    d = memory_scenario(model, gpus, zero, tp, pp, cp, micro_batch, microbatches, recompute, sequence_parallel,
                        seq_len, dtype, cluster)
    try:                                          # what `simulate` refuses for this model, refused here too
        _, _, m, c, mesh, opts = sc.parts(d, "memory widget")
        check_divides(m, tp, "tp", sequence_parallel and tp > 1)
        mem = memory_section(SimpleNamespace(model=m, mesh=mesh, options=opts, cluster=c))["json"]
    except ConfigError as e:
        raise ValueError(str(e)) from None
    parts = dict(mem["breakdown_bytes"])
    parts["total"] = mem["total_bytes"]
    dp = gpus // (tp * cp * pp)
    return {**parts, "dp": dp, "gpu_GiB": mem["gpu_memory_GiB"], "fits": mem["fits"]}


def memory_rows(result: dict) -> list[list]:
    """[part, GiB] rows of :func:`memory_per_gpu`'s result, then the total against the GPU."""
    rows = [[k, f"{v / GiB:.1f}"] for k, v in result.items()
            if k not in ("total", "dp", "gpu_GiB", "fits")]
    verdict = "fits" if result["fits"] else "does not fit"
    return rows + [["total", f"{result['total'] / GiB:.1f}"], [f"on {result['gpu_GiB']:g} GiB", verdict]]


def bubble(schedule: str = "1f1b", p: int = 4, m: int = 8, v: int = 1) -> dict:
    """The schedule simulated with uniform stages and free p2p (F = 1 ms, B = 2 ms, or I = W = 1 ms for the
    zero-bubble ones; lesson 07): its bubble, the closed form where there is one ((p-1)/(m+p-1) for GPipe and
    1F1B, (p-1)/(v·m+p-1) interleaved; sim/parallel/pipeline/metrics.py ideal_bubble), the step and the trace."""
    from distlab.sim.lessons.pipelines import pipeline_metrics, pipeline_trace
    from distlab.sim.parallel.pipeline import metrics as M
    from distlab.sim.parallel.pipeline import schedules as S
    v = v if schedule == "interleaved" else 2 if schedule in ("zbv", "dualpipev") else 1
    met = pipeline_metrics(schedule, p, m, v)
    return {"simulated": met.bubble, "formula": M.ideal_bubble(S.normalise(schedule), p, m, v),
            "step_s": met.makespan, "trace": pipeline_trace(schedule, p, m, v), "p": p, "m": m, "v": v,
            "schedule": schedule}


SIZES = tuple(2**k for k in range(3, 34, 2))          # 8 B to 8 GiB


def busbw_curve(op: str = "all_reduce", cluster: str = "dgx-h100", nodes: int = 1, algorithm: str = "ring",
                protocol: str = "auto", sizes=SIZES) -> list[dict]:
    """One simulated collective per size: rows {bytes, time_s, algbw_GBps, busbw_GBps, algorithm, protocol}
    (sim/lessons/helpers.py simulate_sweep, the simulator's own α-β-and-links model)."""
    from distlab.sim.cluster import load_cluster
    from distlab.sim.lessons.helpers import simulate_sweep
    return simulate_sweep(op, list(sizes), load_cluster(cluster, nodes), algorithm, protocol)


def goodput(mtbf_h: float = 3.0, checkpoint_s: float = 120.0, restart_min: float = 10.0, points: int = 60) -> dict:
    """Expected goodput (useful work over wall time) against the checkpoint interval: Young's and Daly's
    intervals, the best interval of the model and the goodput at each (sim/resilience.py)."""
    from distlab.sim import resilience as R
    M, d, r = mtbf_h * 3600.0, checkpoint_s, restart_min * 60.0
    young, daly, best = R.young_interval(d, M), R.daly_interval(d, M), R.optimal_interval(d, M)
    taus = [young * 0.1 * (40.0 ** (i / (points - 1))) for i in range(points)]        # 0.1 to 4 x Young
    return {"young_s": young, "daly_s": daly, "best_s": best, "taus_s": taus,
            "goodput": [R.expected_goodput(t, d, M, r) for t in taus],
            "at_young": R.expected_goodput(young, d, M, r), "at_daly": R.expected_goodput(daly, d, M, r),
            "at_best": R.expected_goodput(best, d, M, r)}
