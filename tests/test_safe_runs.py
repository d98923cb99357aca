"""Issue 32, items 3-7: a run's files on a shared machine and a full disk. A planted symbolic link is refused and
nothing outside the folder changes; a second run on the same --out refuses; a full or read-only disk is one line
that says where the result was kept; a stuck compute op ends within --timeout; the fork server's death is named;
validate --scenario works without --nproc. (SIGTERM's exit code 143: tests/test_runtime_launch.py.)"""
from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from distlab.runtime.cli import main
from distlab.sim.plan import Collective, Compute, Plan


def cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def one_rank(seconds: float, path) -> str:
    Plan([[Compute(seconds=seconds, name="forever" if seconds > 1e6 else "work"), Collective("all_reduce", 64)]],
         name="one").save(str(path))
    return str(path)


@pytest.fixture
def kept_here(tmp_path, monkeypatch):
    """Results kept after a disk fault go to tmp_path (pytest removes it), not the session's temp folder."""
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def kept_file(err: str) -> str:
    return err.split("the result is kept in ")[1].strip()


def test_a_planted_link_in_the_dump_dir_is_refused_and_nothing_outside_changes(tmp_path, monkeypatch):
    """Before: open(flight.R.ring, "wb") followed a link planted in a shared --dump-dir and overwrote its target."""
    from distlab.runtime.ranks import forkserver
    victim, shared = tmp_path / "victim", tmp_path / "shared"
    victim.write_text("precious\n")
    shared.mkdir()
    (shared / "flight.0.ring").symlink_to(victim)
    monkeypatch.setattr(forkserver, "spawn", lambda *a: pytest.fail("a rank was started"))
    code, _, err = cli(["run", one_rank(0.01, tmp_path / "p.json"), "--dump-dir", shared, "--out", tmp_path / "m.trace"])
    assert code == 2 and err.count("\n") == 1 and "flight.0.ring is a symbolic link" in err, err
    assert victim.read_text() == "precious\n" and os.path.islink(shared / "flight.0.ring")
    assert sorted(os.listdir(shared)) == ["flight.0.ring"] and not (tmp_path / "m.trace").exists()
    from distlab.runtime.diagnosis.flight import open_ring                # a rank under torchrun opens its ring the same way
    with pytest.raises(Exception, match="never through a symbolic link"):
        open_ring(str(shared / "flight.0.ring"), 1 << 17)
    assert victim.read_text() == "precious\n"


def test_a_second_run_on_the_same_dump_dir_refuses_and_leaves_the_first_ones_records(tmp_path, monkeypatch):
    """Before: a second run with the same --dump-dir cleared the first's live flight records. Here the first run's
    lock is held (as its launcher holds it) and its record is there: the second refuses in one line, starts no
    rank, and leaves the folder as it was."""
    from distlab.runtime.ranks import forkserver
    from distlab.sim.io import OutputLock
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "flight.0.json").write_text("{}")
    monkeypatch.setattr(forkserver, "spawn", lambda *a: pytest.fail("a rank was started"))
    with OutputLock(str(shared), "--dump-dir", folder=True):
        before = sorted(os.listdir(shared))
        code, _, err = cli(["run", one_rank(0.01, tmp_path / "p.json"), "--dump-dir", shared, "--out",
                            tmp_path / "m.trace"])
        assert code == 2 and err.count("\n") == 1, err
        assert f"--dump-dir: another distlab run (pid {os.getpid()}) is writing {shared}" in err
        assert sorted(os.listdir(shared)) == before and (shared / "flight.0.json").read_text() == "{}"
    assert not (tmp_path / "m.trace").exists() and os.listdir(shared) == ["flight.0.json"]


def test_a_full_disk_for_the_flight_ring_is_one_line_before_any_rank_starts(tmp_path, monkeypatch):
    """Before: the ring was a sparse file written through mmap; on a full disk every rank died of SIGBUS."""
    from distlab.runtime.ranks import forkserver

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "posix_fallocate", full)
    monkeypatch.setattr(forkserver, "spawn", lambda *a: pytest.fail("a rank was started"))
    code, _, err = cli(["run", one_rank(0.01, tmp_path / "p.json"), "--out", tmp_path / "m.trace"])
    assert code == 1 and err.count("\n") == 1, err
    assert "flight.0.ring: cannot allocate the 128 KiB flight ring (No space left on device)" in err, err


