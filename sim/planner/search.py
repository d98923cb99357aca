"""`distlab plan`'s search: enumerate layouts, drop those that do not fit, estimate the rest fast, confirm the
best with the discrete-event simulator, rank them.

Ranking: step time for the fixed global batch (so also tokens per second); MFU = model FLOPs per step / (GPUs x
peak FLOP/s x step), model FLOPs counted as 3 x forward (forward + backward = 2 x forward; recomputation is not
counted, as in Narayanan et al. 2021 sec. 5.1 "model FLOPs", and Chowdhery et al. 2022's MFU).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from distlab.sim.cluster import Cluster, load_cluster
from distlab.sim.errors import ConfigError
from distlab.sim.parallel.fsdp.memory import fits
from distlab.sim.planner.confirm import SIMULATE_UP_TO, composed_step as _composed_step
from distlab.sim.planner.layouts import Layout, batch_suggestions, enumerate_layouts, tp_degrees
from distlab.sim.planner.step import Estimator
from distlab.sim.workers import can_fork, run_many, worker_count


@dataclass
class Candidate:
    layout: Layout
    memory: dict                      # bytes per GPU by part
    estimate: object = None           # estimate.Estimate
    simulated_s: float | None = None  # the discrete-event simulator's step (confirmed candidates)
    simulated: dict | None = None     # its step summary

    @property
    def memory_bytes(self) -> float:
        return sum(self.memory.values())

    @property
    def step_s(self) -> float:
        return self.simulated_s if self.simulated_s is not None else self.estimate.step_s


@dataclass
class Search:
    """What one search found: ``ranked`` (fitting candidates, fastest first; the first ``confirmed`` ones
    simulated), every enumerated candidate in ``all``, and the question it answered."""
    question: dict
    cluster: object
    ranked: list = field(default_factory=list)
    all: list = field(default_factory=list)
    confirmed: int = 0
    model_flops: float = 0.0          # per step
    gpu_GiB: float = 0.0
    estimator: object = None          # the Estimator (explanations estimate neighbours with it)
    fit: int = 0                      # layouts that fit the GPU's memory
    pruned: int = 0                   # of those, not estimated: their lower bound rules them out (estimate_pruned)
    confirmed_by: str = "the simulator"

    def mfu(self, c: Candidate) -> float:
        return self.model_flops / (self.cluster.world_size * self.cluster.gpu.tflops * 1e12 * c.step_s)

    def tokens_per_s_per_gpu(self, c: Candidate) -> float:
        q = self.question
        return q["global_batch"] * q["seq_len"] / c.step_s / self.cluster.world_size


def search(model: dict, cluster: str, nodes: int, global_batch: int, confirm: int = 5,
           micro_batches=(1, 2, 4, 8, 16, 32, 64), progress=None, allow=None, workers: int | None = None,
           scheduler: str | None = None, keep: int | None = None, phase=None) -> Search:
    """Search every layout (sim/planner/layouts.py) of ``model`` (a scenario ``model:`` mapping) on ``nodes``
    nodes of ``cluster`` (a preset name, a file, or a Cluster, e.g. with a fitted GEMM curve; then ``confirm``
    must be 0: the simulator's scenarios name their cluster) for ``global_batch`` sequences per step.
    ``progress(done, total)`` is called as the estimate goes; ``allow(layout)`` restricts the search (e.g. to
    what a published run could use); ``workers`` processes share the estimate and the confirmation (default:
    the CPUs, at most 2; 1 runs in this process; sim/workers.py), and ``scheduler`` (a Dask scheduler's
    address) runs the confirmation on that cluster instead; ``keep``: the table's rows: then only the layouts that could be among
    the best ``keep`` or their family's best are estimated (:func:`estimate_pruned`; None: all); ``phase(text)``
    hears each phase begin. Raises
    ConfigError when no layout divides the batch or none fits."""
    c = cluster if isinstance(cluster, Cluster) else load_cluster(cluster, nodes)
    est = Estimator(model, c)
    config = est.model(1).config
    world, gpn = c.world_size, c.gpus_per_node
    if isinstance(cluster, Cluster) and confirm:
        raise ValueError("confirm the layouts of a Cluster object by simulating their plans yourself")
    if global_batch < 1:
        raise ConfigError(f"{global_batch} must be a whole number >= 1", "--global-batch")
    layouts = [L for L in enumerate_layouts(config, world, gpn, global_batch, micro_batches)
               if allow is None or allow(L)]
    if not layouts:
        near = batch_suggestions(world, global_batch, tp_degrees(config, gpn), config["layers"])
        raise ConfigError(f"no layout of {world} GPUs divides a global batch of {global_batch} sequences "
                          f"(data-parallel size x micro-batch x micro-batches); allowed nearby: "
                          f"{', '.join(map(str, near))}", "--global-batch")
    gib = c.gpu.memory_GiB
    cands = [Candidate(L, est.memory(L)) for L in layouts]
    feasible = [x for x in cands if fits(x.memory_bytes, gib)]
    if not feasible:
        least = min(cands, key=lambda x: x.memory_bytes)
        raise ConfigError(f"{est.model(1).name} does not fit on {world} x {c.gpu.name} "
                          f"({gib:g} GiB each) in any layout; the smallest needs "
                          f"{least.memory_bytes / 2**30:.1f} GiB per GPU ({least.layout.label()}); allowed: "
                          "more nodes, a GPU with more memory, or a smaller micro-batch / sequence", "--model")
    say = phase or (lambda text: None)
    say(f"{len(layouts)} layouts, {len(feasible)} fit; estimating")
    estimated = estimate_pruned(est, feasible, keep, progress, workers)
    if confirm:
        say(f"{len(estimated)} estimated; confirming the best {confirm}")
    estimated.sort(key=lambda x: x.estimate.step_s)
    out = Search({"model": model, "cluster": cluster, "nodes": nodes, "global_batch": global_batch,
                  "seq_len": config["seq_len"], "world_size": world}, c, estimated, cands, 0,
                 3.0 * est.model(1).fwd_flops * global_batch, gib, est, fit=len(feasible),
                 pruned=len(feasible) - len(estimated))
    confirm_top(out, confirm, workers, scheduler=scheduler)
    if confirm:
        confirm_challengers(out, confirm, workers, scheduler)
    return out


def confirm_challengers(s: Search, k: int, workers: int | None = None, scheduler: str | None = None) -> None:
    """Confirm, ``k`` at a time (at most MORE_ROUNDS times), the unconfirmed layouts whose estimate is shorter
    than the confirmed #1's step, so #1 is the fastest of what the simulator ran and no estimate above it in the
    order is left unchecked; then order the table: #1 (confirmed), the rest by their step (simulated where
    confirmed, else estimated; an estimate still shorter than #1's is marked with its bound by the output)."""
    for _ in range(MORE_ROUNDS):
        best = min(x.simulated_s for x in s.ranked if x.simulated_s is not None)
        challengers = [x for x in s.ranked if x.simulated_s is None and x.estimate.step_s < best][:k]
        if not challengers:
            break
        _simulate_all(s, challengers, workers, scheduler)
    first = min((x for x in s.ranked if x.simulated_s is not None), key=lambda x: x.simulated_s)
    rest = sorted((x for x in s.ranked if x is not first), key=lambda x: x.step_s)
    s.ranked[:] = [first] + rest
    s.confirmed = sum(x.simulated_s is not None for x in s.ranked)


def is_estimate_below(s: Search, step_s: float, confirmed: bool) -> bool:
    """Whether a printed step must say it is an estimate with its bound: unconfirmed and shorter than #1's."""
    return not confirmed and step_s < s.ranked[0].step_s


# The fast estimate's error bound against the discrete-event simulator: tests/test_planner.py holds it on random
# layouts of every family (5% without FSDP2 inside pipeline stages; up to 8% with it: sim/planner/stage_fsdp.py).
ESTIMATE_BOUND = 0.08
MORE_ROUNDS = 1               # further confirmations (k more) while an estimate is shorter than the confirmed #1


PARALLEL_FROM = 256          # layouts from which the estimate is shared out between processes


def estimate_pruned(est, cands: list, keep: int | None, progress=None, workers: int | None = None,
                    least: int = PARALLEL_FROM) -> list:
    """Estimate the candidates that can matter, in order of a cheap lower bound of their estimate
    (sim/planner/step.py ``Estimator.bound``); return those estimated. A candidate is left out when its bound is
    at least the ``keep``-th shortest estimate so far and at least its family's shortest: its estimate could
    then enter neither the table's ``keep`` rows nor "the best of each family" (each family's first candidate is
    always estimated). ``keep`` None or fewer than ``least`` candidates: all estimated (in ``workers``
    processes, :func:`estimate_all`)."""
    if keep is None or len(cands) < least:
        for x, e in zip(cands, estimate_all(est, [x.layout for x in cands], progress, workers)):
            x.estimate = e
        return list(cands)
    bounds = {id(x): est.bound(x.layout) for x in cands}
    order = sorted(cands, key=lambda x: bounds[id(x)])
    best_of: dict = {}                  # family -> shortest estimate
    steps: list = []                    # the shortest ``keep`` estimates, ascending
    out = []
    for i, x in enumerate(order):
        fam, bound = x.layout.family, bounds[id(x)]
        if fam in best_of and bound >= best_of[fam] and len(steps) >= keep and bound >= steps[-1]:
            continue
        x.estimate = est.estimate(x.layout)
        out.append(x)
        t = x.estimate.step_s
        best_of[fam] = min(t, best_of.get(fam, t))
        steps = sorted(steps + [t])[:keep]
        if progress:
            progress(i + 1, len(order))
    if progress:
        progress(len(order), len(order))
    return out


def estimate_all(est, layouts: list, progress=None, workers: int | None = None) -> list:
    """Estimates of ``layouts`` in order. With more than one worker and many layouts: local processes
    (sim/workers.py, the estimator shared with each once), each given whole chunks of layouts that share a
    (tp, pp) shape (so their caches of collective times overlap little); the progress bar advances per chunk."""
    n = worker_count(workers)
    if n == 1 or len(layouts) < PARALLEL_FROM or not can_fork():      # the estimator is inherited, not pickled
        out = []
        for i, L in enumerate(layouts):
            out.append(est.estimate(L))
            if progress:
                progress(i + 1, len(layouts))
        return out
    order = sorted(range(len(layouts)), key=lambda i: (layouts[i].tp, layouts[i].pp, layouts[i].cp, i))
    size = max(16, len(layouts) // (n * 16))
    chunks = [[(i, layouts[i]) for i in order[k:k + size]] for k in range(0, len(order), size)]
    out: list = [None] * len(layouts)
    sizes = [0]
    for chunk in chunks:
        sizes.append(sizes[-1] + len(chunk))
    report = (lambda done, total: progress(sizes[done], len(layouts))) if progress else None
    for chunk, results in zip(chunks, run_many(_estimate_chunk, chunks, workers=n, shared=est, progress=report)):
        for (i, _), e in zip(chunk, results):
            out[i] = e
    return out


def _estimate_chunk(est, chunk: list) -> list:
    return [est.estimate(layout) for _, layout in chunk]


def confirm_top(s: Search, k: int, workers: int | None = None, start: int = 0, scheduler: str | None = None) -> None:
    """Simulate the best ``k`` estimates with the discrete-event simulator (in ``workers`` local processes, or on
    the Dask cluster at ``scheduler``: sim/workers.py) and re-rank them by its step; ``start``: the ``k`` after
    the best ``start`` instead (simulated, not re-ranked)."""
    top = s.ranked[start:start + k]
    _simulate_all(s, top, workers, scheduler)
    if start:
        return
    s.confirmed = len(top)
    s.ranked[:s.confirmed] = sorted(s.ranked[:s.confirmed], key=lambda x: x.step_s)


def _simulate_all(s: Search, top: list, workers: int | None = None, scheduler: str | None = None) -> None:
    """Simulate the candidates ``top`` and record each one's simulated step and summary."""
    q = s.question
    if q["world_size"] > SIMULATE_UP_TO and not scheduler:      # too large to simulate rank by rank
        s.confirmed_by = (f"their program, one rank per pipeline index (sim/planner/confirm.py; over "
                          f"{SIMULATE_UP_TO} GPUs, not every rank simulated)")
        for x, step in zip(top, run_many(_composed_step, [x.layout for x in top], workers=workers,
                                         shared=s.estimator)):
            x.simulated_s, x.simulated = step, {"step_s": step, "confirmed_by": "program"}
        return
    scenarios = [x.layout.to_scenario(q["model"], q["cluster"], q["nodes"]) for x in top]     # typed, parsed once
    # longest first (the simulator's work grows with the largest ring: the shard group's steps), so no worker is
    # left with a long one at the end
    order = sorted(range(len(top)), key=lambda i: -_ring_size(top[i].layout))
    summaries = [None] * len(top)
    for i, summary in zip(order, run_many(_simulate, [scenarios[i] for i in order], workers=workers,
                                          scheduler=scheduler)):
        summaries[i] = summary
    for x, summary in zip(top, summaries):
        x.simulated_s, x.simulated = summary["step_s"], summary


def _ring_size(layout) -> int:
    """The largest data-parallel group of a layout: the ranks its all-gathers, reduce-scatters or all-reduces span."""
    m = layout.mesh()
    return max(m.get("dp_shard", 1) * m.get("cp", 1), m.get("dp", 1), m.get("dp_replicate", 1))


def _simulate(scenario) -> dict:
    """The step summary of a Scenario (sim/scenario/spec.py)."""
    from distlab.sim.scenario import simulate
    return dict(simulate(scenario, "plan").summary)
