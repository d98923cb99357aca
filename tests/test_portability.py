"""Off Linux (a student's macOS laptop): what the runtime leans on from Linux is guarded, and said once at start-up
(runtime/ranks/portability.py). Checked here on Linux by pretending: sys.platform patched, Linux-only functions
removed, /proc pointed at a folder that is not there. All in-process, no ranks started."""
from __future__ import annotations

import io
import os
import sys

import pytest

from distlab.runtime.measure import load, trust
from distlab.runtime.ranks import forkserver, portability, preflight, worker


@pytest.fixture
def macos(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(portability, "_said", set())


def test_linux_has_nothing_to_say(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(portability, "_said", set())
    assert portability.limits() == []
    assert not portability.say_limits_once(io.StringIO())


def test_macos_says_what_differs_once_within_100_columns(macos):
    out = io.StringIO()
    assert portability.say_limits_once(out)
    assert not portability.say_limits_once(out)                     # once per process
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("distlab on macOS") and len(lines) == 4
    assert all(len(line) <= 100 for line in lines)
    assert "new process" in out.getvalue() and "not measured" in out.getvalue()


def test_windows_says_real_runs_need_wsl(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    lines = portability.limits()
    assert "WSL" in lines[0] and all(len(line) <= 100 for line in lines)


def test_macos_ranks_start_as_new_processes(macos):
    assert not forkserver.enabled()


@pytest.mark.parametrize("names, expected", [([(1, "lo"), (2, "eth0")], "lo"), ([(1, "lo0"), (4, "en0")], "lo0"),
                                             ([(2, "en0")], None)])
def test_loopback_interface_by_its_name_on_each_os(monkeypatch, names, expected):
    monkeypatch.setattr(portability.socket, "if_nameindex", lambda: names)
    assert portability.loopback_interface() == expected


def test_loopback_interface_none_where_interfaces_cannot_be_listed(monkeypatch):
    def refuse():
        raise OSError("no interfaces")
    monkeypatch.setattr(portability.socket, "if_nameindex", refuse)
    assert portability.loopback_interface() is None


def test_cores_without_sched_getaffinity(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert preflight.cpu_cores() == 8


def test_no_proc_means_load_unknown_and_memory_check_skipped(tmp_path, monkeypatch):
    missing = str(tmp_path / "no-proc")
    assert load.sample(0.0, proc=missing) is None
    assert trust.Watch(proc=missing).stop() is None
    read = preflight.mem_available
    monkeypatch.setattr(preflight, "mem_available", lambda: read(os.path.join(missing, "meminfo")))
    assert preflight.mem_available() is None
    preflight.check_fits({"params": 10**15}, 4, "the plan", "--nproc", "use fewer ranks")     # skipped: no raise
    verdict = trust.judge(None, None)
    assert "load during the measurement unknown" in trust.verdict_lines(verdict)[0]


def test_orphans_not_adopted_without_prctl(macos, monkeypatch):
    import ctypes

    class NoPrctl:
        def __init__(self, *a, **k):
            pass
    monkeypatch.setattr(ctypes, "CDLL", NoPrctl)             # macOS's libc has no prctl: AttributeError
    assert trust._adopt_orphans(True) is False


def test_rank_polls_its_parent_where_there_is_no_pdeathsig(macos, monkeypatch):
    """No prctl: a thread watches the parent; once the rank is re-parented it ends (os._exit), as the kernel's
    PR_SET_PDEATHSIG would have ended it on Linux."""
    parents = iter([100, 100, 1])                              # the launcher, then launchd after it died
    monkeypatch.setattr(worker.os, "getppid", lambda: next(parents))
    monkeypatch.setattr(worker.time, "sleep", lambda s: None)

    def exit_(code):
        raise SystemExit(code)
    monkeypatch.setattr(worker.os, "_exit", exit_)
    with pytest.raises(SystemExit) as ended:
        worker._poll_parent(100, period=0)
    assert ended.value.code == 1


def test_die_with_parent_starts_the_poller_off_linux(macos, monkeypatch):
    started = []
    monkeypatch.setattr(worker.threading, "Thread",
                        lambda target, args, daemon, name: type("T", (), {"start": lambda self: started.append(
                            (target, args, daemon))})())
    worker._die_with_parent(os.getppid())
    assert started == [(worker._poll_parent, (os.getppid(),), True)]


def test_simulator_workers_spawn_on_macos(macos):
    """The simulator's local workers (sim/workers.py) and the planner's parallel search fork on Linux only."""
    from distlab.sim import workers
    assert not workers.can_fork()
