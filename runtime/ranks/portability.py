"""What a real run gets off Linux (a student's macOS laptop), said once when ranks are first launched.

    for line in limits(): print(line)      # [] on Linux; on macOS what is slower or not measured, and why
    env["GLOO_SOCKET_IFNAME"] = loopback_interface()      # "lo" (Linux) or "lo0" (macOS)

The simulator, the lessons and `distlab run` on gloo run on macOS; what they lean on from Linux:
- the fork server (runtime/ranks/forkserver.py: fork after importing torch, /proc): off, so each rank starts as
  a new process (about 1.5 s of CPU importing torch, every launch);
- prctl(PR_SET_PDEATHSIG) (a rank dies with its launcher, even when the launcher is SIGKILLed): a rank's
  thread polls its parent instead (runtime/ranks/worker.py ``_die_with_parent``), so it ends within a second;
- /proc/stat, /proc/PID/stat and prctl(PR_SET_CHILD_SUBREAPER) (runtime/measure/load.py, trust.py: how much
  CPU other processes use): not read, so a verdict judges each case's spread only, and the simulator's
  ``cpu_cores`` is all cores (runtime/measure/load.py says why psutil does not fill this in);
- /proc/meminfo MemAvailable (runtime/ranks/preflight.py): the memory check before launch is skipped;
- os.sched_getaffinity: the cores are os.cpu_count() (preflight.cpu_cores).
Windows has neither fork, process groups nor os.killpg: real runs need Linux or macOS (WSL on Windows).

Gloo picks the address of its connections by resolving the host's name unless GLOO_SOCKET_IFNAME names an
interface (ProcessGroupGloo's default device; pytorch/pytorch#8664). A macOS laptop's name is an mDNS
``.local`` name that may resolve to its Wi-Fi address, or to nothing: the ranks of a local run are pinned to the
loopback interface, whatever the OS calls it (``socket.if_nameindex``), so nothing of the run leaves the machine.
"""
from __future__ import annotations

import socket
import sys

_said: set = set()


def linux() -> bool:
    return sys.platform.startswith("linux")


def loopback_interface() -> str | None:
    """The loopback interface's name ("lo" on Linux, "lo0" on macOS and the BSDs), None if none is found."""
    try:
        names = {name for _, name in socket.if_nameindex()}
    except (OSError, AttributeError):
        return None
    return next((name for name in ("lo", "lo0") if name in names), None)


def limits() -> list[str]:
    """What a real run on this OS does not do as on Linux, one line each (within 100 columns); [] on Linux."""
    if linux():
        return []
    if sys.platform.startswith("win"):
        return ["distlab on Windows: real runs need fork and process groups (use WSL); the simulator and",
                "  the lessons' simulated parts work here"]
    name = "macOS" if sys.platform == "darwin" else sys.platform
    return [f"distlab on {name} (real runs are built for Linux; here they work, with these differences):",
            "  - each rank starts as a new process (no fork server): about 1.5 s of CPU per rank",
            "  - other processes' CPU is not measured (no /proc): trust verdicts judge repeats only",
            "  - the memory check before launch is skipped (no /proc/meminfo)"]


def say_limits_once(stream=None) -> bool:
    """Print ``limits()`` on stderr once per process (the first launch); True if anything was printed."""
    lines = limits()
    if not lines or _said:
        return False
    _said.add(True)
    print("\n".join(lines), file=stream or sys.stderr)
    return True
