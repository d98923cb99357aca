"""Issue 32, item 1: no one outside a run joins it. Rank 0's store (runtime/ranks/store.py) serves only processes that
prove they know the run's secret, refuses the others naming their address, and ranks exchange no pickles."""
from __future__ import annotations

import ast
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from distlab.runtime.ranks import store as st
from distlab.sim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SECRET = b"s" * 32


def test_no_rank_code_sends_pickles():
    """all_gather_object, gather_object, broadcast_object_list, scatter_object_list, send/recv_object_list unpickle
    what peers send; runtime/ uses runtime/execute/wire.py (JSON bytes in tensors), the lessons' demo included."""
    banned = {"all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list",
              "send_object_list", "recv_object_list"}
    found = []
    for path in sorted([*ROOT.glob("runtime/**/*.py"), *ROOT.glob("sim/**/*.py"), *ROOT.glob("benchmarks/*.py")]):
        text = path.read_text()
        if not any(name in text for name in banned):      # an attribute named so has its name in the text
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Attribute) and node.attr in banned:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.attr}")
    assert found == []


def server(refused: list):
    return st.StoreServer(SECRET, "127.0.0.1", 0, on_refused=lambda a, r: refused.append((a, r)))


def wait_for(cond, seconds=5.0):
    end = time.monotonic() + seconds
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)
    return cond()


def test_the_store_serves_who_knows_the_secret_and_refuses_the_others_by_address():
    refused: list = []
    srv = server(refused)
    try:
        conn = st.connect(SECRET, "127.0.0.1", srv.port, time.monotonic() + 5)
        assert st.call(conn, b"set", b"k", b"v") == [b"ok"]
        assert st.call(conn, b"get", b"k", b"1000") == [b"ok", b"v"]
        assert st.call(conn, b"get", b"absent", b"50") == [b"timeout"]
        assert st.call(conn, b"add", b"n", b"3") == [b"ok", b"3"]
        assert st.call(conn, b"cas", b"c", b"", b"x") == [b"ok", b"x"]            # torch's compareSet rules
        assert st.call(conn, b"cas", b"c", b"nope", b"y") == [b"ok", b"x"]
        assert st.call(conn, b"cas", b"missing", b"e", b"y") == [b"ok", b"e"]
        # a wrong secret: refused, and the server names the address it came from
        with pytest.raises(st.StoreError, match="refused this rank"):
            st.connect(b"w" * 32, "127.0.0.1", srv.port, time.monotonic() + 5)
        assert wait_for(lambda: len(refused) == 1)
        # torch's TCPStore client (another protocol): refused at its first byte
        raw = socket.create_connection(("127.0.0.1", srv.port))
        raw_port = raw.getsockname()[1]
        raw.recv(64)
        raw.sendall(b"\x00\x01\x02\x03")
        assert wait_for(lambda: len(refused) == 2)
        raw.close()
        # a port scan (connect, say nothing, leave) is not a joiner: nothing refused
        socket.create_connection(("127.0.0.1", srv.port)).close()
        time.sleep(0.2)
        assert len(refused) == 2
        assert all(a.startswith("127.0.0.1:") and "did not present this run's secret" in r for a, r in refused)
        assert refused[1][0] == f"127.0.0.1:{raw_port}"
        assert st.call(conn, b"get", b"k", b"1000") == [b"ok", b"v"]             # the run's own client unaffected
    finally:
        srv.close()


def test_a_rank_refuses_a_server_that_cannot_prove_the_secret():
    other = st.StoreServer(b"o" * 32, "127.0.0.1", 0)        # e.g. a forged announcement points here
    try:
        with pytest.raises(st.StoreError):
            st.connect(SECRET, "127.0.0.1", other.port, time.monotonic() + 5)
    finally:
        other.close()


def test_the_secret_comes_from_the_environment_or_a_private_file(tmp_path, monkeypatch):
    from distlab.runtime.ranks.secret import run_secret
    monkeypatch.delenv("DISTLAB_RUN_SECRET", raising=False)
    monkeypatch.delenv("DISTLAB_RUN_SECRET_FILE", raising=False)
    with pytest.raises(ConfigError, match="no run secret"):
        run_secret()
    monkeypatch.setenv("DISTLAB_RUN_SECRET", "short")
    with pytest.raises(ConfigError, match="at least 16"):
        run_secret()
    monkeypatch.setenv("DISTLAB_RUN_SECRET", "a" * 20)
    assert run_secret() == b"a" * 20
    monkeypatch.delenv("DISTLAB_RUN_SECRET")
    f = tmp_path / "run.secret"
    f.write_text("b" * 32 + "\n")
    f.chmod(0o644)
    monkeypatch.setenv("DISTLAB_RUN_SECRET_FILE", str(f))
    with pytest.raises(ConfigError, match="readable by you only"):
        run_secret()
    f.chmod(0o600)
    assert run_secret() == b"b" * 32
    link = tmp_path / "link.secret"
    link.symlink_to(f)
    monkeypatch.setenv("DISTLAB_RUN_SECRET_FILE", str(link))
    with pytest.raises(ConfigError, match="cannot read"):
        run_secret()


