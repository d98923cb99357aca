"""Lesson 04, section 6: a real cluster's measurements against the simulator (issue 40), and its exercises.

    log = shipped_log()                       # the nccl-tests log of 2 x 8 H100 (tests/data/nccl_tests)
    log_table(log)                            # measured, preset and fitted busbw per size
    profile_table(compare_profile(...))       # measured against predicted per kind, from a torch.profiler trace

The data are the real files the tests use (tests/data/nccl_tests, tests/data/profiles; SOURCES.md beside them
says where each was published); the numbers come from sim/ingest, so the exercises' answers match what the
lesson shows.
"""
from __future__ import annotations

import os

from distlab.sim.lessons.checker import Exercise

LOG = "h100_2x8_gcp_a3mega_all_reduce.txt"
PROFILE = "hta_a100_2rank_nccl"
GiB = 1 << 30


def data_path(*parts: str) -> str:
    """tests/data/... of the repository distlab runs from (an editable install, or the current folder or the one
    above it: lessons/)."""
    import distlab.sim
    repo = os.path.dirname(os.path.dirname(os.path.abspath(distlab.sim.__file__)))
    for root in (repo, os.getcwd(), os.path.dirname(os.getcwd())):
        path = os.path.join(root, "tests", "data", *parts)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"tests/data/{'/'.join(parts)}: run the lesson from the repository (lessons/)")


def shipped_log(name: str = LOG):
    from distlab.sim.ingest.nccl_tests import load
    return load(data_path("nccl_tests", name))


def log_rows(log, preset: str = "dgx-h100") -> list[dict]:
    """Per size from 1 MiB: measured busbw, the preset's and the log's own fit's (sim/ingest/fit.py)."""
    from distlab.sim.cluster import PRESETS
    from distlab.sim.ingest.fit import busbw_rows, cluster_from_logs, sized
    on_preset = busbw_rows(log, sized(PRESETS[preset], log))
    fitted = busbw_rows(log, cluster_from_logs([log]))
    return [{"bytes": a["bytes"], "measured": a["measured_busbw_GBps"], "preset": a["simulated_busbw_GBps"],
             "fitted": b["simulated_busbw_GBps"]} for a, b in zip(on_preset, fitted) if a["bytes"] >= 1 << 20]


def log_table(log, preset: str = "dgx-h100"):
    from distlab.sim.lessons.helpers import Table
    from distlab.sim.plan import format_bytes
    return Table(["size", "measured busbw (GB/s)", f"{preset} preset", "error", "fitted to the log", "error"],
                 [[format_bytes(r["bytes"]), f"{r['measured']:.1f}", f"{r['preset']:.1f}",
                   f"{(r['preset'] - r['measured']) / r['measured'] * 100:+.0f}%", f"{r['fitted']:.1f}",
                   f"{(r['fitted'] - r['measured']) / r['measured'] * 100:+.1f}%"] for r in log_rows(log, preset)],
                 f"all_reduce on {log.nranks} x {log.devices[0]} ({len(log.hosts)} nodes): nccl-tests against "
                 "the simulator")


def profile_table(c: dict):
    """sim/ingest/versus.py compare_profile's result, one table: measured and predicted per kind, per rank."""
    from distlab.sim.lessons.helpers import Table
    keys = (("step", "step_s"), ("compute", "compute_s"), ("communication", "communication_s"),
            ("exposed communication", "exposed_communication_s"), ("idle", "idle_s"))
    rows = []
    for r in c["ranks"]:
        m, p = r["measured"], r["predicted"]
        rows += [[r["rank"], label, f"{m[k] * 1e3:.3f}", f"{p.get(k, 0) * 1e3:.3f}"] for label, k in keys]
        rows.append([r["rank"], "overlap", _pct(m.get("overlap")), _pct(p.get("overlap"))])
    return Table(["rank", "", "measured (ms)", "predicted (ms)"], rows, f"profiled step {c['step']}")


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


def _log_busbw_1gib() -> float:
    row = next(r for r in shipped_log().rows if r.bytes == GiB)
    n = shipped_log().nranks
    return row.bytes / (row.oop.time_us * 1e-6) / 1e9 * 2 * (n - 1) / n


def _preset_side() -> str:
    row = next(r for r in log_rows(shipped_log()) if r["bytes"] == GiB)
    return "higher" if row["preset"] > row["measured"] else "lower"


def _profile_overlap() -> float:
    from distlab.sim.ingest.kineto import breakdown, load_profile
    return breakdown(load_profile(data_path("profiles", PROFILE)).ranks[0])["comm_comp_overlap"] * 100


EXERCISES = (
    Exercise("04-log-busbw", "The real log (16 H100 on 2 nodes) measured an all_reduce of 1 GiB in 6759.0 µs "
             "(out of place). What bus bandwidth is that?", "GB/s", _log_busbw_1gib,
             hint="busbw = S / t x 2(n-1)/n for all_reduce (nccl-tests doc/PERFORMANCE.md), n = 16",
             why="the busbw column of the log: comparable across rank counts, so it is what presets are held to."),
    Exercise("04-preset-side", "Before the table: the dgx-h100 preset assumes one 400 Gb/s NDR NIC per GPU; this "
             "cluster (Google Cloud A3 Mega) has 200 Gb/s NICs. At 1 GiB, is the preset's busbw higher or lower "
             "than measured?", "choice", _preset_side, choices=("higher", "lower"),
             hint="the slower link bounds the ring between the two nodes",
             why="a preset describes one system; another system's log calibrates its own cluster file "
                 "(distlab calibrate --from-nccl-tests), which reproduces it within a few percent."),
    Exercise("04-hta-overlap", "In the real DDP trace (rank 0 of 2 A100), NCCL kernels ran 24.278 ms in the "
             "profiled steps, 3.473 ms of it while a compute kernel ran. What overlap does HolisticTraceAnalysis "
             "report?", "%", _profile_overlap, tolerance=0.01,
             hint="overlap = time communication and computation both run / communication time",
             why="the rest, about 85%, is exposed communication: the GPU waits for the all-reduce."),
)
