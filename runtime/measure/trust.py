"""Is a measurement trustworthy? The machine's load before and during it, and the spread of each case's repeats.

    watch = Watch()                              # before the ranks start
    ... measure ...
    verdict = judge(before, watch.stop(), cases) # {"trustworthy": False, "reasons": ["other processes used ..."]}
    print_verdict(verdict); return verdict_exit_code(verdict, strict=True)   # 1 under --strict

A timing on CPU ranks measures the machine as much as the model: when other processes take cores, or a case's
repeats scatter more than the accuracy it is judged by, a prediction error is not an error of the model. So
`distlab validate`, `bench`, `calibrate` and the accuracy benchmarks read the load before the ranks start
(runtime/measure/load.py ``sample``: 0.25 s) and during the whole measurement (``Watch``: /proc read at its start and
end), and say, with the reason, when the result is not trustworthy:

- other processes used more than BACKGROUND_LIMIT of the machine's cores, before or during the measurement
  (during: all CPU time of /proc/stat's busy jiffies minus this process tree's own, ``utime + stime + cutime +
  cstime`` of every live descendant (proc(5)): processes that start or end meanwhile are counted too);
- a case's noise, the standard error of the median of its repeats (runtime/measure/robust.py ``median_noise``:
  1.2533 x the robust sigma / sqrt(repeats)), is larger than both its error and its tolerance (the accuracy
  claimed for its kind, TOLERANCE): the median moves by chance more than anything the case could show about the
  model. (The range of the repeats, ``spread``, grows with their number and is printed, not judged.)
- a case that computes (the overlap plan) missed its tolerance while running more CPU ranks than the machine
  has cores: the ranks take turns in the scheduler's time slices (CFS), which the simulator's processor
  sharing, a fluid model, leaves out.

Under ``--strict`` an untrustworthy result exits 1 (results are still printed and written).
"""
from __future__ import annotations

import os
import time

BACKGROUND_LIMIT = 0.10      # other processes may use at most this share of the cores (0.2 of 2 cores)
TOLERANCE = {"overlap plan": 0.15, "held-out size": 0.25, "held-out world size": 0.25,    # per case kind
             "calibration fit": 0.15}         # runtime/measure/fit.py fit_warnings' limit on a fit's robust CV
DEFAULT_TOLERANCE = 0.25
WORLD_TOLERANCE = {("overlap plan", 3): 0.25}     # ranks outnumber the 2 cores: the accuracy claimed is looser
COMPUTING_KINDS = ("overlap plan",)               # cases whose ranks compute on CPU cores beside their collectives


def _busy_and_total(proc: str) -> tuple[int, int, int]:
    """(busy jiffies, all jiffies, CPUs) of /proc/stat: busy = user + nice + system + irq + softirq + steal."""
    from distlab.runtime.measure.load import cpu_jiffies
    v, cpus = cpu_jiffies(proc)
    return v[0] + v[1] + v[2] + sum(v[5:8]), sum(v[:8]), cpus


def _tree_ticks(proc: str, root: int) -> int:
    """utime + stime + cutime + cstime of ``root`` and every live descendant: the CPU this process tree has
    used, children that already ended included (their time is in their parent's cutime, cstime)."""
    from distlab.runtime.measure.load import _descendants, _processes
    procs = _processes(proc, children=True)
    return sum(procs[pid][1] for pid in _descendants(procs, root) if pid in procs)


PR_SET_CHILD_SUBREAPER = 36       # prctl(2)


def _adopt_orphans(on: bool) -> bool:
    """Make this process (``on``) the reaper of the descendants its children leave behind (prctl(2)
    PR_SET_CHILD_SUBREAPER, Linux): they stay in this process tree, and their CPU counts as ours."""
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _reap_orphans(proc: str) -> None:
    """Wait for the ended processes adopted by _adopt_orphans (zombies whose parent is this process), which no
    subprocess.Popen of ours waits for."""
    from distlab.runtime.measure.load import _processes
    for pid, (ppid, _) in _processes(proc).items():
        if ppid == os.getpid():
            try:
                with open(os.path.join(proc, str(pid), "stat")) as f:
                    zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
                if zombie:
                    os.waitpid(pid, os.WNOHANG)
            except (OSError, IndexError):
                pass


