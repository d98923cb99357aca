"""Benchmarks that run each case in a process of its own pinned to one core (sim_scale.py, cluster_scale.py): the
measurement both share.

    # the parent (main): one child per case, each row printed as it comes
    row = run_child(__file__, "--one", name)        # the dict the child printed as its last line
    # the child (``--one``): pin first, measure, then print json.dumps({..., **usage()})
    pin_to_one_core()

``usage()`` reads the child's own resource usage: CPU seconds (user + system: what the wall time is on an idle
core, the figure a target is checked on where the machine is shared), peak memory (the peak resident set,
resource.getrusage ru_maxrss, KiB on Linux) and the machine's 1-minute load average when it ran.
"""
import json
import os
import resource
import subprocess
import sys


def pin_to_one_core() -> None:
    """Run this process on one core (the lowest it may use) where the system allows it."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def usage() -> dict:
    """This process's CPU seconds and peak memory so far, and the load average."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return {"cpu_s": round(r.ru_utime + r.ru_stime, 3), "peak_MiB": round(r.ru_maxrss / 1024, 1),
            "load_1min": round(os.getloadavg()[0], 2)}


def run_child(script: str, *args: str) -> dict:
    """``python SCRIPT ARGS`` in a fresh process: the JSON object it printed on its last line."""
    out = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def finish(rows: list[dict]) -> int:
    """The end of a benchmark's main: every row as JSON with ``--json``; exit code 0 when every row is ``ok``."""
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=2))
    return 0 if all(r["ok"] for r in rows) else 1
