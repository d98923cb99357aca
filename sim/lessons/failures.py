"""Lesson 12 (when things fail at scale): published failure figures, tables, the goodput figure, exercises.

Llama 3: Llama Team, AI @ Meta, "The Llama 3 Herd of Models", arXiv:2407.21783 (checked against the text of the
PDF dated July 23, 2024). Section 3.3.4 ("Reliability and Operational Challenges"): "During a 54-day snapshot
period of pre-training, we experienced a total of 466 job interruptions. Of these, 47 were planned ... The
remaining 419 were unexpected interruptions, which are classified in Table 5"; about 78% of the unexpected ones
were attributed to confirmed or suspected hardware issues, GPU issues were "58.7% of all unexpected issues",
significant manual intervention was needed only three times, and the effective training time was "higher than
90%". Table 5 ("Root-cause categorization of unexpected interruptions during a 54-day period of Llama 3 405B
pre-training") is ``LLAMA3_TABLE5``, counts and percentages as printed. Every printed share is count / 419 but
one: "Faulty GPU", 148 interruptions, printed 30.1% where 148 / 419 = 35.3% (the counts add up to 419, the printed
shares to 94.9%); the text's 58.7% for GPU issues is the sum of the GPU rows' printed shares, while their
counts, 268, are 64.0% of 419. The GPU count of the snapshot is not stated: section 3.3.1 says Llama 3
405B "is trained on up to 16K H100 GPUs" and Table 4's 16K stages use 16,384; we take 16,384. Section 3.3.1
(Storage): checkpoints save "each GPU's model state, ranging from 1 MB to 4 GB per GPU"; the Tectonic storage
fabric "supports a sustainable throughput of 2 TB/s and a peak throughput of 7 TB/s".
"""
from __future__ import annotations

import math

from distlab.sim import resilience
from distlab.sim.lessons.checker import Exercise
from distlab.sim.lessons.helpers import Figure, Table

LLAMA3 = {"days": 54, "gpus": 16384, "interruptions": 466, "planned": 47, "unexpected": 419,
          "faulty_gpu": 148, "hbm3": 72, "storage_sustained_Bps": 2e12, "storage_peak_Bps": 7e12}
DAY = 86400.0
# Table 5 of arXiv:2407.21783 as printed: (component, category, interruptions, % of interruptions)
LLAMA3_TABLE5 = (
    ("Faulty GPU", "GPU", 148, 30.1), ("GPU HBM3 Memory", "GPU", 72, 17.2), ("Software Bug", "Dependency", 54, 12.9),
    ("Network Switch/Cable", "Network", 35, 8.4), ("Host Maintenance", "Unplanned Maintenance", 32, 7.6),
    ("GPU SRAM Memory", "GPU", 19, 4.5), ("GPU System Processor", "GPU", 17, 4.1), ("NIC", "Host", 7, 1.7),
    ("NCCL Watchdog Timeouts", "Unknown", 7, 1.7), ("Silent Data Corruption", "GPU", 6, 1.4),
    ("GPU Thermal Interface + Sensor", "GPU", 6, 1.4), ("SSD", "Host", 3, 0.7), ("Power Supply", "Host", 3, 0.7),
    ("Server Chassis", "Host", 2, 0.5), ("IO Expansion Board", "Host", 2, 0.5), ("Dependency", "Dependency", 2, 0.5),
    ("CPU", "Host", 2, 0.5), ("System Memory", "Host", 2, 0.5))


# The lesson's elastic run (runtime/restart/elastic.py TrainSpec): 10 steps, a DCP checkpoint every 4, rank 1 killed as
# step 7 begins, one restart allowed.
ELASTIC = {"steps": 10, "checkpoint_every": 4, "kill_rank": 1, "kill_step": 7}


def llama3_mtbf_s() -> float:
    """The job's mean time between unexpected interruptions: 54 days / 419."""
    return LLAMA3["days"] * DAY / LLAMA3["unexpected"]


def llama3_gpu_mtbf_s() -> float:
    """Per GPU, if every interruption were one GPU's (an upper bound on its failure rate): M x 16,384."""
    return llama3_mtbf_s() * LLAMA3["gpus"]


def better_gpus_mtbf_ratio() -> float:
    """How many times longer the 16,384-GPU job's MTBF gets if every GPU row of Table 5 fails half as often:
    rates in series add, so 419 / (419 - GPU rows / 2)."""
    gpu = sum(count for _, category, count, _ in LLAMA3_TABLE5 if category == "GPU")
    return LLAMA3["unexpected"] / (LLAMA3["unexpected"] - gpu / 2)


def quiet_day_share_pct(gpus: int = 1024, window_s: float = DAY) -> float:
    """The share (%) of ``window_s`` stretches a job of ``gpus`` GPUs at Llama 3's per-GPU rate runs without a
    failure: a Poisson process of mean ``resilience.job_mtbf_s`` leaves a window empty with exp(-window / M)."""
    return 100 * math.exp(-window_s / resilience.job_mtbf_s(llama3_gpu_mtbf_s(), gpus))


def restart_or_lost(summary: dict) -> str:
    """Which cost the measured elastic run (runtime/restart/elastic.py summarize) more: "restart" or "lost work"."""
    f = summary["failures"][0]
    return "restart" if (f["restart_s"] or 0.0) > f["lost_work_s"] else "lost work"


def failures_table() -> Table:
    """Llama 3's 54 days in numbers, and what they mean for jobs of other sizes (same per-GPU rate)."""
    rows = []
    for gpus in (8, 1024, 16384, 100_000):
        m = resilience.job_mtbf_s(llama3_gpu_mtbf_s(), gpus)
        rows.append([f"{gpus:,}", f"{m / 3600:,.1f}", f"{54 * DAY / m:,.1f}"])
    return Table(["GPUs in the job", "MTBF (hours)", "failures in 54 days"], rows,
                 "Llama 3 405B: 419 unexpected interruptions in 54 days on 16,384 H100 (arXiv:2407.21783, Table 5)")