@pytest.mark.parametrize("fault", [errno.ENOSPC, errno.EROFS])
def test_a_disk_fault_at_the_final_write_keeps_the_result_and_says_where(fault, tmp_path, kept_here, monkeypatch):
    """Before: an OSError traceback after the whole run, the result lost. Injected at the rename of the final write
    (a read-only remount mid-run fails there; a full disk at the write or the fsync)."""
    from distlab.sim import files
    out = tmp_path / "c.json"

    def refuse(src, dst, **dir_fds):
        raise OSError(fault, os.strerror(fault))
    monkeypatch.setattr(files.os, "replace", refuse)
    code, _, err = cli(["collective", "all_reduce", "--size", "4KiB", "--trace", out])
    assert code == 1 and err.count("\n") == 1 and f"cannot write {out}: {os.strerror(fault)}" in err, err
    kept = kept_file(err)
    assert os.path.dirname(kept).startswith(str(kept_here / "distlab-kept-"))
    assert json.loads(open(kept).read())["traceEvents"] and oct(os.stat(kept).st_mode & 0o777) == "0o600"
    assert not out.exists() and [n for n in os.listdir(tmp_path) if ".tmp-" in n] == []


def test_write_atomic_replaces_a_planted_link_and_fsyncs(tmp_path, monkeypatch):
    from distlab.sim import files
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "out.json").symlink_to(victim)
    synced = []
    real = os.fsync
    monkeypatch.setattr(files.os, "fsync", lambda fd: synced.append(fd) or real(fd))
    files.write_atomic(str(tmp_path / "out.json"), "{}")
    assert victim.read_text() == "precious\n" and not os.path.islink(tmp_path / "out.json")
    assert (tmp_path / "out.json").read_text() == "{}" and len(synced) == 2          # the file, then its folder


# The launcher of the first run below: its disk fills up as the Perfetto trace is made durable. fsync reports
# ENOSPC, as ext4 with delayed allocation and NFS do when the blocks are finally wanted (write(2) may have
# succeeded into the page cache); every other file writes as usual.
FULL_DISK_AT_M_JSON = """
import errno, os, sys
real_fsync = os.fsync
def fsync(fd):
    if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(".m.json.tmp-"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return real_fsync(fd)
os.fsync = fsync
from distlab.runtime.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_second_run_on_the_same_out_refuses_and_a_full_disk_keeps_the_measurement(tmp_path):
    """Two runs with the same --out: the second refuses in one line (before: it cleared and removed the first's live
    flight records). The disk fills up while the first writes its Perfetto trace: that result is kept, the one
    line says where (before: an OSError traceback after the whole run), and nothing half written is left."""
    plan = one_rank(1.5, tmp_path / "p.json")        # long enough for the second, refused at once, to find it
    out, full = tmp_path / "m.trace", tmp_path / "m.json"
    first = subprocess.Popen([sys.executable, "-c", FULL_DISK_AT_M_JSON, "run", plan, "--out", out, "--perfetto",
                              full, "--backend", "gloo", "-v"], stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, TMPDIR=str(tmp_path)))
    lines = []
    for line in first.stderr:                        # wait until its rank runs
        lines.append(line)
        if "ranks running" in line:
            break
    code, _, err = cli(["run", plan, "--out", out, "--backend", "gloo"])
    assert code == 2 and err.count("\n") == 1, err
    assert f"--out: another distlab run (pid {first.pid}) is writing {out}" in err
    rest = first.stderr.read()
    first.wait(timeout=120)
    assert first.returncode == 1, rest
    (line,) = [ln for ln in rest.splitlines() if "error" in ln]
    assert f"cannot write {full}: No space left on device; the result is kept in {tmp_path}" in line, rest
    from distlab.sim.compare import from_chrome
    from distlab.sim.trace import Trace
    kept = from_chrome(json.loads(open(kept_file(line)).read()))
    assert {o.name for o in kept.ops} == {"work", "all_reduce"} == {o.name for o in Trace.from_json(out.read_text()).ops}
    assert not os.path.lexists(full) and not os.path.exists(tmp_path / ".m.trace.lock")
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".m.json.tmp-")]          # nothing half written


class Stamped(io.StringIO):
    """stderr that notes when each piece was written."""

    def __init__(self):
        super().__init__()
        self.stamps: list[tuple[float, str]] = []

    def write(self, text):
        self.stamps.append((time.monotonic(), text))
        return super().write(text)


@pytest.mark.slow
def test_a_stuck_compute_op_ends_within_the_timeout_naming_the_rank_and_the_op(tmp_path):
    """Before: a Compute op of seconds: 1e12 under --timeout 10 still ran after 45 s (only collectives had one).
    Timed from the moment the rank began its work (-v: "ranks running"), not from the fork server's start."""
    timeout = 2.0
    err = Stamped()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(["run", one_rank(1e12, tmp_path / "p.json"), "--out", str(tmp_path / "m.trace"), "--backend",
                   "gloo", "--timeout", str(timeout), "-v"])
    end = time.monotonic()
    (running,) = [t for t, text in err.stamps if "ranks running" in text]
    err = err.getvalue()
    assert rc == 1 and end - running < timeout + 10, (end - running, err)
    assert ("error: watchdog: rank 0 timed out: more than 2 s (--timeout) in op 0, compute 'forever' on stream "
            "'compute'; the rank was ended") in err
    flight = json.loads((tmp_path / "m.flight" / "flight.0.json").read_text())
    assert flight["reason"].startswith("watchdog: rank 0")


