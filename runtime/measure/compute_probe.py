"""Measure this machine's compute for the simulator: a GEMM efficiency curve, copy bandwidth, per-op overhead,
and the interference of a collective in flight.

``gemm_sweep``: GEMMs of many shapes (small, skinny, large; float32 on CPU, bfloat16 on CUDA), each timed in
blocks of back-to-back calls (CUDA-synchronised per block), plus the time of a 1 x 1 x 1 GEMM (the per-op
overhead ``launch_s``) and a copy's bandwidth (read + write, as runtime/execute/compute.py counts it).

``fit_gemms``: what the shared compute schema asks for (sim/cluster/specs.py GPUSpec; sim/compute.py's gemm_time =
launch_s + max(2MNK / (tflops x eff(2MNK)), (MK + KN + MN) x bytes / HBM)). A GEMM's rate = 2MNK / (t -
launch_s) (the overhead taking at most half of t); ``tflops`` = the best rate of the GEMMs lasting at least
LAUNCH_BOUND x launch_s (shorter ones are mostly overhead, too uncertain to set the peak); a shape's efficiency =
its rate / that (at most 1). The curve = the square shapes' efficiencies at their FLOPs: a curve in FLOPs alone
cannot tell shapes apart, so it holds the compute-bound kind, and a skinny GEMM's extra cost is left to the
bytes / HBM term; interpolated linearly in log10(FLOPs), clamped at both ends (``efficiency_at``, the schema's
rule). Every shape is then predicted by that model (``model_time``) and its error reported, so how well one
curve covers skinny shapes is measured, not assumed.

``InterferenceProbe`` (inside the ranks): every rank runs the same matmuls, first alone, then while a second
thread issues all_reduces back to back on their own process group; interference = rate alone / rate during
(matmuls that start and end while the all_reduces run; per round the slowest rank's, since ranks that meet in
collectives wait for it), the robust center over rounds (runtime/measure/robust.py).
Every rank computes in both, so the sharing of cores between the ranks (sim/kernel/cores.py) is in both rates and
the ratio holds only what the communication takes (gloo's threads on CPU; NCCL's SMs and HBM on GPUs).
The same rounds give the reverse direction, ``comm_interference`` = the time of the all_reduces with every rank
computing (the window above) / the time of as many all_reduces with no compute (timed in each round, between
the two phases); per round the slowest rank's times, the robust center over rounds (sim/kernel/cores.py
CommSlowdown: what it slows, and why neither factor counts the core sharing).

``compute_jitter``: from the same work timed on every rank at once, round after round, the variance between ranks
per second of compute (sim/kernel/skew.py: sigma^2 = J mu).
"""
from __future__ import annotations

import math
import time

LAUNCH_BOUND = 4          # a GEMM this many times longer than the per-op overhead may set the peak rate
CPU_SHAPES = [(n, n, n) for n in (16, 32, 64, 128, 256, 512, 1024)] + [
    (8, 1024, 1024), (64, 1024, 1024), (1024, 1024, 8), (1024, 1024, 64), (1024, 64, 1024), (4096, 128, 128)]
CUDA_SHAPES = [(n, n, n) for n in (128, 256, 512, 1024, 2048, 4096, 8192)] + [
    (16, 8192, 8192), (128, 8192, 8192), (8192, 8192, 16), (8192, 8192, 128), (8192, 128, 8192),
    (16384, 1024, 1024)]


def shape_kind(m: int, n: int, k: int) -> str:
    """square (M = N = K), skinny (one side 16x smaller than the largest), else rectangular."""
    if m == n == k:
        return "square"
    return "skinny" if min(m, n, k) * 16 <= max(m, n, k) else "rectangular"


def _timer(device):
    import torch
    if device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def _call_time(fn, sync) -> float:
    t0 = time.perf_counter()
    fn()
    sync()
    return max(time.perf_counter() - t0, 1e-7)


