"""The machine's load beside a measurement: load average, cores, and the CPU other processes use.

``sample(window)`` reads /proc twice, ``window`` seconds apart (Linux proc(5)):
- /proc/stat's first line ``cpu user nice system idle iowait irq softirq steal ...``: jiffies of all CPUs;
  their sum over the window is the CPU time that passed (cores x window x CLK_TCK);
- /proc/<pid>/stat fields 14 and 15 (utime, stime, clock ticks) of every process (the comm field, in
  parentheses, may hold spaces: fields are counted after its closing parenthesis); field 4 is the parent.
background cores = sum over other processes of d(utime + stime) / d(total jiffies / CPUs in /proc/stat): how
many cores' worth of CPU they used; ``background`` keeps each busy process's share (>= MIN_SHARE cores).
"Other" excludes this process and its descendants (our ranks), except ``count_pids`` (e.g. the benchmarks' own
load generator, which stands for someone else's work).

``available_cores(cores, background)`` = max(cores - background, cores / 2): the cores the other processes
leave idle (printed; a rough figure).

Processor sharing with the observed background (what the simulator is given): Linux's CFS gives every runnable
thread an equal share of the cores, and a thread that wants less (sleeps) keeps what it wants
(Documentation/scheduler/sched-design-CFS.rst): the max-min fair allocation (water-filling; Bertsekas &
Gallager, "Data Networks", 2nd ed. 1992, section 6.5.2). With autogroups (/proc/sys/kernel/
sched_autogroup_enabled = 1, the default of desktop kernels; sched(7) "The autogroup feature") the fairness is
first between sessions' groups, then between the threads of a group: our ranks (and the benchmarks' own load
generator, started from our session) share one group's part. Demands: a rank wants 1 core, a background
process the share it was seen using (over 1 core: ceil(share) threads of equal parts), a group the sum of its
threads'. fair_level(c, d) is the level L with sum_i min(d_i, L) = c (inf when every demand fits). Our group
gets g = min(D, L) of the cores among the groups (D: its demand), and a rank r(k) = min(1, fair_level(g, its
group's threads)); without autogroups every thread is its own group. A process held back while the machine was
full was seen using the level of then, a lower bound of its demand; but adding k >= 1 ranks only lowers the
level, so it still wants more than L and r(k) is unchanged (in a steady state; a reading is 0.25 s of a
machine whose load moves, so this is an estimate).
``effective_cores(k, alone)`` = min(k, k x r(k) / r(alone)): the ``cpu_cores`` a simulator that gives each of k
computing ranks min(1, c / k) of a core (sim/kernel/cores.py) needs so that they run at r(k) / r(alone) of the speed
their compute was timed at, ``alone`` ranks running then (pipeline probes: 1, each rank in turn; calibrate and
validate: all k at once, and the cluster's gpu is then the timed rate x r(1) / r(k)). Idle machine:
r(k) = min(1, cores / k), so c = min(k, cores), as without a background. With the benchmarks' one process
busy half a core on 2 cores: r(1) = 1, r(2) = 0.75, r(4) = 0.4, so c = 1.5 for 2 ranks and 1.6 for 4; on a
machine whose other processes fill both cores the cores left idle are ~0 but c stays near k x r(k) / r(1),
because the ranks' calibration ran under the same sharing.

Why /proc and not psutil (issue 44.4; psutil comes only with the dask extra, not as a dependency): on Linux
psutil reads these same files, one open per process per field, and has no autogroups, which the sharing rule
above needs. On macOS it would give the whole machine's CPU (host_statistics) but not every process's: another
user's process (root's daemons, Spotlight) answers AccessDenied to task_info without root, so "other processes'
CPU" would miss exactly the ones that load a laptop, and the CFS rule above is not macOS's scheduler anyway.
Off Linux ``sample`` returns None, the verdicts say the load was not measured, and runtime/ranks/portability.py
says so once when ranks are launched.
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
    background: tuple = ()          # cores' worth each busy other process used (>= MIN_SHARE), largest first
    groups: tuple | None = None     # the same shares by scheduling group (autogroup): our group's first (maybe
    #                                 empty), then one tuple per other group; None: no autogroups, one each

    def _groups(self):
        if self.groups is not None:
            return self.groups
        return None if self.background else ((), *((b,) for b in _split(self.background_cores)))

    def rate(self, k: int) -> float:
        """Cores' worth one of ``k`` runnable ranks gets (module docstring: r(k))."""
        return rank_share(self.cores, k, self.background, self._groups())

    def effective_cores(self, k: int, alone: int = 1) -> float:
        """The simulator's ``cpu_cores`` for ``k`` ranks whose compute was timed with ``alone`` ranks running."""
        return effective_cores(self.cores, k, self.background, alone, self._groups())

    @property
    def available_cores(self) -> float:
        return available_cores(self.cores, self.background_cores)

    def to_dict(self) -> dict:
        groups = None if self.groups is None else [list(g) for g in self.groups]
        return {**asdict(self), "background": list(self.background), "groups": groups,
                "available_cores": round(self.available_cores, 3)}

    def line(self, ranks: int | None = None) -> str:
        """One line; with ``ranks``, also the cores' worth those ranks get together under fair sharing."""
        busy = ", ".join(f"{b:.2f}" for b in self.background[:4]) + (", ..." if len(self.background) > 4 else "")
        share = (f"; {ranks} ranks get {ranks * self.rate(ranks):.2f} cores (fair share)" if ranks else "")
        return (f"load: average {self.loadavg_1m:.2f} on {self.cores} cores, other processes {self.background_cores:.2f} "
                f"cores over {self.window_s:g} s ({len(self.background)} busy: {busy or '-'}"
                + (f"; {len(self.groups) - 1} other groups" if self.groups is not None else "") + "), "
                f"{self.available_cores:.2f} cores idle for the ranks{share}")


