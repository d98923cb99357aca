"""A cluster's ``calibration`` section (written by `distlab calibrate`, runtime/fit.py): look up the fitted ring
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