@pytest.mark.slow
def test_the_fork_servers_death_is_named_as_such(tmp_path):
    """Before: a killed fork server was reported as "rank 0 died" (its ranks die with it)."""
    from distlab.runtime.ranks import forkserver
    from distlab.runtime.ranks.launch import Launch, RunFailed
    plan = Plan([[Compute(seconds=60.0)]], name="long")
    launch = Launch("distlab.runtime.execute.executor:plan_task", {"plan": plan.to_dict(), "warmup": 0, "repeat": 1}, 1,
                    backend="gloo").start()

    def kill():
        while launch.ready("running") < 1:
            time.sleep(0.05)
        os.kill(forkserver.server_pid(), signal.SIGKILL)
    threading.Thread(target=kill, daemon=True).start()
    with pytest.raises(RunFailed) as e:
        launch.wait()
    assert str(e.value).startswith("the fork server (pid ") and "died (killed by SIGKILL)" in str(e.value)
    assert "rank 0 died" not in str(e.value)


def test_validate_a_scenario_without_nproc_does_not_crash(monkeypatch):
    """Before: ValueError: int('None') (getattr(args, "nproc", 2) when --nproc is left out)."""
    from distlab.runtime.ranks import launch

    class Started(Exception):
        pass

    def start(self):
        assert self.nproc == 2
        raise Started
    monkeypatch.setattr(launch.Launch, "start", start)
    scenario = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scenarios", "ddp-cpu.yaml")
    with pytest.raises(Started):
        main(["validate", "--scenario", scenario])



