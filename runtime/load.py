"""The machine's load beside a measurement: load average, cores, and the CPU other processes use.

``sample(window)`` reads /proc twice, ``window`` seconds apart (Linux proc(5)):
- /proc/stat's first line ``cpu user nice system idle iowait irq softirq steal ...``: jiffies of all CPUs;
  their sum over the window is the CPU time that passed (cores x window x CLK_TCK);
- /proc/<pid>/stat fields 14 and 15 (utime, stime, clock ticks) of every process (the comm field, in
  parentheses, may hold spaces: fields are counted after its closing parenthesis); field 4 is the parent.
background cores = sum over other processes of d(utime + stime) / d(total jiffies / CPUs in /proc/stat): how
many cores' worth of CPU they used. "Other" excludes this process and its descendants (our ranks), except
``count_pids`` (e.g. the benchmarks' own load generator, which stands for someone else's work).

``available_cores(cores, background)`` = max(cores - background, cores / 2): the cores left to the ranks under
processor sharing (sim/cores.py). The floor: a fair scheduler gives k >= cores runnable ranks at least
cores x k / (k + b) >= cores / 2 of the machine while the background demand b <= cores.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass


@dataclass
class Load:
    """One reading: 1-minute load average, cores we may use, cores' worth of CPU other processes used."""
    loadavg_1m: float
    cores: int
    background_cores: float
    window_s: float

    @property
    def available_cores(self) -> float:
        return available_cores(self.cores, self.background_cores)

    def to_dict(self) -> dict:
        return {**asdict(self), "available_cores": round(self.available_cores, 3)}

    def line(self) -> str:
        return (f"load: average {self.loadavg_1m:.2f} on {self.cores} cores, other processes {self.background_cores:.2f} "
                f"cores over {self.window_s:g} s, {self.available_cores:.2f} cores left to the ranks")


def available_cores(cores: int, background: float) -> float:
    """max(cores - background, cores / 2) (module docstring)."""
    return max(cores - background, cores / 2)


def _total_jiffies(proc: str) -> tuple[int, int]:
    """(sum of the aggregate cpu line's jiffies, number of cpuN lines) of /proc/stat."""
    with open(os.path.join(proc, "stat")) as f:
        lines = f.read().splitlines()
    total = sum(int(v) for v in lines[0].split()[1:])
    cpus = sum(1 for line in lines[1:] if line.startswith("cpu"))
    return total, max(cpus, 1)


def _processes(proc: str) -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, utime + stime ticks) of every readable /proc/<pid>/stat."""
    out = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc, name, "stat")) as f:
                text = f.read()
        except OSError:                        # ended meanwhile
            continue
        fields = text[text.rindex(")") + 2:].split()      # fields from 3 (state) on
        out[int(name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return out


def _descendants(procs: dict[int, tuple[int, int]], root: int) -> set[int]:
    mine, grew = {root}, True
    while grew:
        new = {pid for pid, (ppid, _) in procs.items() if ppid in mine and pid not in mine}
        mine |= new
        grew = bool(new)
    return mine


def background_cores(before: tuple, after: tuple, own: int, count_pids=()) -> float:
    """Cores' worth of CPU that processes other than ``own`` and its descendants (but with ``count_pids``)
    used between two readings ((total jiffies, cpus), {pid: (ppid, ticks)})."""
    (t0, cpus), p0 = before
    (t1, _), p1 = after
    elapsed = (t1 - t0) / cpus                 # jiffies of one CPU that passed
    if elapsed <= 0:
        return 0.0
    ours = _descendants(p1, own) - set(count_pids)
    used = sum(max(ticks - p0[pid][1], 0) for pid, (_, ticks) in p1.items() if pid in p0 and pid not in ours)
    return used / elapsed


def sample(window: float = 0.25, count_pids=(), proc: str = "/proc") -> Load | None:
    """The machine's load now (module docstring); None where /proc cannot be read (not Linux)."""
    from distlab.runtime.preflight import cpu_cores
    try:
        before = (_total_jiffies(proc), _processes(proc))
        time.sleep(window)
        after = (_total_jiffies(proc), _processes(proc))
        load = os.getloadavg()[0]
    except (OSError, ValueError, IndexError):
        return None
    cores = cpu_cores()
    return Load(round(load, 2), cores, round(min(background_cores(before, after, os.getpid(), count_pids), cores), 3),
                window)


def busy_loop(duty: float, period: float = 0.05) -> None:
    """Burn ``duty`` of one core until killed: busy for duty x period, asleep for the rest (a load generator)."""
    while True:
        end = time.perf_counter() + duty * period
        while time.perf_counter() < end:
            pass
        time.sleep((1 - duty) * period)


class BackgroundLoad:
    """``with BackgroundLoad(0.5) as gen:`` one process busy ``duty`` of one core, stopped at the end, always
    (also on an exception). ``gen.pid`` for ``sample(count_pids=...)``; duty 0 starts nothing."""

    def __init__(self, duty: float):
        self.duty, self.process = duty, None

    @property
    def pids(self) -> list[int]:
        return [self.process.pid] if self.process else []

    def __enter__(self):
        if self.duty > 0:
            import subprocess
            import sys
            self.process = subprocess.Popen([sys.executable, "-c", "from distlab.runtime.load import busy_loop; "
                                             f"busy_loop({min(self.duty, 1.0)!r})"])
        return self

    def __exit__(self, *exc):
        if self.process:
            self.process.terminate()
            try:
                self.process.wait(5)
            except Exception:
                self.process.kill()
                self.process.wait()
        return False