def gemm_sweep(device: str = "cpu", shapes=None, budget_s: float = 2.0, rounds: int = 7) -> dict:
    """{"device", "dtype", "launch_s", "copy_Bps", "gemms": [{m, n, k, kind, flops, time_s}]}. Rounds interleave
    the shapes (each round times one block of back-to-back calls per shape, blocks sized to ``budget_s`` in all)
    and a shape's time is its fastest round: a burst of load from other processes spreads over all shapes and
    then drops out, and what is left is the speed of a core (or GPU) that the rank has to itself; sharing
    cores between ranks is sim/kernel/cores.py's part."""
    import torch

    from distlab.runtime.execute.compute import Matmuls
    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    sync = _timer(dev)
    shapes = list(shapes or (CUDA_SHAPES if dev.type == "cuda" else CPU_SHAPES))
    g = torch.Generator(device="cpu").manual_seed(0)
    calls = []
    for m, n, k in [(1, 1, 1)] + shapes:            # 1 x 1 x 1: the per-op overhead
        a = torch.rand(m, k, generator=g).to(dev, dtype)
        b = torch.rand(k, n, generator=g).to(dev, dtype)
        c = torch.empty(m, n, dtype=dtype, device=dev)
        calls.append(lambda a=a, b=b, c=c: torch.mm(a, b, out=c))
    mm = Matmuls(dev, n=16)
    mm.measure_copy(64 * 2**20 if dev.type == "cuda" else 32 * 2**20)
    calls.append(lambda: mm._dst.copy_(mm._src))
    per_block = budget_s * 0.9 / rounds / len(calls)
    for fn in calls:                                  # warm-up: first-call allocations and dispatch
        _call_time(fn, sync)
    repeats = [max(1, int(per_block / _call_time(fn, sync))) for fn in calls]
    best = [float("inf")] * len(calls)
    for _ in range(rounds):
        for i, fn in enumerate(calls):
            best[i] = min(best[i], _call_time(lambda: [fn() for _ in range(repeats[i])], sync) / repeats[i])
    rows = [{"m": m, "n": n, "k": k, "kind": shape_kind(m, n, k), "flops": 2.0 * m * n * k, "time_s": t}
            for (m, n, k), t in zip(shapes, best[1:-1])]
    launch = min(best[:-1])              # the overhead cannot be longer than any GEMM (noise)
    return {"device": dev.type, "dtype": str(dtype).replace("torch.", ""), "launch_s": launch,
            "copy_Bps": 2 * mm._src.numel() * 4 / best[-1], "gemms": rows}


def fit_gemms(sweep: dict) -> dict:
    """{"tflops", "gemm_efficiency" (tuple of (flops, fraction)), "hbm_GBps", "launch_s"} and, per GEMM row,
    ``flops_per_s``, ``efficiency`` and ``curve_efficiency`` (the fitted curve at its FLOPs) added in place."""
    launch = sweep["launch_s"]
    for r in sweep["gemms"]:
        r["flops_per_s"] = r["flops"] / max(r["time_s"] - launch, r["time_s"] / 2)
    long = [r for r in sweep["gemms"] if r["time_s"] >= LAUNCH_BOUND * launch] or sweep["gemms"]
    best = max(r["flops_per_s"] for r in long)
    for r in sweep["gemms"]:
        r["efficiency"] = min(1.0, r["flops_per_s"] / best)
    squares = sorted((r for r in sweep["gemms"] if r["kind"] == "square"), key=lambda r: r["flops"])
    curve = tuple((r["flops"], round(max(r["efficiency"], 1e-4), 4)) for r in squares)
    fit = {"tflops": best / 1e12, "gemm_efficiency": curve or None, "hbm_GBps": sweep["copy_Bps"] / 1e9,
           "launch_s": launch}
    nbytes = 2 if sweep["dtype"] == "bfloat16" else 4
    for r in sweep["gemms"]:
        r["curve_efficiency"] = efficiency_at(curve, r["flops"]) if curve else 1.0
        r["model_time_s"] = model_time(r["m"], r["n"], r["k"], nbytes, fit)
        r["model_error"] = (r["model_time_s"] - r["time_s"]) / r["time_s"]
    return fit


def model_time(m: int, n: int, k: int, dtype_bytes: int, fit: dict) -> float:
    """The shared schema's GEMM time: launch_s + max(2MNK / (tflops x eff(2MNK)), (MK + KN + MN) x bytes / HBM)."""
    flops = 2.0 * m * n * k
    eff = efficiency_at(fit["gemm_efficiency"], flops) if fit["gemm_efficiency"] else 1.0
    return fit["launch_s"] + max(flops / (fit["tflops"] * 1e12 * eff),
                                 (m * k + k * n + m * n) * dtype_bytes / (fit["hbm_GBps"] * 1e9))


def efficiency_at(curve, flops: float) -> float:
    """The curve at ``flops``: linear in log10(FLOPs) between points, clamped at both ends (the schema's rule)."""
    x = math.log10(flops)
    pts = [(math.log10(f), e) for f, e in curve]
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, e0), (x1, e1) in zip(pts, pts[1:]):
        if x <= x1:
            return e0 + (e1 - e0) * (x - x0) / (x1 - x0)
    return pts[-1][1]


