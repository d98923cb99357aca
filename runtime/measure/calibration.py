"""Measure this machine's collectives and compute on real ranks, and turn the measurements into a cluster.

``measure``: one launch of ``n`` ranks running runtime/measure/sweep.py's ``sweep_task``: a size sweep of every op
(median times from launch: last rank's arrival to last rank's end, what the simulator's collective time means),
matmul FLOP/s with all ranks computing at once, and optionally a plan's results. ``write_cluster``: the ring
model fitted per op and world size (runtime/measure/fit.py) on the localhost-cpu preset sized to the largest world size,
``gpu`` = the measured compute, written atomically as a cluster YAML the simulator loads. Used by
`distlab calibrate` and `distlab validate` (runtime/commands/), which only parse arguments and format.
"""
from __future__ import annotations

import socket
import time


def measure(ops: list[str], sizes: list[int], n: int, warmup: int, iters: int, plan: dict | None = None,
            label: str = "calibrate", plan_first: bool = False, probe_seconds: float = 0.3,
            interference_rounds: int = 4, **launch_options) -> list[dict]:
    """Per rank: {"rows": the sweep's rows, "compute": rates, "plan": the plan payload's results or None}.
    ``plan`` is an executor payload ({"plan", "warmup", "repeat"}); ``launch_options`` go to runtime.ranks.launch.Launch
    (backend, threads, timeout, verbose). ``probe_seconds``: each compute rate probe's time, ``interference_rounds``:
    the interference probe's rounds (runtime/measure/sweep.py's measure_compute, runtime/measure/compute_probe.py). ``plan_first``: compute and the plan before the sweep (runtime/measure/sweep.py).
    Progress is shown per timed round. Calls shorter than
    runtime/measure/sweep.py's SHORT_S get up to MAX_REPEATS samples per round (their times scatter most)."""
    from distlab.runtime.measure.sweep import SHORT_S
    from distlab.runtime.ranks.torchrun_rank import new_launch    # Launch, or this rank's share under torchrun
    payload = {"ops": ops, "sizes": sizes, "warmup": warmup, "iters": iters, "compute": True, "plan": plan,
               "short_s": SHORT_S, "plan_first": plan_first,
               "probe_seconds": probe_seconds, "interference_rounds": interference_rounds}
    launch = new_launch("distlab.runtime.measure.sweep:sweep_task", payload, n, **launch_options).start()
    return launch.wait_progress(iters, f"{label}: {n} ranks", lambda L: (L.partial(0) or {}).get("rounds", 0))


def backend_of(compute: dict) -> str:
    """The backend a measurement ran on: the sweep times bfloat16 matmuls on GPUs (nccl), float32 on CPUs."""
    return "nccl" if compute["matmul_dtype"] == "bfloat16" else "gloo"


def write_cluster(path: str, rows: list[dict], compute: dict, nprocs: list[int], backend: str, sizes: list[int],
                  load=None):
    """Fit ``rows`` (runtime.measure.fit.calibration_from_rows), build the calibrated cluster for ``max(nprocs)`` ranks,
    with ``cpu_cores`` (the cores the CPU ranks share) for gloo, write it as YAML to ``path`` (atomically, with a
    header saying where and how it was measured, and the machine's ``load`` (runtime/measure/load.py) then: for gloo,
    ``cpu_cores`` = load.effective_cores(max(nprocs)), the cores fair sharing beside the other processes
    leaves the ranks, relative to one rank alone); the Cluster."""
    from distlab.runtime.measure.fit import calibrated_cluster, calibration_from_rows
    from distlab.sim.io import write_atomic
    from distlab.sim.plan import format_bytes
    from distlab.runtime.ranks.preflight import cpu_cores
    calibration = calibration_from_rows(rows)
    cores = (round(load.effective_cores(max(nprocs)), 2) if load else min(cpu_cores(), max(nprocs))) \
        if backend == "gloo" else None
    cores = int(cores) if cores is not None and float(cores).is_integer() else cores
    cluster = calibrated_cluster(calibration, compute, max(nprocs), backend, cores)
    head = (f"# written by distlab calibrate on {socket.gethostname()} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
            f"# backend {backend}, world sizes {','.join(map(str, nprocs))}, sizes {format_bytes(min(sizes))}.."
            f"{format_bytes(max(sizes))}; gpu = CPU matmul/copy speed per rank with {max(nprocs)} ranks running\n"
            + (f"# {load.line(max(nprocs))}\n" if load else "")
            + ("# interference: compute's slowdown while an all_reduce is in flight; comm_interference: the "
               "all_reduce's while every rank computes (runtime/measure/compute_probe.py, sim/kernel/cores.py)\n"
               if cluster.interference != 1 or cluster.comm_interference != 1 else ""))
    write_atomic(path, head + cluster.to_yaml())
    return cluster
