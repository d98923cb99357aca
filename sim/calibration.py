"""A cluster's ``calibration`` section (written by `distlab calibrate`, runtime/measure/fit.py): look up the fitted ring
model of a collective for a group size and a message size.

Format: ``calibration.collectives[op][str(n)]`` = {latency_us, bandwidth_GBps} (one α-β line for all sizes),
optionally with ``bands``: [{min_bytes, max_bytes, latency_us, bandwidth_GBps}, ...] in size order, one α-β
line per size band where one line does not fit every calibrated size (e.g. a CPU's caches: small messages
faster per byte than large ones). Files without ``bands`` read as before.

Lookup of size S: inside a band [min_bytes, max_bytes] (or below the first, above the last), that band's line;
in the gap between band i and band i+1 (no calibrated size there) the time is interpolated in log S between
the two lines, t = (1 - w) t_i(S) + w t_{i+1}(S) with w = log(S / max_i) / log(min_{i+1} / max_i); since
t = steps α + f S / B is linear in α and 1 / B, that is α = (1 - w) α_i + w α_{i+1} and
1 / B = (1 - w) / B_i + w / B_{i+1}. Between calibrated group sizes n, α and B are interpolated linearly in n
(the nearest calibrated n outside their range).
"""
from __future__ import annotations

import math

import numpy as np

from distlab.sim.errors import ConfigError


def line_for(entry: dict, nbytes: float | None) -> tuple[float, float]:
    """(latency_us, bandwidth_GBps) of one group size's entry for a message of ``nbytes``."""
    bands = entry.get("bands") if nbytes is not None else None
    if not bands:
        return float(entry["latency_us"]), float(entry["bandwidth_GBps"])
    for i, b in enumerate(bands):
        if nbytes <= b["max_bytes"] or i == len(bands) - 1:
            if i == 0 or nbytes >= b["min_bytes"]:
                return float(b["latency_us"]), float(b["bandwidth_GBps"])
            lo = bands[i - 1]                         # in the gap between two bands
            w = math.log(nbytes / lo["max_bytes"]) / math.log(b["min_bytes"] / lo["max_bytes"])
            lat = (1 - w) * lo["latency_us"] + w * b["latency_us"]
            inv = (1 - w) / lo["bandwidth_GBps"] + w / b["bandwidth_GBps"]
            return float(lat), float(1 / inv)
    raise AssertionError("unreachable")


def calibrated(calibration: dict | None, op: str, n: int, nbytes: float | None = None) -> tuple[float, float] | None:
    """(α seconds, bandwidth bytes/s) for ``op`` at group size ``n`` and message size ``nbytes``, or None when
    the calibration has no entry for ``op``."""
    table = (calibration or {}).get("collectives", {}).get(op)
    if not table:
        return None
    points = sorted((int(k), line_for(v, nbytes)) for k, v in table.items())
    ns = [k for k, _ in points]
    lat = float(np.interp(n, ns, [v[0] for _, v in points])) * 1e-6
    bw = float(np.interp(n, ns, [v[1] for _, v in points])) * 1e9
    return lat, bw


def check_calibration(calibration: dict, where: str) -> None:
    """The ``collectives`` table as the lookup above reads it: group sizes as whole numbers, finite latency_us >= 0
    and bandwidth_GBps > 0, bands in size order (an op name distlab does not know is never looked up). Other keys
    are the calibration's notes."""
    table = calibration.get("collectives", {})
    if not isinstance(table, dict):
        raise ConfigError("must map each collective to its fitted lines (written by distlab calibrate)",
                          f"{where}.collectives")
    for op, sizes in table.items():
        at = f"{where}.collectives.{op}"
        if not isinstance(sizes, dict) or not sizes:
            raise ConfigError("must map group sizes (e.g. '8') to {latency_us, bandwidth_GBps}", at)
        for n, entry in sizes.items():
            if not str(n).isdigit() or not 1 <= int(n) <= 1 << 20:
                raise ConfigError(f"group size {n!r} must be a whole number from 1 to {1 << 20}", at)
            _check_line(entry, f"{at}.{n}")
            bands = entry.get("bands")
            if bands is None:
                continue
            if not isinstance(bands, list) or not bands:
                raise ConfigError("bands must be a non-empty list", f"{at}.{n}.bands")
            last = -1.0
            for i, b in enumerate(bands):
                _check_line(b, f"{at}.{n}.bands[{i}]")
                lo, hi = b.get("min_bytes"), b.get("max_bytes")
                if not (_finite(lo) and _finite(hi) and 0 < lo <= hi and lo > last):
                    raise ConfigError("min_bytes and max_bytes must be sizes > 0, min <= max, bands in size order",
                                      f"{at}.{n}.bands[{i}]")
                last = hi


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_line(entry, where: str) -> None:
    if not isinstance(entry, dict):
        raise ConfigError("must be {latency_us, bandwidth_GBps}", where)
    lat, bw = entry.get("latency_us"), entry.get("bandwidth_GBps")
    if not (_finite(lat) and 0 <= lat <= 1e9 and _finite(bw) and 0 < bw <= 1e9):
        raise ConfigError(f"latency_us ({lat!r}) must be a number >= 0 and bandwidth_GBps ({bw!r}) a number > 0",
                          where)
