"""Fit the ring model to measured collective times and turn the fit into a cluster's ``calibration`` section.

Model (Thakur, Rabenseifner & Gropp 2005; sim.collectives.ring_cost): t(S) = steps(n) x α + f(n) x S / B.
A straight line t = a + b S fitted by least squares on the median times gives α = a / steps and B = f / b.
Rows are weighted by 1 / t, so the fit minimises relative error (a 1 MiB point counts as much as a 64 MiB
one). A negative intercept or slope (noise) falls back to α = 0 and a slope fitted through the origin.
"""
from __future__ import annotations

import numpy as np

from distlab.sim.errors import ConfigError


def ring_cost(op: str, n: int) -> tuple[int, float]:
    from distlab.sim.collectives import ring_cost as cost
    return cost(op, n)


def fit_line(sizes, times) -> tuple[float, float]:
    """(a, b) of t = a + b S, weighted least squares with weights 1 / t; a >= 0."""
    s = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    if len(s) < 2 or len(set(s.tolist())) < 2:
        raise ConfigError("a fit needs at least two different sizes", "--sizes")
    w = 1.0 / t
    A = np.stack([np.ones_like(s), s], axis=1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(A, t * w, rcond=None)
    if a < 0 or b <= 0:
        a = 0.0
        b = float(np.sum(s * w * t * w) / np.sum((s * w) ** 2))
    return float(a), float(b)


def fit_op(op: str, n: int, sizes, times) -> dict:
    """{latency_us, bandwidth_GBps} of the ring model for ``op`` at group size ``n``."""
    steps, factor = ring_cost(op, n)
    a, b = fit_line(sizes, times)
    return {"latency_us": round(a / max(steps, 1) * 1e6, 3), "bandwidth_GBps": round(factor / b / 1e9, 6)}


def calibration_from_rows(rows: list[dict]) -> dict:
    """Sweep rows (runtime.sweep) of any ops and world sizes -> {"collectives": {op: {"n": fit}}}; fits the
    time from launch (``launch_time_s``) where rows have it."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        if r["op"] != "barrier":
            groups.setdefault((r["op"], r["world_size"]), []).append(r)
    table: dict[str, dict] = {}
    for (op, n), rs in sorted(groups.items()):
        times = [r.get("launch_time_s", r["time_s"]) for r in rs]
        table.setdefault(op, {})[str(n)] = fit_op(op, n, [r["bytes"] for r in rs], times)
    return {"collectives": table}


def predict(calibration: dict, op: str, n: int, nbytes: float) -> float | None:
    """The calibrated ring model's time, interpolated in n like sim.collectives.context (None if absent)."""
    table = calibration.get("collectives", {}).get(op)
    if not table:
        return None
    points = sorted((int(k), v) for k, v in table.items())
    ns = [k for k, _ in points]
    lat = float(np.interp(n, ns, [v["latency_us"] for _, v in points])) * 1e-6
    bw = float(np.interp(n, ns, [v["bandwidth_GBps"] for _, v in points])) * 1e9
    steps, factor = ring_cost(op, n)
    return steps * lat + factor * nbytes / bw


def calibrated_cluster(calibration: dict, compute: dict | None, world_size: int, backend: str):
    """The localhost-cpu preset sized to ``world_size`` ranks, with measured compute and the calibration.
    intra_node gets the all_reduce fit at the largest group (used by plans the calibration does not cover)."""
    from dataclasses import replace

    from distlab.sim.cluster import PRESETS, GPUSpec
    base = replace(PRESETS["localhost-cpu"], gpus_per_node=world_size)      # one node of world_size ranks
    gpu = base.gpu
    if compute:
        mem = _memory_GiB() / max(world_size, 1)
        gpu = GPUSpec("cpu" if backend == "gloo" else "measured", tflops=round(compute["flops_per_s"] / 1e12, 6),
                      hbm_GBps=round(compute["copy_Bps"] / 1e9, 3), memory_GiB=round(mem, 2))
    intra = base.intra_node
    ar = calibration.get("collectives", {}).get("all_reduce")
    if ar:
        best = ar[max(ar, key=int)]
        intra = replace(intra, bandwidth_GBps=best["bandwidth_GBps"], latency_us=best["latency_us"])
    name = "localhost-cpu-calibrated" if backend == "gloo" else "localhost-calibrated"
    return replace(base, name=name, gpu=gpu, intra_node=intra, calibration=calibration)


def _memory_GiB() -> float:
    import os
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return 8.0
