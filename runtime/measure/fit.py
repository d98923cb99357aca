"""Fit the ring model to measured collective times and turn the fit into a cluster's ``calibration`` section.

Model (Thakur, Rabenseifner & Gropp 2005; sim.collectives.ring_cost): t(S) = steps(n) x α + f(n) x S / B.
A straight line t = a + b S fitted to the times gives α = a / steps and B = f / b. Robust (runtime/measure/robust.py):
each size's time is the median of medians of its repeated samples (a row's ``launch_times_s``), and the line
is fitted by IRLS with bisquare weights on relative residuals, so a 1 MiB point counts as much as a 64 MiB
one and a size spoiled by a burst of load gets no weight. A negative intercept or slope (noise) falls back to
α = 0 and a slope fitted through the origin. Each entry keeps ``spread``: the largest robust CV of one size's
samples; above robust.SPREAD_WARN the fit warns (``fit_warnings``).

Size bands: where one line misses a calibrated size by more than BAND_TOLERANCE (relative), e.g. a CPU whose
caches make small messages faster per byte than large ones, the sizes are split in two at the point that
minimises the worst relative error of the two lines, recursively (each band keeps >= 2 sizes; at most
MAX_BANDS). The entry keeps the one-line fit (older readers use it) and adds ``bands`` [{min_bytes,
max_bytes, latency_us, bandwidth_GBps}]; sim/calibration.py looks a size up in them.
"""
from __future__ import annotations

import numpy as np

from distlab.sim.errors import ConfigError

BAND_TOLERANCE = 0.25
MAX_BANDS = 3


def ring_cost(op: str, n: int) -> tuple[int, float]:
    from distlab.sim.collectives import ring_cost as cost
    return cost(op, n)


def fit_line(sizes, times) -> tuple[float, float]:
    """(a, b) of t = a + b S, robust relative-error fit (robust.line); a >= 0."""
    from distlab.runtime.measure import robust
    s = np.asarray(sizes, dtype=float)
    if len(s) < 2 or len(set(s.tolist())) < 2:
        raise ConfigError("a fit needs at least two different sizes", "--sizes")
    a, b, _ = robust.line(s, times)
    return a, b


def worst_error(sizes, times, a: float, b: float) -> float:
    """The largest |a + b S - t| / t over the points."""
    s, t = np.asarray(sizes, dtype=float), np.asarray(times, dtype=float)
    return float(np.max(np.abs(a + b * s - t) / t))


def split_bands(sizes, times) -> list[tuple[list, list]]:
    """The (sizes, times) of each size band (see the module docstring); one band when one line fits."""
    order = np.argsort(sizes)
    s, t = [float(sizes[i]) for i in order], [float(times[i]) for i in order]
    bands = [(s, t)]
    while len(bands) < MAX_BANDS:
        errors = [worst_error(bs, bt, *fit_line(bs, bt)) if len(set(bs)) >= 2 else 0.0 for bs, bt in bands]
        k = int(np.argmax(errors))
        bs, bt = bands[k]
        cuts = [i for i in range(2, len(bs) - 1) if bs[i - 1] < bs[i] and len(set(bs[:i])) >= 2
                and len(set(bs[i:])) >= 2]
        if errors[k] <= BAND_TOLERANCE or not cuts:
            break
        best = min(cuts, key=lambda i: max(worst_error(bs[:i], bt[:i], *fit_line(bs[:i], bt[:i])),
                                           worst_error(bs[i:], bt[i:], *fit_line(bs[i:], bt[i:]))))
        bands[k:k + 1] = [(bs[:best], bt[:best]), (bs[best:], bt[best:])]
    return bands


def fit_op(op: str, n: int, sizes, times) -> dict:
    """{latency_us, bandwidth_GBps, spread, samples} of the ring model for ``op`` at group size ``n`` (one line
    over every size), plus ``bands`` where one line does not fit (module docstring). ``times``: per size one
    time or a list of repeated samples (robust center per size)."""
    from distlab.runtime.measure import robust
    steps, factor = ring_cost(op, n)
    samples = [list(t) if isinstance(t, (list, tuple)) else [t] for t in times]
    times = [robust.center(x) for x in samples]

    from distlab.runtime.measure.robust import median_noise        # how far a size's median moves by chance
    noise = max(median_noise(x) for x in samples)

    def params(s, t) -> dict:
        """The line's α and B, and α's resolution: how far the smallest size's median moves by chance, per
        step (an intercept below it cannot be told from 0)."""
        a, b = fit_line(s, t)
        return {"latency_us": round(a / max(steps, 1) * 1e6, 3), "bandwidth_GBps": round(factor / b / 1e9, 6),
                "latency_resolution_us": round(noise * min(t) / max(steps, 1) * 1e6, 3)}
    out = params(sizes, times)
    out["spread"] = round(max(robust.spread(x) for x in samples), 4)
    out["samples"] = sum(len(x) for x in samples)
    out["noise"] = round(noise, 4)
    bands = split_bands(sizes, times)
    if len(bands) > 1:
        out["bands"] = [{"min_bytes": int(min(s)), "max_bytes": int(max(s)), **params(s, t)} for s, t in bands]
    return out


