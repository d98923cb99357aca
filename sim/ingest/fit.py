"""nccl-tests rows -> a cluster's ``calibration`` section, and a preset's busbw error per size regime.

    cluster = cluster_from_logs([load("all_reduce_perf.txt")])     # a Cluster the simulator loads
    errors = regime_errors(load("all_reduce_perf.txt"), PRESETS["dgx-h100"])

The model is the one `distlab calibrate` fits to its own measurements (runtime/measure/fit.py, sim/calibration.py): per
op and group size n, t(S) = steps(n) x α + f(n) x S / B (the ring's steps and factor), one α-β line per size band.
Here the bands are cut so that every measured size is reproduced within BAND_TOLERANCE: sizes in order, a band
grows while one line (fitted on relative error) stays within it, and the next band starts where it does not; a
band of one size keeps α = 0 and B through that point. Between two bands (no measured size there) the lookup
interpolates in log S (sim/calibration.py). The time fitted is the out-of-place column (the one nccl-tests' Avg bus
bandwidth and most published numbers quote); rows with #wrong > 0 are dropped (named in the notes).

The cluster around the calibration: the preset of the log's GPU (A100 -> dgx-a100, H100 -> dgx-h100, H200 ->
hgx-h200, GB200 -> gb200-nvl72; others dgx-h100, said in the notes) with the log's hosts as nodes and ranks per
host as GPUs per node (one node of all ranks when the header lost its rank lines). Ops and group sizes the logs
do not cover keep the preset's network model.

Size regimes (issue 40): below 1 MiB, 1-128 MiB, above 128 MiB; the error of a regime is the mean of
|predicted - measured| / measured busbw over its sizes (and the worst, signed).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from distlab.sim.errors import ConfigError

BAND_TOLERANCE = 0.02
REGIMES = (("below 1 MiB", 0, 1 << 20), ("1-128 MiB", 1 << 20, (128 << 20) + 1),     # [lo, hi): 128 MiB is mid
           ("above 128 MiB", (128 << 20) + 1, 1 << 62))
PRESET_OF_DEVICE = (("GB200", "gb200-nvl72"), ("Graphics Device", "gb200-nvl72"), ("H200", "hgx-h200"),
                    ("H100", "dgx-h100"), ("A100", "dgx-a100"), ("B200", "dgx-b200"))


def _line(sizes, times) -> tuple[float, float]:
    """(a, b) of t = a + b S minimising the relative error (weighted least squares, weights 1/t); a >= 0, b > 0."""
    s, t = np.asarray(sizes, float), np.asarray(times, float)
    if len(s) == 1:
        return 0.0, float(t[0] / s[0])
    w = 1 / t
    a, b = np.linalg.lstsq(np.column_stack([w, s * w]), np.ones_like(t), rcond=None)[0]
    if a < 0 or b <= 0:
        a, b = 0.0, float(np.sum(s * t * w * w) / np.sum(s * s * w * w))
    return float(a), float(b)


def _worst(sizes, times, a: float, b: float) -> float:
    s, t = np.asarray(sizes, float), np.asarray(times, float)
    return float(np.max(np.abs(a + b * s - t) / t))


def bands(sizes, times, tolerance: float = BAND_TOLERANCE) -> list[tuple[list, list, float, float]]:
    """[(sizes, times, a, b)] in size order, each band's line within ``tolerance`` of its every point."""
    out, i = [], 0
    while i < len(sizes):
        j = i + 1
        while j < len(sizes) and _worst(sizes[i:j + 1], times[i:j + 1], *_line(sizes[i:j + 1], times[i:j + 1])) \
                <= tolerance:
            j += 1
        out.append((sizes[i:j], times[i:j], *_line(sizes[i:j], times[i:j])))
        i = j
    return out


def fit_entry(op: str, n: int, sizes, times_s) -> dict:
    """{latency_us, bandwidth_GBps, bands: [...]} of one op and group size (sim/calibration.py's format)."""
    from distlab.sim.collectives import ring_cost
    steps, factor = ring_cost(op, n)
    if steps == 0:
        raise ConfigError(f"{op} on {n} rank(s) moves nothing; a fit needs 2 ranks or more", "nccl-tests log")
    order = np.argsort(sizes)
    s = [float(sizes[k]) for k in order]
    t = [float(times_s[k]) for k in order]

    def params(a, b) -> dict:
        return {"latency_us": round(a / steps * 1e6, 6), "bandwidth_GBps": round(factor / b / 1e9, 6)}
    entry = params(*_line(s, t))
    parts = bands(s, t)
    if len(parts) > 1:
        entry["bands"] = [{"min_bytes": int(bs[0]), "max_bytes": int(bs[-1]), **params(a, b)}
                          for bs, _, a, b in parts]
    entry["samples"] = len(s)
    return entry