def _ranks_of(server_pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1]) == server_pid:
                    out.append(int(name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _listening(pid: int) -> list[tuple[str, str, int]]:
    """(tcp or tcp6, hex address, port) of every listening socket of ``pid``."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out = []
    for kind in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{kind}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                address, port = f[1].split(":")
                out.append((kind, address, int(port, 16)))
    return out


@pytest.mark.slow
def test_a_stranger_joining_a_local_runs_store_is_refused_and_the_run_ends_in_one_line(tmp_path, monkeypatch,
                                                                                      capsys):
    """A local run listens on loopback only (its store and Gloo); a process that connects to its store with torch's
    own TCPStore client (as one that wanted to read and write the run's keys would) is refused, and the run ends
    at once with one line naming the address. Before: the store listened on every interface and served anyone."""
    import torch.distributed as dist
    from datetime import timedelta

    from distlab.runtime.ranks import forkserver, launch
    from distlab.runtime.cli import main
    from distlab.sim.plan import Collective, Compute, Plan
    port = launch.free_port()
    monkeypatch.setattr(launch, "free_port", lambda: port)
    plan = tmp_path / "slow.json"
    Plan([[Compute(seconds=60.0), Collective("all_reduce", 64)]] * 2, name="slow").save(str(plan))
    seen: dict = {}

    def intruder():
        while not wait_for(lambda: _store_up(port), 60):
            pass
        time.sleep(0.5)
        ranks = _ranks_of(forkserver.server_pid() or -1)
        seen["listening"] = [x for r in ranks for x in _listening(r)]
        try:
            dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=2))
        except Exception as e:                       # noqa: BLE001 - refused, as it should be
            seen["error"] = e

    t = threading.Thread(target=intruder, daemon=True)
    t.start()
    t0 = time.monotonic()
    rc = main(["run", str(plan), "--out", str(tmp_path / "m.trace"), "--backend", "gloo", "--timeout", "90"])
    elapsed = time.monotonic() - t0
    t.join(10)
    err = capsys.readouterr().err
    assert rc == 1 and elapsed < 50, (rc, elapsed, err)
    (line,) = err.strip().splitlines()
    assert line.startswith("distlab run: error: refused a connection to the run's store from 127.0.0.1:"), line
    assert "did not present this run's secret" in line and "error" in seen
    assert seen["listening"] and all(kind == "tcp" and address == "0100007F"         # 127.0.0.1 only
                                     for kind, address, _ in seen["listening"]), seen["listening"]
    assert not (tmp_path / "m.trace").exists()


def _store_up(port: int) -> bool:
    """The store listens (a connection that says nothing is not refused: a scan does not end the run)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


EVIL = """
import os, sys, torch.distributed as dist
class Payload:
    def __reduce__(self):
        return (os.system, ("touch " + sys.argv[1],))
dist.init_process_group("gloo")
dist.gather_object(Payload(), None, dst=0)
"""


@pytest.mark.slow
def test_a_foreign_node_with_its_own_script_never_runs_code_in_the_run(tmp_path, monkeypatch, capsys):
    """Item 1 as reported: a stranger joins `distlab run --nnodes 2` as node 1 with its own script that sends a pickle
    (gather_object). Before: it ran in rank 0 (the marker file appeared). Now rank 0's store waits for rank 1 to
    authenticate, which it cannot, and the run ends with one line; no pickle is ever read. Node 0's command runs in
    this process (its torchrun and rank are processes of their own); the stranger's torchrun waits for it."""
    from distlab.runtime.cli import main
    from distlab.runtime.ranks.launch import free_port
    from distlab.sim.plan import Collective, Plan
    plan, marker = tmp_path / "p.json", tmp_path / "marker"
    Plan([[Collective("all_reduce", 64)]] * 2, name="p").save(str(plan))
    (tmp_path / "evil.py").write_text(EVIL)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "DISTLAB_RUN_SECRET"}
    stranger = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--log-dir", str(tmp_path / "logs"),
                                 "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1", "--rdzv-backend",
                                 "static", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", "timeout=20",
                                 str(tmp_path / "evil.py"), str(marker)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    monkeypatch.setenv("DISTLAB_RUN_SECRET", "the-real-secret-0123456789")
    capsys.readouterr()
    try:
        rc = main(["run", str(plan), "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", f"127.0.0.1:{port}",
                   "--nproc", "1", "--backend", "gloo", "--timeout", "6", "--out", str(tmp_path / "m.trace")])
    finally:
        if stranger.poll() is None:
            os.killpg(stranger.pid, 9)
        stranger.wait()
    err = capsys.readouterr().err
    assert not marker.exists()
    assert rc == 1 and err.count("\n") == 1, err
    assert "rank 1 did not join the run's store within 6 s" in err and "without this run's secret" in err, err
