"""The fork server (runtime/ranks/forkserver.py): ranks forked from one process that imported torch once behave as ranks
started as new processes: their own environment, working folder, temp folder and process group; the server is
reused from launch to launch, leaves when its launcher closes the pipe, and DISTLAB_FORKSERVER=0 turns it off."""
import os
import signal
import sys
import textwrap
import time

import pytest

from distlab.runtime.ranks import forkserver
from distlab.runtime.ranks.launch import launch

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")]

TASK = textwrap.dedent('''
    import os, sys, tempfile
    def task(ctx, payload):
        return {"rank": ctx.rank, "env_rank": os.environ["RANK"], "pid": os.getpid(), "ppid": os.getppid(),
                "pgid": os.getpgid(0), "cwd": os.getcwd(), "tmp": tempfile.gettempdir(), "argv": sys.argv,
                "marker": os.environ.get("DISTLAB_TEST_MARKER")}
''')


@pytest.fixture
def task_file(tmp_path):
    path = tmp_path / "task.py"
    path.write_text(TASK)
    return f"{path}:task"


def test_ranks_forked_from_one_server_see_their_own_environment(task_file, tmp_path, monkeypatch):
    monkeypatch.delenv("DISTLAB_FORKSERVER", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("DISTLAB_TEST_MARKER", "first")
    first = launch(task_file, {}, 2, backend="gloo")
    server = forkserver.server_pid()
    monkeypatch.setenv("DISTLAB_TEST_MARKER", "second")            # read at the fork, not when the server started
    own_tmp = tmp_path / "own-tmp"
    own_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(own_tmp))
    second = launch(task_file, {}, 2, backend="gloo")
    assert server is not None and forkserver.server_pid() == server            # one server, reused
    for results, marker in ((first, "first"), (second, "second")):
        assert [r["rank"] for r in results] == [0, 1] and [r["env_rank"] for r in results] == ["0", "1"]
        assert all(r["ppid"] == server and r["pid"] != server for r in results)
        assert all(r["cwd"] == str(work) and r["marker"] == marker for r in results)
        assert results[0]["pgid"] == results[1]["pgid"] == results[0]["pid"]    # one group, led by rank 0
        assert results[0]["pgid"] not in (os.getpgid(0), os.getpgid(server))    # Ctrl-C reaches the launcher only
        assert results[0]["argv"] == ["-c"]
    assert {r["tmp"] for r in second} == {str(own_tmp)}
    assert len({r["pid"] for r in first + second}) == 4


PRELOAD_TASK = textwrap.dedent('''
    import sys
    def task(ctx, payload):
        return {name: name in sys.modules for name in payload["names"]}
''')


def test_a_launch_has_the_server_import_its_preload_before_the_fork(tmp_path, monkeypatch):
    """Launch(preload=...) (runtime/ranks/launch.py TRAINING): the rank finds the modules already imported; one the server
    cannot import is left to the rank, the launch goes on; what was not asked for is not imported."""
    monkeypatch.delenv("DISTLAB_FORKSERVER", raising=False)
    path = tmp_path / "preload_task.py"
    path.write_text(PRELOAD_TASK)
    names = ["xml.dom.minidom", "distlab_no_such_module", "xml.sax.saxutils"]
    (r,) = launch(f"{path}:task", {"names": names}, 1, backend="gloo", preload=names[:2])
    assert r == {"xml.dom.minidom": True, "distlab_no_such_module": False, "xml.sax.saxutils": False}


# The tests below end their server (killed, or none): the one above still uses the first test's.
def test_a_killed_rank_reports_its_signal_and_the_others_die_with_the_server(tmp_path):
    """Two ranks of a group of 3 wait in init_process_group for the third (never started): one is killed and
    reported as killed; closing the server's pipe ends the server, and the other rank dies with it."""
    from distlab.runtime.ranks.launch import free_port
    (tmp_path / "task.json").write_text('{"target": "x:y", "payload": {}, "backend": "gloo", "threads": 1, '
                                        '"timeout": 60}')
    env = dict(os.environ, DISTLAB_RUN_DIR=str(tmp_path), WORLD_SIZE="3", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), DISTLAB_FLIGHT="0",
               DISTLAB_RUN_SECRET="forkserver-test-secret-0123456789")   # as the launcher gives every rank
    server = forkserver.Server()
    try:
        killed = server.spawn(dict(env, RANK="0"), str(tmp_path), str(tmp_path / "log0"), 0)
        waiting = server.spawn(dict(env, RANK="1"), str(tmp_path), str(tmp_path / "log1"), killed.pid)
        time.sleep(0.5)
        assert killed.poll() is None and waiting.poll() is None
        os.kill(killed.pid, signal.SIGKILL)
        assert killed.wait(timeout=30) == -signal.SIGKILL
    finally:
        server.close()
    assert server.proc.returncode == 0                   # it left when its pipe closed
    end = time.monotonic() + 10
    while os.path.exists(f"/proc/{waiting.pid}") and time.monotonic() < end:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{waiting.pid}")     # PR_SET_PDEATHSIG: died with its parent


def test_ranks_of_a_killed_server_die_and_are_reported_killed(tmp_path):
    """The server SIGKILLed (not its pipe closed): its waiting rank dies with it and polls as killed."""
    from distlab.runtime.ranks.launch import free_port
    (tmp_path / "task.json").write_text('{"target": "x:y", "payload": {}, "backend": "gloo", "threads": 1, '
                                        '"timeout": 60}')
    env = dict(os.environ, DISTLAB_RUN_DIR=str(tmp_path), RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), DISTLAB_FLIGHT="0",
               DISTLAB_RUN_SECRET="forkserver-test-secret-0123456789")   # as the launcher gives every rank
    server = forkserver.Server()
    try:
        waiting = server.spawn(env, str(tmp_path), str(tmp_path / "log0"), 0)
        time.sleep(0.3)
        os.kill(server.pid, signal.SIGKILL)
        assert waiting.wait(timeout=30) == -signal.SIGKILL
    finally:
        server.close()


def test_without_the_server_each_rank_is_a_new_process(task_file, monkeypatch):
    monkeypatch.setenv("DISTLAB_FORKSERVER", "0")
    results = launch(task_file, {}, 2, backend="gloo")
    assert [r["ppid"] for r in results] == [os.getpid()] * 2
    assert results[0]["pgid"] == results[1]["pgid"] == results[0]["pid"]