def latency_text(entry: dict, digits: int = 1) -> str:
    """A fitted latency in µs as printed: '12.3', or '< 4.0' when it is below its resolution (the smallest size's
    noise per step, ``latency_resolution_us``) or below the printed digits: too small to measure."""
    lat, res = entry["latency_us"], max(entry.get("latency_resolution_us", 0.0), 10.0 ** -digits)
    return f"< {res:.{digits}f}" if lat < res else f"{lat:.{digits}f}"


def calibration_from_rows(rows: list[dict]) -> dict:
    """Sweep rows (runtime.measure.sweep) of any ops and world sizes -> {"collectives": {op: {"n": fit}}}; fits the
    time from launch (``launch_time_s``) where rows have it."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        if r["op"] != "barrier":
            groups.setdefault((r["op"], r["world_size"]), []).append(r)
    table: dict[str, dict] = {}
    for (op, n), rs in sorted(groups.items()):
        times = [r.get("launch_times_s") or r.get("times_s") or [r.get("launch_time_s", r["time_s"])] for r in rs]
        table.setdefault(op, {})[str(n)] = fit_op(op, n, [r["bytes"] for r in rs], times)
    return {"collectives": table}


def fit_warnings(calibration: dict) -> list[str]:
    """One line per fitted entry whose samples scatter more than robust.SPREAD_WARN."""
    from distlab.runtime.measure import robust
    out = []
    for op, per_n in calibration.get("collectives", {}).items():
        for n, entry in per_n.items():
            w = robust.warning(f"{op} on {n} ranks", entry.get("spread", 0.0))
            if w:
                out.append(w)
    return out


def predict(calibration: dict, op: str, n: int, nbytes: float) -> float | None:
    """The calibrated ring model's time for ``nbytes`` (its size band), interpolated in n as the simulator
    does (sim/calibration.py); None if the calibration has no entry for ``op``."""
    from distlab.sim.calibration import calibrated
    found = calibrated(calibration, op, n, nbytes)
    if found is None:
        return None
    lat, bw = found
    steps, factor = ring_cost(op, n)
    return steps * lat + factor * nbytes / bw


def calibrated_cluster(calibration: dict, compute: dict | None, world_size: int, backend: str,
                       cpu_cores: float | None = None):
    """The localhost-cpu preset sized to ``world_size`` ranks, with measured compute and the calibration.
    intra_node gets the all_reduce fit at the largest group (used by plans the calibration does not cover).
    ``cpu_cores`` (CPU ranks): the cores the ranks share (sim/kernel/cores.py), c = runtime/measure/load.py
    effective_cores(world_size): fair sharing with the other processes' observed shares. Compute was measured
    with all ``world_size`` ranks at once, each getting min(1, c / world_size) of what one rank alone gets, so
    the rate of one rank alone (the cluster's gpu) is the measured rate x max(1, world_size / c).
    ``interference``: the measured slowdown of compute while an all_reduce is in flight (compute["interference"],
    runtime/measure/compute_probe.py); ``comm_interference``: the all_reduce's slowdown while every rank computes."""
    from dataclasses import replace

    from distlab.sim.cluster import PRESETS, GPUSpec
    base = replace(PRESETS["localhost-cpu"], gpus_per_node=world_size)      # one node of world_size ranks
    gpu = base.gpu
    if compute:
        mem = _memory_GiB() / max(world_size, 1)
        alone = max(1.0, world_size / cpu_cores) if cpu_cores else 1.0
        gpu = GPUSpec("cpu" if backend == "gloo" else "measured",
                      tflops=round(compute["flops_per_s"] * alone / 1e12, 6),
                      hbm_GBps=round(compute["copy_Bps"] * alone / 1e9, 3), memory_GiB=round(mem, 2),
                      arch="cpu" if backend == "gloo" else compute.get("arch", "hopper"))
    intra = base.intra_node
    ar = calibration.get("collectives", {}).get("all_reduce")
    if ar:
        best = ar[max(ar, key=int)]
        intra = replace(intra, bandwidth_GBps=best["bandwidth_GBps"], latency_us=best["latency_us"])
    name = "localhost-cpu-calibrated" if backend == "gloo" else "localhost-calibrated"
    interference = round(compute.get("interference", 1.0), 3) if compute else 1.0   # runtime/measure/compute_probe.py
    comm = round(compute.get("comm_interference", 1.0), 3) if compute else 1.0      # the reverse direction
    return replace(base, name=name, gpu=gpu, intra_node=intra, calibration=calibration, cpu_cores=cpu_cores,
                   interference=interference, comm_interference=comm)


def _memory_GiB() -> float:
    import os
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return 8.0
