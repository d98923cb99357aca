"""Failures end the whole run within its timeout, name the rank, and leave no process behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from distlab.runtime.ranks.launch import Launch, RunFailed
from distlab.sim.plan import Collective, Plan

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def long_plan(n: int = 2, ops: int = 4000) -> Plan:
    return Plan([[Collective("all_reduce", 2**20) for _ in range(ops)] for _ in range(n)], name="long")


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_running(launch: Launch, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while launch.ready("running") < launch.nproc:
        assert time.monotonic() < end, "ranks did not start"
        assert all(p.poll() is None for p in launch.procs), "a rank died while starting"
        time.sleep(0.05)


def wait_completed(dumps, ops: int, nproc: int = 2, timeout: float = 60.0) -> None:
    """Until every rank's live flight ring in ``dumps`` (runtime/diagnosis/flight.py) shows ``ops`` collectives completed:
    the run is under way with that much measured (rather than a fixed sleep, long on an idle machine and maybe
    short on a loaded one)."""
    from distlab.runtime.diagnosis.flight_read import load_dir
    from distlab.sim.errors import ConfigError
    end = time.monotonic() + timeout
    while True:
        try:
            ranks = load_dir(str(dumps))["ranks"]
        except ConfigError:                       # no ring written yet
            ranks = {}
        done = [sum(r["state"] == "completed" for r in ranks[k]["records"]) if k in ranks else 0
                for k in range(nproc)]
        if min(done) >= ops:
            return
        assert time.monotonic() < end, f"completed collectives per rank: {done}"
        time.sleep(0.02)


def raising_task(ctx, payload):
    """Rank 1 raises; the others wait in a barrier for it."""
    import torch.distributed as dist
    if ctx.rank == 1:
        raise ValueError("boom on purpose")
    dist.barrier()


def rank_task(ctx, payload):
    return ctx.rank


def test_sigkill_of_one_rank_ends_the_run_naming_it_and_leaves_nothing():
    timeout = 20.0
    launch = Launch("distlab.runtime.execute.executor:plan_task", {"plan": long_plan().to_dict(), "warmup": 0, "repeat": 1}, 2,
                    timeout=timeout).start()
    try:
        wait_running(launch)
        time.sleep(0.3)                                   # mid-run
        t0 = time.monotonic()
        os.kill(launch.pids[1], signal.SIGKILL)
        with pytest.raises(RunFailed) as e:
            launch.wait()
        assert time.monotonic() - t0 < timeout
    finally:
        launch.stop()
    assert e.value.rank == 1
    assert "rank 1 died: killed by SIGKILL" in str(e.value)
    assert not any(alive(pid) for pid in launch.pids)


def test_a_rank_that_raises_is_named_with_its_error():
    t0 = time.monotonic()
    with pytest.raises(RunFailed) as e:
        Launch(f"{os.path.abspath(__file__)}:raising_task", {}, 2, timeout=15).start().wait()
    assert e.value.rank == 1
    assert "rank 1 failed: ValueError: boom on purpose" in str(e.value)
    assert time.monotonic() - t0 < 15 + 10


def test_a_rank_that_never_answers_ends_the_run_after_the_timeout():
    from distlab.sim.plan import Recv
    plan = Plan([[Collective("all_reduce", 1024)], [Recv(0, 1024)]], name="stuck")      # rank 0 never sends
    launch = Launch("distlab.runtime.execute.executor:plan_task", {"plan": plan.to_dict(), "warmup": 0, "repeat": 1}, 2,
                    timeout=3, check=False).start()                    # the static check would refuse it
    wait_running(launch)
    t0 = time.monotonic()
    with pytest.raises(RunFailed) as e:
        launch.wait()
    assert time.monotonic() - t0 < 3 + 10
    assert "Timed out" in str(e.value) or "timed out" in str(e.value)
    assert not any(alive(pid) for pid in launch.pids)


def _as_from_a_terminal():
    """Ctrl-C as a terminal delivers it: the child starts with SIGINT's default action (Python then raises
    KeyboardInterrupt). A process started with SIGINT ignored keeps ignoring it (POSIX: background jobs of a
    non-interactive shell), and the pytest worker may have inherited that: the launcher would then never see the
    Ctrl-C and the run would complete."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_cli(tmp_path):
    plan = tmp_path / "long.json"
    long_plan().save(str(plan))
    p = subprocess.Popen([sys.executable, "-m", "distlab.runtime.cli", "run", str(plan), "--nproc", "2", "--warmup", "0", "-v",
                          "--out", str(tmp_path / "t.trace"), "--dump-dir", str(tmp_path / "dumps")], cwd=ROOT,
                         stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, TMPDIR=str(tmp_path)),     # a killed launcher leaves its run dir here
                         preexec_fn=_as_from_a_terminal)
    pids = []
    while True:
        line = p.stderr.readline()
        assert line, "the launcher stopped before all ranks joined"
        if " pid " in line:
            pids.append(int(line.split()[-1]))
        if "ranks running" in line:
            return p, pids


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_reaps_every_rank(tmp_path, sig, capsys):
    p, pids = _start_cli(tmp_path)
    wait_completed(tmp_path / "dumps", 12)                          # mid-run, with ops measured to keep
    p.send_signal(getattr(signal, sig))
    rc = p.wait(timeout=30)
    p.stderr.close()
    assert rc == {"SIGINT": 130, "SIGTERM": 143}[sig]                 # 128 + the signal, as shells report it
    assert not any(alive(pid) for pid in pids)
    assert not [n for n in os.listdir(tmp_path) if n.startswith("distlab-run-")]     # the run folder is gone
    from cli_in_process import run_in_process     # not at the top: ranks load this file for its tasks
    rc, out, err = run_in_process(capsys, "diagnose", tmp_path / "dumps")            # a healthy run, stopped
    assert rc == 0, out + err
    assert out.startswith(f"interrupted by {sig}: the run was stopped, it did not hang"), out
    from distlab.sim.trace import Trace                            # what was measured before Ctrl-C is kept
    trace = Trace.from_json((tmp_path / "t.trace").read_text())
    assert trace.meta["complete"] is False and len(trace.ops) > 10
    assert {o.rank for o in trace.ops} == {0, 1}


def test_ranks_die_with_a_killed_launcher(tmp_path):
    p, pids = _start_cli(tmp_path)
    wait_completed(tmp_path / "dumps", 1)                           # mid-run
    p.kill()
    p.wait(timeout=10)
    p.stderr.close()
    end = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < end:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids)
    stale = [n for n in os.listdir(tmp_path) if n.startswith(f"distlab-run-{p.pid}-")]
    assert len(stale) == 1                                  # a SIGKILLed launcher cannot clean up; the next one does
    import tempfile
    from distlab.runtime.ranks import launch as L
    old, tempfile.tempdir = tempfile.tempdir, str(tmp_path)
    try:
        assert L.launch(f"{os.path.abspath(__file__)}:rank_task", {}, 2, timeout=20) == [0, 1]
    finally:
        tempfile.tempdir = old
    assert not [n for n in os.listdir(tmp_path) if n.startswith("distlab-run-")]