class InterferenceProbe:
    """Inside the ranks: ``round()`` = every rank runs matmuls for ``window_s`` alone, then while a second thread
    issues all_reduces of ``nbytes`` back to back on their own process group (the same count on every rank, from
    rank 0's timing of a few); it keeps this rank's rate alone (FLOP/s) and the ratio alone / during (matmuls that
    start and end while the all_reduces run). ``result()`` gathers every rank's rounds and, per round, takes the
    slowest rank's rates (as runtime/measure/sweep.py's measure_compute does: ranks that meet in collectives wait for
    the slowest), then the robust center over the rounds."""

    def __init__(self, ctx, nbytes: int = 4 * 2**20, window_s: float = 0.04):
        import torch
        import torch.distributed as dist

        from distlab.runtime.execute.compute import Matmuls
        from distlab.runtime.execute.wire import broadcast_json
        self.ctx, self.nbytes, self.window_s = ctx, nbytes, window_s
        self.group = dist.new_group(list(range(ctx.world_size)))
        self.buf = torch.ones(nbytes // 4, dtype=torch.float32, device=ctx.device)
        self.mm = Matmuls(ctx.device)
        cuda = ctx.device.type == "cuda"      # GPU: compute and all_reduces on streams of their own, each waited
        self.streams = [torch.cuda.Stream(ctx.device) for _ in range(2)] if cuda else None   # for alone
        self._all_reduce()
        t0 = time.perf_counter()
        for _ in range(3):
            self._all_reduce()
        probe = broadcast_json(max((time.perf_counter() - t0) / 3, 1e-5), src=0)   # the same all_reduces everywhere
        self.count = max(2, round(window_s / probe))
        self._on(0, lambda: self.mm.run(1))
        self.alone: list[float] = []         # matmuls per second, per round
        self.during: list[float] = []
        self.comm_alone: list[float] = []    # seconds of the round's all_reduces: no compute / every rank computing
        self.comm_during: list[float] = []

    def _on(self, i: int, fn) -> None:
        """``fn()`` on stream ``i`` (0 compute, 1 communication) and wait for that stream only (CPU: just fn())."""
        if self.streams is None:
            fn()
            return
        import torch
        with torch.cuda.stream(self.streams[i]):
            fn()
        self.streams[i].synchronize()

    def _all_reduce(self) -> None:
        import torch.distributed as dist
        self._on(1, lambda: dist.all_reduce(self.buf, group=self.group))

    def _matmuls(self, until) -> list[float]:
        ends = [time.perf_counter()]
        while not until():
            self._on(0, lambda: self.mm.run(1))
            ends.append(time.perf_counter())
        return ends

    def round(self) -> None:
        import threading

        import torch.distributed as dist
        dist.barrier()
        start = time.perf_counter()
        ends = self._matmuls(lambda: time.perf_counter() - start > self.window_s)
        alone = (len(ends) - 1) / (ends[-1] - ends[0])
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(self.count):
            self._all_reduce()
        comm_alone = time.perf_counter() - t0
        dist.barrier()
        window, done = [], threading.Event()

        def comm():
            window.append(time.perf_counter())
            for _ in range(self.count):
                self._all_reduce()
            window.append(time.perf_counter())
            done.set()
        thread = threading.Thread(target=comm, daemon=True)
        thread.start()
        ends = self._matmuls(done.is_set)
        thread.join()
        inside = [t for t in ends if window[0] <= t <= window[1]]
        during = (len(inside) - 1) / (inside[-1] - inside[0]) if len(inside) > 1 else 1 / (window[1] - window[0])
        self.alone.append(alone)
        self.during.append(during)
        self.comm_alone.append(comm_alone)
        self.comm_during.append(window[1] - window[0])

    def result(self) -> dict:
        """{"flops_per_s": matmul rate alone, "interference" (>= 1), "interference_spread", ..._rounds, ..._bytes,
        "comm_interference" (>= 1), "comm_interference_spread"}: robust centers (runtime/measure/robust.py) over every
        rank's rounds; "per_round": each round's three figures (the slowest rank's), in order, which validate
        --out keeps beside the plan's runs (benchmarks/overlap_ops.py compares them op by op)."""
        from distlab.runtime.measure import robust
        from distlab.runtime.execute.wire import all_gather_json
        every = all_gather_json((self.alone, self.during, self.comm_alone, self.comm_during))
        rounds = range(len(self.alone))
        alone = [min(e[0][j] for e in every) for j in rounds]
        during = [min(e[1][j] for e in every) for j in rounds]
        ratios = [a / d for a, d in zip(alone, during)]
        comm = [max(e[3][j] for e in every) / max(e[2][j] for e in every) for j in rounds]
        comm_alone = [max(e[2][j] for e in every) / self.count for j in rounds]      # one all_reduce, no compute
        return {"flops_per_s": robust.center(alone) * self.mm.flops_per_iter,
                "interference": max(1.0, robust.center(ratios)),
                "interference_spread": robust.spread(ratios), "interference_rounds": len(ratios),
                "interference_bytes": self.nbytes, "comm_interference": max(1.0, robust.center(comm)),
                "comm_interference_spread": robust.spread(comm),
                "comm_alone_s": robust.center(comm_alone),
                "per_round": {"flops_per_s": [a * self.mm.flops_per_iter for a in alone],
                              "interference": ratios, "comm_interference": comm, "comm_alone_s": comm_alone}}


def compute_jitter(per_rank_rounds: list[list[float]]) -> float:
    """J in seconds from ``per_rank_rounds`` (per rank, its time of the same work in each round; the ranks run
    each round at once). Per round: the sample variance across the n ranks s^2 (unbiased, n - 1) over their mean
    m, J_r = s^2 / m; then J = median(J_r) / median(chi^2_k / k), k = n - 1 (for normal noise s^2 / sigma^2 ~
    chi^2_k / k; its median is 0.4549 for k = 1, else Wilson & Hilferty 1931's (1 - 2 / (9k))^3): a median, so
    a round that another process spoiled moves it little (runtime/measure/robust.py's reasoning)."""
    import statistics
    rounds = [r for r in zip(*per_rank_rounds) if len(r) > 1 and statistics.fmean(r) > 0]
    if not rounds:
        return 0.0
    k = len(rounds[0]) - 1
    chi2_median = 0.454936 if k == 1 else (1 - 2 / (9 * k)) ** 3
    return statistics.median(statistics.variance(r) / statistics.fmean(r) for r in rounds) / chi2_median


def measure_interference(ctx, nbytes: int = 4 * 2**20, window_s: float = 0.03, rounds: int = 4) -> dict:
    """``rounds`` rounds of InterferenceProbe: {"interference", "interference_spread", "interference_rounds",
    "interference_bytes"}; ``nbytes``: the all_reduce's size (the overlap plan's, runtime/measure/validation.py)."""
    probe = InterferenceProbe(ctx, nbytes, window_s)
    for _ in range(rounds):
        probe.round()
    out = probe.result()
    del out["flops_per_s"], out["per_round"], out["comm_alone_s"]
    return out


def measure_here(backend: str, threads: int, budget_s: float) -> dict:
    """The GEMM sweep in this process (CUDA for nccl when a GPU is present, else CPU with ``threads`` intra-op
    threads, as one rank has) and its fit: the sweep's dict with ``fit`` and ``threads`` added."""
    import torch
    device = "cuda" if backend == "nccl" and torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(threads)
    sweep = gemm_sweep(device, budget_s=budget_s)
    sweep["fit"] = fit_gemms(sweep)
    sweep["threads"] = threads if device == "cpu" else None
    return sweep


def write_with_fit(path: str, cluster, fit: dict):
    """Rewrite the cluster YAML at ``path`` (its comment header kept, one line added) with the gpu's tflops,
    gemm_efficiency, hbm_GBps and launch_s from ``fit``; checked by loading it back (sim.cluster). The Cluster."""
    from dataclasses import replace

    from distlab.sim.cluster import cluster_from_dict
    from distlab.sim.io import write_atomic
    gpu = replace(cluster.gpu, tflops=round(fit["tflops"], 6), hbm_GBps=round(fit["hbm_GBps"], 3),
                  gemm_efficiency=fit["gemm_efficiency"], launch_s=round(fit["launch_s"], 9))
    new = cluster_from_dict(replace(cluster, gpu=gpu).to_dict(), where=path)
    with open(path) as f:
        head = "".join(line for line in f if line.startswith("#"))
    head += ("# gpu tflops, gemm_efficiency, hbm_GBps, launch_s: one rank alone, measured by --compute "
             "(runtime/measure/compute_probe.py)\n")
    write_atomic(path, head + new.to_yaml())
    return new


def plot_curve(probe: dict, path: str) -> None:
    """Write ``curve_figure(probe)`` to ``path``."""
    from distlab.sim.io import save_figure
    save_figure(curve_figure(probe), path)


def curve_figure(probe: dict):
    """Efficiency against GEMM FLOPs (log x): each shape by kind, and the fitted curve."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for kind, marker in (("square", "o"), ("skinny", "v"), ("rectangular", "s")):
        rs = [r for r in probe["gemms"] if r["kind"] == kind]
        if rs:
            ax.scatter([r["flops"] for r in rs], [r["efficiency"] for r in rs], marker=marker, label=kind)
    curve = probe["fit"]["gemm_efficiency"] or ()
    if curve:
        ax.plot([f for f, _ in curve], [e for _, e in curve], color="black", lw=1, label="fitted curve")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("FLOPs of one GEMM (2 M N K)")
    ax.set_ylabel(f"fraction of the peak ({probe['fit']['tflops'] * 1e3:.1f} GFLOP/s)")
    ax.set_title(f"GEMM efficiency, {probe['dtype']} on {probe['device']}")
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