def available_cores(cores: int, background: float) -> float:
    """max(cores - background, cores / 2) (module docstring)."""
    return max(cores - background, cores / 2)


MIN_SHARE = 0.03     # cores; a process using less counts as idle (one jiffy in a 0.25 s window on 2 CPUs: 0.02)


def _split(total: float) -> tuple:
    """A background known only by its total: whole busy cores and the rest (a reading without per-process shares)."""
    return tuple([1.0] * int(total) + ([total - int(total)] if total - int(total) >= MIN_SHARE else []))


def fair_level(cores: float, demands) -> float:
    """The water level L with sum min(d, L) = cores (inf when sum d <= cores): max-min fair share (docstring)."""
    d = sorted(float(x) for x in demands)
    left, count = float(cores), len(d)
    for i, x in enumerate(d):
        if x * (count - i) >= left:
            return left / (count - i)
        left -= x
    return float("inf")


def _threads(background) -> list[float]:
    """Background processes as threads: a share s > 1 is ceil(s) threads of s / ceil(s) each."""
    import math
    out = []
    for b in background:
        n = max(1, math.ceil(b - 1e-9))
        out += [b / n] * n
    return out


def rank_share(cores: float, k: int, background=(), groups=None) -> float:
    """r(k): the cores' worth one of ``k`` runnable ranks gets (docstring). ``groups``: (our group's other
    shares, then each other group's shares) with autogroups; None: every process of ``background`` alone."""
    if groups is None:
        return min(1.0, fair_level(cores, [1.0] * k + _threads(background)))
    ours = [1.0] * k + _threads(groups[0])
    demands = [min(sum(_threads(g)), cores) for g in groups[1:]]
    mine = min(sum(ours), fair_level(cores, [sum(ours)] + demands))
    return min(1.0, fair_level(mine, ours))


def effective_cores(cores: float, k: int, background=(), alone: int = 1, groups=None) -> float:
    """c = k x r(k) / r(alone), at most k (module docstring)."""
    return min(float(k), k * rank_share(cores, k, background, groups) / rank_share(cores, alone, background, groups))


def cpu_jiffies(proc: str) -> tuple[list[int], int]:
    """(the aggregate cpu line's jiffies: user, nice, system, idle, iowait, irq, softirq, steal, ...; the number
    of cpuN lines) of /proc/stat (proc(5))."""
    with open(os.path.join(proc, "stat")) as f:
        lines = f.read().splitlines()
    cpus = sum(1 for line in lines[1:] if line.startswith("cpu"))
    return [int(v) for v in lines[0].split()[1:]], max(cpus, 1)