def test_the_elastic_tool_says_in_one_line_that_its_dir_cannot_be_made(tmp_path, capsys):
    """Before: a --dir whose parent is missing was a FileNotFoundError traceback."""
    from distlab.runtime.restart.elastic import main as elastic
    assert elastic(["--dir", str(tmp_path / "missing" / "ckpt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m distlab.runtime.restart.elastic: error: --dir: folder ") and \
        "does not exist" in err, err


# --- issue 41, items 3-5: folders and files that cannot be redirected, locks that are checked ---------------------
@pytest.fixture
def no_ranks(monkeypatch):
    from distlab.runtime.ranks import forkserver
    monkeypatch.setattr(forkserver, "spawn", lambda *a: pytest.fail("a rank was started"))


def victim_folder(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    for name in ("run.json", "flight.7.json", "trace.json"):
        (victim / name).write_text("precious\n")
    return victim


def untouched(victim) -> bool:
    return sorted(os.listdir(victim)) == ["flight.7.json", "run.json", "trace.json"] and all(
        (victim / n).read_text() == "precious\n" for n in os.listdir(victim))


def test_a_link_at_the_flight_folder_or_at_distlab_out_leaves_the_victims_files_untouched(tmp_path, monkeypatch,
                                                                                           no_ranks):
    """Before: a link planted at the default <out>.flight made a successful run delete the victim's run.json and
    flight.7.json; one at distlab-out made simulate overwrite the victim's trace.json."""
    from distlab.runtime.diagnosis import flight
    from distlab.sim.errors import OutputError
    from distlab.sim.files import write_atomic
    victim = victim_folder(tmp_path)
    (tmp_path / "m.flight").symlink_to(victim)
    code, _, err = cli(["run", one_rank(0.01, tmp_path / "p.json"), "--out", tmp_path / "m.trace"])
    assert code == 2 and "m.flight is a symbolic link; distlab writes only into a real folder" in err, err
    monkeypatch.chdir(tmp_path)
    (tmp_path / "distlab-out").symlink_to(victim)
    code, _, err = cli(["simulate", os.path.join(os.path.dirname(__file__), "..", "scenarios", "ddp-cpu.yaml")])
    assert code == 2 and "distlab-out is a symbolic link" in err, err
    with pytest.raises(Exception, match="is a symbolic link"):           # the rank side and the last write too
        flight.clear(str(tmp_path / "m.flight"))
    with pytest.raises(OutputError, match="is a symbolic link"):
        write_atomic(str(tmp_path / "distlab-out" / "trace.json"), "{}", keep_copy=False)
    assert untouched(victim)


def test_a_folder_writable_by_others_is_refused(tmp_path, no_ranks):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    code, _, err = cli(["run", one_rank(0.01, tmp_path / "p.json"), "--out", shared / "m.trace"])
    assert code == 2 and err.count("\n") == 1 and "is writable by every user (mode 777)" in err, err
    os.chmod(shared, 0o1777)                  # sticky, as /tmp: no one may replace another's file there
    from distlab.sim.files import write_atomic
    write_atomic(str(shared / "ok.json"), "{}")


def test_every_parent_and_every_link_on_the_way_is_checked_as_ssh_does(tmp_path, no_ranks):
    """Before: only a link at the last folder was refused; a parent others can write (where the folder, or a link
    on the way, can be swapped) or a link of another user higher up was followed (issue 41 item 3; OpenSSH's
    StrictModes checks every folder up to /). A link of yours, in a folder only you write, is followed."""
    from distlab.sim.files import open_folder
    from distlab.sim.errors import ConfigError
    (tmp_path / "open" / "inner").mkdir(parents=True)
    os.chmod(tmp_path / "open", 0o777)
    code, _, err = cli(["run", one_rank(0.01, tmp_path / "p.json"), "--out", tmp_path / "open" / "inner" / "m.trace"])
    assert code == 2 and err.count("\n") == 1, err
    assert f"inner: its parent {tmp_path}/open is writable by every user (mode 777)" in err, err
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "open" / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ConfigError, match=f"open/link on the way is a symbolic link in folder {tmp_path}/open, "
                                          "which is writable by every user"):
        open_folder(str(tmp_path / "open" / "link" / "sub"))
    os.chmod(tmp_path / "open", 0o1777)                                      # sticky, as /tmp
    os.close(open_folder(str(tmp_path / "open" / "inner")))
    (tmp_path / "mine").symlink_to(tmp_path / "real")                        # /home/me -> /data/me
    os.close(open_folder(str(tmp_path / "mine" / "sub")))
    if os.getuid() != 0:
        return                                                               # chown needs root
    os.chown(tmp_path / "real", 12345, -1)
    with pytest.raises(ConfigError, match=f"its parent {tmp_path}/real is owned by another user"):
        open_folder(str(tmp_path / "mine" / "sub"))
    os.chown(tmp_path / "real", 0, -1)
    os.lchown(tmp_path / "mine", 12345, -1)
    with pytest.raises(ConfigError, match="mine on the way is a symbolic link of another user"):
        open_folder(str(tmp_path / "mine" / "sub"))


@pytest.mark.parametrize("command", ["run", "bench"])
def test_a_fifo_at_out_is_refused_before_the_ranks_start(tmp_path, no_ranks, command):
    """Before: run blocked after measuring (no reader), or a reader got the trace."""
    fifo = tmp_path / ("m.trace" if command == "run" else "b.json")
    os.mkfifo(fifo)
    argv = ["run", one_rank(0.01, tmp_path / "p.json")] if command == "run" else ["bench", "--sizes", "1KiB"]
    code, _, err = cli(argv + ["--out", fifo])
    assert code == 2 and err.count("\n") == 1 and "is a FIFO (named pipe); distlab writes only regular files" in err


def test_a_device_or_a_link_to_one_is_refused_before_the_ranks_start(tmp_path, no_ranks):
    """Before: --out /dev/null, or the user's own link to /dev/full, was written through (issue 41 item 3: only
    regular files are written). Refused by the check before any work, and by the write itself."""
    from distlab.sim.errors import OutputError
    from distlab.sim.files import write_atomic
    (tmp_path / "m.trace").symlink_to("/dev/full")
    plan = one_rank(0.01, tmp_path / "p.json")
    for argv, out, what in ((["bench", "--sizes", "1KiB"], "/dev/null", "is a character device"),
                            (["run", plan], tmp_path / "m.trace", "is a link to a character device")):
        code, _, err = cli(argv + ["--out", out])
        assert code == 2 and err.count("\n") == 1 and f"{what}; distlab writes only regular files" in err, err
        with pytest.raises(OutputError, match="character device, not a regular file"):
            write_atomic(str(out), "{}", keep_copy=False)
    assert os.readlink(tmp_path / "m.trace") == "/dev/full"


def test_a_hard_linked_or_fifo_lock_file_is_refused_and_a_full_disk_leaves_none(tmp_path, monkeypatch, no_ranks):
    """Before: .NAME.lock was truncated without a check (a hard link there truncated the victim's file); a FIFO
    or a full disk there gave a traceback and left an empty lock file behind."""
    from distlab.sim import files
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.link(victim, tmp_path / ".b.json.lock")
    code, _, err = cli(["bench", "--sizes", "1KiB", "--out", tmp_path / "b.json"])
    assert code == 2 and "is a file with 2 links (a hard link)" in err and victim.read_text() == "precious\n"
    os.unlink(tmp_path / ".b.json.lock")
    os.mkfifo(tmp_path / ".b.json.lock")
    code, _, err = cli(["bench", "--sizes", "1KiB", "--out", tmp_path / "b.json"])
    assert code == 2 and err.count("\n") == 1 and "is a FIFO (named pipe); distlab never uses it as a lock" in err
    os.unlink(tmp_path / ".b.json.lock")

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(files.os, "pwrite", full)
    code, _, err = cli(["bench", "--sizes", "1KiB", "--out", tmp_path / "b.json"])
    assert code == 2 and err.count("\n") == 1 and "cannot lock" in err and "No space left on device" in err, err
    assert not os.path.lexists(tmp_path / ".b.json.lock")


@pytest.mark.parametrize("command", ["bench", "validate", "calibrate", "simulate", "plan", "cluster", "run",
                                     "reproduce"])
def test_every_command_that_writes_results_holds_the_output_lock(tmp_path, no_ranks, command, monkeypatch):
    """Two concurrent `bench --out X`: the second is refused (before: both returned 0, the second overwrote the
    first). The first run is this test holding X's lock, so no ranks start twice."""
    from distlab.sim.files import OutputLock
    monkeypatch.chdir(tmp_path)
    scenarios = os.path.join(os.path.dirname(__file__), "..", "scenarios")
    out = {"simulate": "distlab-out", "cluster": "distlab-out", "run": "m.trace", "plan": "s.json",
           "reproduce": "r.png"}.get(command, "x.json")
    argv = {"bench": ["bench", "--sizes", "1KiB", "--out", out],
            "validate": ["validate", "--out", out], "calibrate": ["calibrate", "--out", out],
            "simulate": ["simulate", os.path.join(scenarios, "ddp-cpu.yaml")],
            "cluster": ["cluster", os.path.join(scenarios, "multi-job", "cluster-1024-h100.yaml")],
            "plan": ["plan", "--model", "gpt2-small", "--nodes", "1", "--save", out],
            "run": ["run", one_rank(0.01, tmp_path / "p.json"), "--out", out],
            "reproduce": ["reproduce", "--plot", out]}[command]
    with OutputLock(out, "--out"):
        code, _, err = cli(argv)
    assert code == 2 and err.count("\n") == 1 and f"another distlab run (pid {os.getpid()}) is writing" in err, err
    assert os.listdir(tmp_path) in ([], ["p.json"])


def test_a_rank_refuses_a_dump_dir_swapped_after_the_launcher_checked_it(tmp_path, monkeypatch):
    """Issue 41 item 3: ranks open --dump-dir again by its path; the launcher passes the (device, inode) it
    checked (DISTLAB_FLIGHT_DIR_ID) and a rank refuses any other folder found there, for its ring and its dump."""
    from distlab.runtime.diagnosis.flight import Recorder
    from distlab.runtime.ranks import forkserver
    from distlab.runtime.ranks.launch import Launch
    from distlab.sim.errors import ConfigError
    from distlab.sim.files import folder_id
    dump = tmp_path / "dump"
    seen = {}

    class Stop(Exception):
        pass

    def spawn(env, *a):
        seen.update(env)
        raise Stop
    monkeypatch.setattr(forkserver, "enabled", lambda: True)
    monkeypatch.setattr(forkserver, "spawn", spawn)
    with pytest.raises(Stop):
        Launch("distlab.runtime.execute.executor:plan_task", {}, 1, backend="gloo", dump_dir=str(dump)).start()
    checked = "%d:%d" % folder_id(str(dump), "--dump-dir")
    assert seen["DISTLAB_FLIGHT_DIR_ID"] == checked and seen["DISTLAB_FLIGHT_DIR"] == str(dump)
    monkeypatch.setenv("DISTLAB_FLIGHT_DIR_ID", checked)
    rec = Recorder(str(dump), 0, 2, capacity=4)
    assert rec.dump("first") == str(dump / "flight.0.json")
    dump.rename(tmp_path / "moved")                     # swapped: another folder now at the checked path
    dump.mkdir()
    with pytest.raises(ConfigError, match="it is not the folder the launcher checked"):
        Recorder(str(dump), 1, 2, capacity=4)
    assert rec.dump("late") is None and os.listdir(dump) == []
    rec.mm.close()