def calibration_from_logs(logs) -> dict:
    """{"collectives": {op: {str(n): entry}}, "source": ...} over every log (the later log wins a repeated size)."""
    points: dict[tuple[str, int], dict[int, float]] = {}
    dropped = []
    for log in logs:
        for r in log.rows:
            if r.bytes <= 0 or r.oop.time_us <= 0:
                continue
            if r.oop.wrong:
                dropped.append(f"{log.path}: {r.bytes} B has {r.oop.wrong:g} wrong elements")
                continue
            points.setdefault((log.op, log.nranks), {})[r.bytes] = r.oop.time_us * 1e-6
    table: dict = {}
    for (op, n), by_size in sorted(points.items()):
        if len(by_size) < 1:
            continue
        table.setdefault(op, {})[str(n)] = fit_entry(op, n, list(by_size), list(by_size.values()))
    if not table:
        raise ConfigError("no usable rows (every size 0, or wrong)", logs[0].path if logs else "nccl-tests log")
    return {"collectives": table, "source": "nccl-tests", "logs": [log.path for log in logs],
            "fitted_column": "out-of-place time", "dropped": dropped}


def preset_for(devices: list[str]) -> tuple[str, str | None]:
    """(preset name, a note when guessed) for a log's device names."""
    for needle, preset in PRESET_OF_DEVICE:
        if any(needle in d for d in devices):
            return preset, None
    return "dgx-h100", f"device {devices[0] if devices else '?'!r} has no preset: the dgx-h100 network is used " \
                       "for what was not measured"


def cluster_from_logs(logs, name: str = "nccl-tests-fitted"):
    """The cluster (sim/cluster Cluster) of the logs' machine with their calibration (module docstring)."""
    from distlab.sim.cluster import PRESETS, validated
    big = max(logs, key=lambda log: log.nranks)
    preset, note = preset_for([d for log in logs for d in log.devices])
    base = PRESETS[preset]
    per_host = set(big.ranks_per_host.values())
    if big.hosts and len(per_host) == 1:
        nodes, gpus = len(big.hosts), per_host.pop()
    else:
        nodes, gpus = 1, big.nranks
    calibration = calibration_from_logs(logs)
    calibration["notes"] = [x for log in logs for x in log.notes] + ([note] if note else [])
    cluster = replace(base, name=name, nodes=nodes, gpus_per_node=gpus, calibration=calibration)
    if nodes > 1 and cluster.inter_node is None:
        raise ConfigError(f"{nodes} hosts but preset {preset} has no inter-node network", big.path)
    return validated(cluster, big.path)


def busbw_rows(log, cluster) -> list[dict]:
    """Per size of ``log``: measured and simulated busbw on ``cluster`` sized to the log's ranks."""
    from distlab.sim.collectives import metrics
    from distlab.sim.kernel.engine import simulate_collective
    out = []
    for r in log.rows:
        if r.bytes <= 0:
            continue
        trace, _ = simulate_collective(log.op, r.bytes, cluster, "auto", 0)
        sim = metrics(log.op, cluster.world_size, r.bytes, trace.makespan)["busbw_GBps"]
        out.append({"bytes": r.bytes, "measured_busbw_GBps": r.oop.busbw_GBps, "simulated_busbw_GBps": sim,
                    "error": (sim - r.oop.busbw_GBps) / r.oop.busbw_GBps if r.oop.busbw_GBps > 0 else None})
    return out


def regime_errors(rows: list[dict]) -> list[dict]:
    """Per regime (REGIMES): sizes, mean |error|, worst signed error; None where the log has no size there."""
    out = []
    for name, lo, hi in REGIMES:
        errs = [r["error"] for r in rows if lo <= r["bytes"] < hi and r["error"] is not None]
        out.append({"regime": name, "sizes": len(errs),
                    "mean_abs_error": float(np.mean(np.abs(errs))) if errs else None,
                    "worst_error": max(errs, key=abs) if errs else None})
    return out


def sized(cluster, log):
    """``cluster`` (a preset) with the log's nodes x ranks per node (one node of all ranks when unknown)."""
    from distlab.sim.cluster import validated
    per_host = set(log.ranks_per_host.values())
    if log.hosts and len(per_host) == 1:
        nodes, gpus = len(log.hosts), per_host.pop()
    else:
        nodes, gpus = 1, log.nranks
    if nodes > 1 and cluster.inter_node is None:
        nodes, gpus = 1, log.nranks
    return validated(replace(cluster, nodes=nodes, gpus_per_node=gpus), log.path)