def _total_jiffies(proc: str) -> tuple[int, int]:
    """(sum of the aggregate cpu line's jiffies, number of cpuN lines) of /proc/stat."""
    values, cpus = cpu_jiffies(proc)
    return sum(values), cpus


def _processes(proc: str, children: bool = False) -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, utime + stime ticks) of every readable /proc/<pid>/stat; ``children``: plus cutime +
    cstime, the time of its children that already ended (proc(5))."""
    last = 15 if children else 13
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
        out[int(name)] = (int(fields[1]), sum(int(x) for x in fields[11:last]))
    return out


def _descendants(procs: dict[int, tuple[int, int]], root: int) -> set[int]:
    mine, grew = {root}, True
    while grew:
        new = {pid for pid, (ppid, _) in procs.items() if ppid in mine and pid not in mine}
        mine |= new
        grew = bool(new)
    return mine


def busy_processes(before: tuple, after: tuple, own: int, count_pids=()) -> dict[int, float]:
    """pid -> the cores' worth of CPU it used between two readings ((total jiffies, cpus), {pid: (ppid,
    ticks)}), for every process but ``own`` and its descendants (``count_pids`` count) that used some."""
    (t0, cpus), p0 = before
    (t1, _), p1 = after
    elapsed = (t1 - t0) / cpus                 # jiffies of one CPU that passed
    if elapsed <= 0:
        return {}
    ours = _descendants(p1, own) - set(count_pids)
    used = {pid: max(ticks - p0[pid][1], 0) / elapsed for pid, (_, ticks) in p1.items() if pid in p0 and pid not in ours}
    return {pid: u for pid, u in used.items() if u > 0}


def background_shares(before: tuple, after: tuple, own: int, count_pids=()) -> list[float]:
    """The shares of busy_processes, largest first."""
    return sorted(busy_processes(before, after, own, count_pids).values(), reverse=True)


def autogroup(pid, proc: str = "/proc") -> str | None:
    """The scheduling group of a process ("/autogroup-N" of /proc/<pid>/autogroup), None without autogroups."""
    try:
        with open(os.path.join(proc, "sys/kernel/sched_autogroup_enabled")) as f:
            if f.read().strip() != "1":
                return None
        with open(os.path.join(proc, str(pid), "autogroup")) as f:
            return f.read().split()[0]
    except (OSError, IndexError):
        return None


def grouped(shares: dict[int, float], own: int, proc: str = "/proc") -> tuple | None:
    """(shares in ``own``'s autogroup, then one tuple per other autogroup), largest first; None without them."""
    mine = autogroup(own, proc)
    if mine is None:
        return None
    groups: dict = {}
    for pid, s in shares.items():
        groups.setdefault(autogroup(pid, proc) or f"pid{pid}", []).append(s)
    others = sorted((tuple(sorted(g, reverse=True)) for key, g in groups.items() if key != mine), key=sum, reverse=True)
    return (tuple(sorted(groups.get(mine, []), reverse=True)), *others)


def background_cores(before: tuple, after: tuple, own: int, count_pids=()) -> float:
    """The sum of background_shares: cores' worth of CPU the other processes used."""
    return sum(background_shares(before, after, own, count_pids))


def sample(window: float = 0.25, count_pids=(), proc: str = "/proc") -> Load | None:
    """The machine's load now (module docstring); None where /proc cannot be read (not Linux)."""
    from distlab.runtime.ranks.preflight import cpu_cores
    try:
        before = (_total_jiffies(proc), _processes(proc))
        time.sleep(window)
        after = (_total_jiffies(proc), _processes(proc))
        load = os.getloadavg()[0]
    except (OSError, ValueError, IndexError):
        return None
    cores = cpu_cores()
    shares = busy_processes(before, after, os.getpid(), count_pids)
    busy = {pid: round(min(s, cores), 3) for pid, s in shares.items() if s >= MIN_SHARE}
    return Load(round(load, 2), cores, round(min(sum(shares.values()), cores), 3), window,
                tuple(sorted(busy.values(), reverse=True)), grouped(busy, os.getpid(), proc))


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
            self.process = subprocess.Popen([sys.executable, "-c", "from distlab.runtime.measure.load import busy_loop; "
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
