"""The 'your machine' exercises of lessons 02, 04, 05, 06 and 07 (issue 21): each asks for a prediction made before
the real run, from lesson 04's fit (``fitted_cluster()``: work/localhost-calibrated.yaml, written by `distlab
calibrate`, else the uncalibrated localhost-cpu preset), and checks it against the run within 25%
(``prediction=True``: check(ID, my_prediction, row=...) after the run; unanswered, it says what was measured)."""
from __future__ import annotations

from distlab.sim.lessons.checker import Exercise


def _measured_busbw(row: dict) -> float:
    """busbw of a bench row (runtime/measure/sweep.py): algbw x the op's bus factor (sim.collectives.metrics)."""
    from distlab.sim.collectives import metrics
    return metrics(row["op"], row["world_size"], row["bytes"], row["time_s"])["busbw_GBps"]


def _measured_ms(row: dict) -> float:
    return row["measured_s"] * 1e3


EXERCISES = (
    Exercise("02-your-busbw", "Before the bench, from lesson 04's fit or the localhost-cpu preset "
             "(fitted_cluster()): predict the busbw of a 4 MiB all_reduce on your 2 local ranks (pass row=... "
             "after the bench). Within 25%.", "GB/s", _measured_busbw, needs=("row",), tolerance=0.25,
             prediction=True, hint="simulate_sweep('all_reduce', [4 * MiB], fitted_cluster())[0]['busbw_GBps']",
             why="on CPU ranks the 'link' is memory copies and loopback TCP through the kernel; a fit of your own "
                 "machine (lesson 04) predicts it better than a preset measured on another."),
    Exercise("04-your-prediction", "Before you see it measured, from your own fit (the α per step and B of "
             "all_reduce on 2 ranks): predict a held-out all_reduce of 2 MiB, steps·α + factor·S/B (pass case=... "
             "after the error table). Within 25%.", "ms", lambda case: case["measured_s"] * 1e3, needs=("case",),
             tolerance=0.25, prediction=True, hint="2 ranks: 2(n-1) = 2 steps of α, factor 2(n-1)/n = 1",
             why="the measurement is the time from launch, what the fit was made of; the error table shows how "
                 "far each held-out size landed."),
    Exercise("05-your-prediction", "Before the real run, from lesson 04's fit (fitted_cluster()): predict the "
             "measured DDP step of CPU_DDP_MODEL on 2 ranks at bucket_cap_mb=2 (pass row=... after the run). "
             "Within 25%.", "ms", _measured_ms, needs=("row",), tolerance=0.25, prediction=True,
             hint="simulate(scenario(CPU_DDP_MODEL, 'ddp', cluster=fitted_cluster(), bucket_cap_mb=2))"
                  "['summary']['step_s']",
             why="the fit of lesson 04 carried over to a new workload: the point of calibrating."),
    Exercise("06-your-prediction", "Before the real run, from lesson 04's fit (fitted_cluster()): predict the "
             "measured FSDP2 step of CPU_FSDP_MODEL on 2 ranks with reshard_after_forward=True (pass row=... after "
             "the run). Within 25%.", "ms", _measured_ms, needs=("row",), tolerance=0.25, prediction=True,
             hint="simulate(scenario(CPU_FSDP_MODEL, 'fsdp', cluster=fitted_cluster()))['summary']['step_s']; "
                  "gloo blocks in each collective, so on CPU add compute and communication rather than overlap",
             why="the same fit predicts a workload it never saw, to within the noise of a shared machine."),
    Exercise("07-your-prediction", "Before the real run, from lesson 04's fit (fitted_cluster()): predict the "
             "measured 1F1B step of CPU_PIPE_MODEL (8 x Linear(512, 512), 512 rows) on 2 stages with 8 microbatches "
             "(pass row=... after the run). Within 25%.", "ms", _measured_ms, needs=("row",), tolerance=0.25,
             prediction=True, hint="simulate(scenario(CPU_PIPE_MODEL, 'pipeline', cluster=fitted_cluster(), "
                                   "stages=2, microbatches=8, schedule='1f1b'))['summary']['step_s']",
             why="the fit knows the matmul speed and the link, not the runtime's own time per action: compare "
                 "with the calibrated prediction of the same launch, which measures that too."),
)
