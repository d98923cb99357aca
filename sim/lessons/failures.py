"""Lesson 12 (when things fail at scale): published failure figures, tables, the goodput figure, exercises.

Llama 3 (Llama Team, AI @ Meta, "The Llama 3 Herd of Models", arXiv:2407.21783, 2024, section 3.3.4 and
Table 5): in a 54-day snapshot of Llama 3 405B pre-training on 16,384 H100 GPUs there were 466 job
interruptions, 47 planned and 419 unexpected; 148 of the unexpected (30.1%) were faulty GPUs and 72 (17.2%)
GPU HBM3 memory; the team kept more than 90% effective training time. The same section: checkpoints save each
GPU's model state, 1 MB to 4 GB per GPU; the Tectonic storage sustains 2 TB/s (7 TB/s peak).
"""
from __future__ import annotations

from distlab.sim import resilience
from distlab.sim.lessons.exercises import Exercise, register
from distlab.sim.lessons.helpers import Figure, Table

LLAMA3 = {"days": 54, "gpus": 16384, "interruptions": 466, "planned": 47, "unexpected": 419,
          "faulty_gpu": 148, "hbm3": 72, "storage_sustained_Bps": 2e12, "storage_peak_Bps": 7e12}
DAY = 86400.0


def llama3_mtbf_s() -> float:
    """The job's mean time between unexpected interruptions: 54 days / 419."""
    return LLAMA3["days"] * DAY / LLAMA3["unexpected"]


def llama3_gpu_mtbf_s() -> float:
    """Per GPU, if every interruption were one GPU's (an upper bound on its failure rate): M x 16,384."""
    return llama3_mtbf_s() * LLAMA3["gpus"]


def failures_table() -> Table:
    """Llama 3's 54 days in numbers, and what they mean for jobs of other sizes (same per-GPU rate)."""
    rows = []
    for gpus in (8, 1024, 16384, 100_000):
        m = resilience.job_mtbf_s(llama3_gpu_mtbf_s(), gpus)
        rows.append([f"{gpus:,}", f"{m / 3600:,.1f}", f"{54 * DAY / m:,.1f}"])
    return Table(["GPUs in the job", "MTBF (hours)", "failures in 54 days"], rows,
                 "Llama 3 405B: 419 unexpected interruptions in 54 days on 16,384 H100 (arXiv:2407.21783, Table 5)")


def checkpoint_table(state_bytes: float, gpus=(128, 512, 2048, 16384), rank_Bps: float = 2e9,
                     storage_Bps: float = LLAMA3["storage_sustained_Bps"]) -> Table:
    """Write time of one sharded checkpoint as the job grows: ranks-bound, then storage-bound."""
    rows = []
    for n in gpus:
        c = resilience.CheckpointCost(state_bytes, n, rank_Bps, storage_Bps)
        bound = "ranks" if n * rank_Bps < storage_Bps else "storage"
        rows.append([f"{n:,}", f"{state_bytes / n / 2**20:,.0f} MiB", f"{c.write_time_s:.2f} s", bound])
    return Table(["ranks", "per rank", "write time", "limited by"], rows,
                 f"checkpoint of {state_bytes / 1e12:.2f} TB, {rank_Bps / 1e9:g} GB/s per rank, storage "
                 f"{storage_Bps / 1e12:g} TB/s")


def elastic_table(summary: dict) -> Table:
    """What runtime.elastic measured: the failure, where it resumed, lost work and restart time."""
    rows = [[f["rank"], f["step"], f["last_checkpoint_step"], f["lost_steps"], f"{f['lost_work_s'] * 1e3:.0f} ms",
             f"{f['restart_s']:.2f} s" if f["restart_s"] is not None else "-"] for f in summary["failures"]]
    ck = summary["checkpoint_time_s"]
    title = (f"{summary['steps']} steps, {summary['attempts']} attempts, {summary['checkpoints']} checkpoints "
             f"of {summary['checkpoint_bytes']:,} B (median write {sorted(ck)[len(ck) // 2] * 1e3:.0f} ms)"
             if ck else "")
    return Table(["killed rank", "at step", "resumed from", "whole steps lost", "work lost", "restart"], rows, title)


def plot_goodput(curve: resilience.GoodputCurve, unit: str = "min", title: str | None = None) -> Figure:
    """sim.resilience's goodput figure, shown inline."""
    f = Figure(7.5, 4.2)
    resilience.draw_goodput(f.ax, curve, unit, title)
    return f


register(
    Exercise("12-mtbf", "Llama 3 405B: 419 unexpected interruptions in a 54-day snapshot. What is the job's mean "
             "time between failures, in minutes?", "min", lambda: llama3_mtbf_s() / 60, tolerance=0.02,
             hint="54 days in minutes, divided by the number of failures",
             why="54 x 24 x 60 / 419 = 186 min: one interruption every 3.1 hours."),
    Exercise("12-scale", "Same GPUs, same per-GPU failure rate, but a job on 1,024 GPUs instead of 16,384: its "
             "MTBF in minutes?", "min", lambda: resilience.job_mtbf_s(llama3_gpu_mtbf_s(), 1024) / 60,
             tolerance=0.02, hint="any one GPU's failure stops the job: MTBF = per-GPU MTBF / GPUs",
             why="16x fewer GPUs, 16x longer between failures: about 49.5 hours."),
    Exercise("12-write", "A checkpoint of 5.67 TB (405B parameters x 14 bytes: bf16 weights, fp32 master "
             "weights, Adam's two moments), written sharded by 16,384 ranks at 2 GB/s each to storage that "
             "sustains 2 TB/s: how long does one checkpoint take, in s?", "s",
             lambda: resilience.CheckpointCost(405e9 * 14, 16384, 2e9, 2e12).write_time_s, tolerance=0.02,
             hint="the ranks could write 32.8 TB/s together; what does the storage take?",
             why="min(16,384 x 2 GB/s, 2 TB/s) = 2 TB/s: 5.67 TB / 2 TB/s = 2.8 s. The storage, not the ranks, "
                 "is the limit at this scale."),
    Exercise("12-resume", "Checkpoints every 2 steps, a rank is killed as step 5 (of 10) begins, torchrun "
             "--max-restarts 1: from which step's checkpoint does the restarted group resume?", "count",
             lambda: 4, tolerance=0, hint="the last checkpoint completed before the failure",
             why="steps 2 and 4 were saved; step 5 is run again from the state after step 4."),
    Exercise("12-young", "Checkpoint cost 120 s, job MTBF 3 hours: Young's optimal checkpoint interval, in "
             "minutes?", "min", lambda: resilience.young_interval(120.0, 3 * 3600.0) / 60, tolerance=0.02,
             hint="sqrt(2 x checkpoint cost x MTBF), in seconds first",
             why="sqrt(2 x 120 x 10,800) = 1,610 s = 26.8 min (Daly's higher-order estimate: 25.5 min)."),
    Exercise("12-goodput", "Same job (checkpoint 120 s, MTBF 3 h, restart 10 min), checkpointing every 26.8 "
             "minutes: what fraction of the wall time is useful work, in %?", "%",
             lambda: 100 * resilience.expected_goodput(resilience.young_interval(120.0, 10800.0), 120.0, 10800.0,
                                                       600.0), tolerance=0.01, abs_tolerance=0.5,
             hint="roughly 1 - delta/tau - tau/(2M) - R/M: checkpoints, lost work, restarts",
             why="about 81%: 7% goes to writing checkpoints, 7% to redoing lost work, 5% to restarts."),
)