def table5() -> Table:
    """Llama 3's Table 5 by category: interruptions, the paper's printed share, and count / 419."""
    by = {}
    for _, category, count, pct in LLAMA3_TABLE5:
        c, p = by.get(category, (0, 0.0))
        by[category] = (c + count, p + pct)
    rows = [[cat, c, f"{p:.1f}", f"{100 * c / LLAMA3['unexpected']:.1f}"]
            for cat, (c, p) in sorted(by.items(), key=lambda kv: -kv[1][0])]
    return Table(["category", "interruptions", "paper's % (as printed)", "count / 419 (%)"], rows,
                 "root causes of the 419 unexpected interruptions (arXiv:2407.21783, Table 5; its 'Faulty GPU' "
                 "row prints 30.1% for 148 of 419)")


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
    """What runtime.restart.elastic measured: the failure, where it resumed, lost work and restart time."""
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


EXERCISES = (
    Exercise("12-better-gpus", "Llama 3 405B's job on 16,384 GPUs, but on a GPU that fails half as often (every "
             "GPU row of Table 5 halved, the hosts, network and software as before): predict how many times longer "
             "its mean time between failures gets.", "x", better_gpus_mtbf_ratio, tolerance=0.02,
             traps=lambda: {2.0: "only the GPU rows halve: the other failures keep coming at their old rate"},
             hint="failure rates in series add: the job's rate is the sum of its components' rates. Section 1 "
                  "gives the GPU rows' share of the 419 in counts",
             why="the 268 GPU interruptions become 134, the other 151 stay: 419 / 285 = 1.47x, not 2x. Halving the "
                 "largest cause buys less than it seems, because every other cause is still there."),
    Exercise("12-quiet-day", "The same GPUs at the same per-GPU rate, failures at random moments (a Poisson "
             "process), but a job of 1,024 GPUs instead of 16,384: predict the share of its 24-hour days that pass "
             "without a single interruption, in %.", "%", quiet_day_share_pct, tolerance=0.03,
             traps=lambda: {100 * (1 - DAY / (16 * llama3_mtbf_s())): "that treats a day as holding at most one "
                            "failure; at random, some days have two or three"},
             hint="first the job's MTBF M (one GPU's failure stops the job: 16x fewer GPUs, 16x longer), then the "
                  "chance that a Poisson process of mean M leaves a day empty: exp(-24 h / M)",
             why="M = 16 x 3.09 h = 49.5 h; exp(-24 / 49.5) = 62% of days are quiet, not 1 - 24/49.5 = 52%: the "
                 "failures of the other days sometimes come two or three at once. On 16,384 GPUs: 0.04%."),
    Exercise("12-write", "A checkpoint of 5.67 TB (405B parameters x 14 bytes: bf16 weights, fp32 master "
             "weights, Adam's two moments), written sharded by 16,384 ranks at 2 GB/s each to storage that "
             "sustains 2 TB/s: how long does one checkpoint take, in s?", "s",
             lambda: resilience.CheckpointCost(405e9 * 14, 16384, 2e9, 2e12).write_time_s, tolerance=0.02,
             hint="the ranks could write 32.8 TB/s together; what does the storage take?",
             why="min(16,384 x 2 GB/s, 2 TB/s) = 2 TB/s: 5.67 TB / 2 TB/s = 2.8 s. The storage, not the ranks, "
                 "is the limit at this scale."),
    Exercise("12-restart-or-lost", f"Predict before the run: checkpoints every {ELASTIC['checkpoint_every']} "
             f"steps, rank 1 killed as step {ELASTIC['kill_step']} (of {ELASTIC['steps']}) begins, torchrun "
             "--max-restarts 1. Which costs more wall time: the lost work (the completed steps since the last "
             "checkpoint, run again) or the restart (from the failure to the resumed training)?", "choice",
             restart_or_lost, choices=("lost work", "restart"), needs=("summary",), prediction=True,
             hint="count what a restart does: torchrun's agent notices the dead rank, stops the other, starts two "
                  "new processes (each imports torch), a new rendezvous, then both load the checkpoint. The lost "
                  "steps are a tiny model's",
             why="the restart: seconds of process start, imports and rendezvous against milliseconds of two steps "
                 "of a small model (the table's 'work lost' and 'restart'). At Llama 3's scale the work lost "
                 "grows with the checkpoint interval, which is what Young's formula below trades against "
                 "the cost of checkpointing more often."),
    Exercise("12-young", "Checkpoint cost 120 s, job MTBF 3 hours: Young's optimal checkpoint interval, in "
             "minutes?", "min", lambda: resilience.young_interval(120.0, 3 * 3600.0) / 60, tolerance=0.02,
             hint="sqrt(2 x checkpoint cost x MTBF), in seconds first",
             why="sqrt(2 x 120 x 10,800) = 1,610 s = 26.8 min (Daly's higher-order estimate: 25.5 min)."),
    Exercise("12-goodput", "Same job (checkpoint 120 s, MTBF 3 h, restart 10 min), checkpointing at Young's "
             "interval (the previous exercise): what fraction of the wall time is useful work, in %?", "%",
             lambda: 100 * resilience.expected_goodput(resilience.young_interval(120.0, 10800.0), 120.0, 10800.0,
                                                       600.0), tolerance=0.01, abs_tolerance=0.5,
             hint="roughly 1 - delta/tau - tau/(2M) - R/M: checkpoints, lost work, restarts",
             why="about 81%: 7% goes to writing checkpoints, 7% to redoing lost work, 5% to restarts."),
)