class Watch:
    """The other processes' CPU over a measurement: ``Watch()`` at its start, ``stop()`` at its end returns
    {"background_cores", "cores", "window_s", "loadavg_1m"} (None where /proc cannot be read).
    ``adopt_orphans``: for a script whose children start processes that outlive them (a `distlab validate`
    subprocess's fork server ends a moment after it, and so does the CPU of the ranks it forked): this process
    adopts them until ``stop`` (_adopt_orphans), else their CPU would count as the other processes'."""

    def __init__(self, proc: str = "/proc", adopt_orphans: bool = False):
        self.proc, self.start = proc, None
        self.adopted = adopt_orphans and _adopt_orphans(True)
        try:
            self.start = (_busy_and_total(proc), _tree_ticks(proc, os.getpid()), time.monotonic())
        except (OSError, ValueError, IndexError):
            pass

    def stop(self) -> dict | None:
        try:
            return self._stop()
        finally:
            if self.adopted:
                _adopt_orphans(False)
                _reap_orphans(self.proc)

    def _stop(self) -> dict | None:
        if self.start is None:
            return None
        try:
            (b1, t1, cpus), ours1, now = _busy_and_total(self.proc), _tree_ticks(self.proc, os.getpid()), \
                time.monotonic()
            load = os.getloadavg()[0]
        except (OSError, ValueError, IndexError):
            return None
        (b0, t0, _), ours0, then = self.start
        elapsed = (t1 - t0) / cpus                 # jiffies of one CPU that passed
        other = max(0.0, ((b1 - b0) - (ours1 - ours0)) / elapsed) if elapsed > 0 else 0.0
        from distlab.runtime.ranks.preflight import cpu_cores
        return {"background_cores": round(min(other, cpus), 3), "cores": cpu_cores(), "window_s": round(now - then, 2),
                "loadavg_1m": round(load, 2)}


def tolerance(kind: str, world_size=None) -> float:
    return WORLD_TOLERANCE.get((kind, world_size), TOLERANCE.get(kind, DEFAULT_TOLERANCE))


def case_doubt(c: dict, cores: int | None = None) -> str | None:
    """Why one case's figure says nothing about the model, or None: its noise (the median's standard error from
    its repeats, runtime/measure/robust.py ``median_noise``) beats both its error and its tolerance (a case without
    an error, as bench's rows: its tolerance), or it missed its tolerance computing on more CPU ranks than
    ``cores``."""
    limit = tolerance(c.get("kind", ""), c.get("world_size"))
    if cores is not None and c.get("kind") in COMPUTING_KINDS and c.get("world_size", 0) > cores \
            and abs(c.get("error", 0.0)) > limit:
        return (f"{c.get('case', '')} on {c['world_size']} ranks: its {c['error']:+.0%} is beyond its tolerance "
                f"({limit:.0%}) with more ranks than the {cores} cores: they take turns on them in the scheduler's "
                "time slices, which the simulator's processor sharing (a fluid model, sim/kernel/cores.py) does "
                "not capture")
    noise = c.get("noise")
    if noise is None:
        return None
    error = abs(c["error"]) if "error" in c else None
    if noise > max(error or 0.0, limit):
        than = f"its error ({error:.0%}) and its tolerance ({limit:.0%})" if error is not None else f"{limit:.0%}"
        return (f"{c.get('case', '')} on {c.get('world_size')} ranks: its median moves ±{noise:.0%} by chance "
                f"(its repeats spread {c.get('spread', 0):.0%}), more than {than}")
    return None


def judge(before, during: dict | None, cases: list[dict] = (), limit: float = BACKGROUND_LIMIT,
          cores: int | None = None) -> dict:
    """{"trustworthy", "reasons", "background_limit_cores", "load_before", "load_during", "doubtful_cases"}:
    ``before`` a runtime/measure/load.py Load (or its dict, or None), ``during`` Watch.stop()'s dict; every case found
    doubtful (``case_doubt``; ``cores``: the CPU cores the ranks ran on, None for GPU ranks) gets ``trusted:
    False`` and its ``doubt``."""
    reasons = []
    before = before.to_dict() if hasattr(before, "to_dict") else before
    for when, reading in (("before", before), ("during", during)):
        if not reading:
            continue
        allowed = limit * reading["cores"]
        if reading["background_cores"] > allowed:
            reasons.append(f"other processes used {reading['background_cores']:.2f} of {reading['cores']} cores "
                           f"{when} the measurement (allowed: {allowed:.2f}, {limit:.0%}); its times include "
                           "waiting for them")
    doubtful = []
    for c in cases:
        why = case_doubt(c, cores)
        c["trusted"] = why is None
        if why:
            c["doubt"] = why
            doubtful.append(why)
    reasons += doubtful
    return {"trustworthy": not reasons, "reasons": reasons, "background_limit_share": limit,
            "load_before": before, "load_during": during, "doubtful_cases": len(doubtful)}


def verdict_lines(verdict: dict, what: str = "result") -> list[str]:
    """'trustworthy: ...' or 'NOT TRUSTWORTHY: reason' lines (the first few reasons, and how many more)."""
    during = verdict.get("load_during")
    seen = (f"other processes used {during['background_cores']:.2f} of {during['cores']} cores during the "
            f"{during['window_s']:g} s measurement" if during else "load during the measurement unknown")
    if verdict["trustworthy"]:
        return [f"trustworthy: {seen}; every case's spread within its error or tolerance"]
    lines = [f"NOT TRUSTWORTHY: this {what} measures the machine's noise, not the model ({seen})"]
    lines += [f"  - {r}" for r in verdict["reasons"][:4]]
    if len(verdict["reasons"]) > 4:
        lines.append(f"  - and {len(verdict['reasons']) - 4} more (--json lists them)")
    lines.append("  re-run on idle cores (other processes stopped), or with more repeats")
    return lines


def exit_code(verdict: dict, strict: bool) -> int:
    """1 for an untrustworthy result under --strict, else 0."""
    return 1 if strict and not verdict["trustworthy"] else 0
