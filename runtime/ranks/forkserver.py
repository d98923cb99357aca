"""Start ranks in a fraction of a second: one process imports torch once, then forks a rank per request.

A rank started as a new Python process spends about 1.5 s of CPU importing torch before it does anything; on a
2-core laptop four ranks take about 3 s to start, every launch. The fork server (one per launcher process,
started at its first launch) pays that once: it imports torch and torch.distributed (FSDP2 and DTensor at the
first training launch: ``preload`` below), then, for every rank the launcher asks for, forks itself and the
child becomes that rank (``_become_rank``: its own environment, working
folder, log file and process group, then distlab's worker, exactly as ``WORKER_COMMAND`` runs it). Nothing is
initialised before the fork (no process group, no thread pool, no CUDA), so the child starts clean; this is how
torch's DataLoader starts its forked workers. Python's own ``multiprocessing`` forkserver is not used: its
children re-import the launcher's ``__main__`` (a user's script or notebook), which a launcher must not do.

Protocol: JSON lines. The launcher writes ``{"env", "cwd", "log", "pgid", "preload"}``; the server answers ``{"pid"}``
and, whenever a child ends, ``{"exit": pid, "code": c}`` (``c`` as ``Popen.returncode``: negative for a signal).
``preload``: modules the launch's ranks will import (runtime/ranks/launch.py TRAINING: torch._dynamo, ~0.6 s of CPU per
rank at its first backward; FSDP2 and DTensor, ~1 s), imported by the server before it forks, once for this and
every later launch; one that fails to import is left to the rank, which reports the error itself. A server that
only ever starts collectives (`distlab run`, `bench`, `calibrate`, lesson 01) never imports FSDP2 or DTensor.

Lifetime: the server leaves as soon as its launcher's end of the pipe closes (the launcher ended, or was killed:
the kernel closes it; the server looks every 20 ms), and its ranks die with it (the worker's PR_SET_PDEATHSIG),
so killing the launcher still ends everything; it also leaves after ``IDLE_S`` seconds without ranks. It ignores SIGINT and sits in its own session, so a
Ctrl-C at the terminal reaches only the launcher, as before. ``DISTLAB_FORKSERVER=0`` starts every rank as a new
process instead (runtime/ranks/launch.py).
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

IDLE_S = 300.0
SERVER_COMMAND = [sys.executable, "-c",
                  "import sys; del sys.path[0]; from distlab.runtime.ranks.forkserver import serve; serve()"]


def enabled() -> bool:
    """Fork ranks from the server: on Linux (fork, /proc), unless DISTLAB_FORKSERVER=0."""
    return sys.platform.startswith("linux") and os.environ.get("DISTLAB_FORKSERVER", "1") != "0"


class Forked:
    """A rank forked by the server, with the parts of ``subprocess.Popen`` the launcher uses."""

    def __init__(self, server: "Server", pid: int):
        self.server, self.pid, self.returncode = server, pid, None

    def poll(self):
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None):
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired("rank", timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)


class Server:
    """The launcher's end of one fork server."""

    def __init__(self):
        self.proc = subprocess.Popen(SERVER_COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     start_new_session=True)
        self.pid = self.proc.pid
        self.owner = os.getpid()
        self._buffer = b""
        self._exits: dict[int, int] = {}
        self._lock = threading.Lock()
        self._requests = 0
        os.set_blocking(self.proc.stdout.fileno(), False)

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.proc.poll() is None

    def spawn(self, env: dict, cwd: str, log: str, pgid: int, preload=()) -> Forked:
        """Fork one rank; raises OSError if the server is gone."""
        with self._lock:
            self._requests += 1
            request = {"env": env, "cwd": cwd, "log": log, "pgid": pgid, "preload": list(preload),
                       "id": self._requests}
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            while True:
                for message in self._messages(block=True):
                    if message.get("id") == self._requests:
                        return Forked(self, message["pid"])
                    _kill(message["pid"])    # the answer to a request interrupted (Ctrl-C) before it came

    def exit_code(self, pid: int):
        """The child's exit code, None while it runs (-9 if the server died without reporting it)."""
        with self._lock:
            try:
                for _ in self._messages(block=False):
                    pass
            except OSError:              # the server ended: what it reported is kept, its ranks died with it
                pass
            if pid in self._exits:
                return self._exits.pop(pid)
            if self.proc.poll() is not None:
                return None if _running(pid) else -signal.SIGKILL
            return None

    def _messages(self, block: bool):
        """Read what the server wrote; exit messages are kept, the others yielded."""
        while True:
            if b"\n" not in self._buffer:
                if block:
                    select.select([self.proc.stdout], [], [], 1.0)
                try:
                    chunk = os.read(self.proc.stdout.fileno(), 65536)
                except BlockingIOError:
                    chunk = None
                if chunk == b"":
                    raise OSError("the fork server ended")
                if chunk:
                    self._buffer += chunk
                    continue
                if not block:
                    return
                if self.proc.poll() is not None:
                    raise OSError("the fork server ended")
                continue
            line, self._buffer = self._buffer.split(b"\n", 1)
            message = json.loads(line)
            if "exit" in message:
                self._exits[message["exit"]] = message["code"]
            else:
                yield message

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait()


_SERVER: list = []


def spawn(env: dict, cwd: str, log: str, pgid: int, preload=()) -> Forked:
    """Fork one rank from this process's fork server (started, or started again, as needed); ``preload``: modules
    the server imports first (module docstring)."""
    for attempt in range(2):
        if not _SERVER or not _SERVER[0].alive():
            _SERVER[:] = [Server()]
        try:
            return _SERVER[0].spawn(env, cwd, log, pgid, preload)
        except OSError:
            _SERVER.clear()               # it left (idle) as we asked: start another, once
            if attempt:
                raise


def died(proc) -> str | None:
    """If ``proc`` is a rank this launcher's fork server started and the server died: one line saying so (its
    ranks die with it, PR_SET_PDEATHSIG, so "rank 0 died" would blame the wrong process)."""
    if not isinstance(proc, Forked) or proc.server.proc.poll() is None:
        return None
    rc = proc.server.proc.returncode
    try:
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
    except ValueError:
        how = f"killed by signal {-rc}"
    return (f"the fork server (pid {proc.server.pid}) that started the ranks died ({how}); every rank it started "
            f"died with it")


def server_pid() -> int | None:
    return _SERVER[0].pid if _SERVER and _SERVER[0].alive() else None


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- the server process -------------------------------------------------------------------------------------------

def serve() -> None:
    """The server's loop (module docstring): preload, then fork on request and report exits."""
    me = os.getpid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)                       # a stray print must not end up in the protocol
    os.close(null)
    import torch                        # noqa: F401 - the point of the server: imported once, before the forks
    import torch.distributed            # noqa: F401 - FSDP2 and DTensor (~1 s more) come with a training launch's preload
    import distlab.runtime.ranks.worker       # noqa: F401
    import distlab.runtime.diagnosis.flight       # noqa: F401 - every rank's flight recorder (with sim.plan: ~0.1 s)
    import distlab.runtime.ranks.rendezvous   # noqa: F401 - every rank's store
    children, buffer, idle_since = set(), b"", time.monotonic()
    while True:
        ready, _, _ = select.select([proto_in], [], [], 0.02)
        if ready:
            chunk = os.read(proto_in, 1 << 20)
            if not chunk:
                os._exit(0)             # the launcher closed its end (or died): its ranks die with us
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                request = json.loads(line)
                _preload(request.get("preload", ()))
                pid = os.fork()
                if pid == 0:
                    os.close(proto_in)
                    os.close(proto_out)
                    _become_rank(request, me)
                try:
                    os.setpgid(pid, request["pgid"] or pid)     # also done by the child: no race either way
                except OSError:
                    pass
                children.add(pid)
                _write(proto_out, {"pid": pid, "id": request["id"]})
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
            _write(proto_out, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if children or ready:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > IDLE_S:
            os._exit(0)


def _preload(modules) -> None:
    """Import what the ranks will (module docstring); a module that fails is left to the rank to import and report."""
    import importlib
    for name in modules:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:            # noqa: BLE001 - the rank imports it again and says what is wrong
                pass


def _write(fd: int, message: dict) -> None:
    data = json.dumps(message).encode() + b"\n"
    while data:
        data = data[os.write(fd, data):]


def _become_rank(request: dict, server: int) -> None:
    """In the forked child: become a rank as WORKER_COMMAND starts one, then run distlab's worker (which dies
    with its parent, the server: DISTLAB_PARENT_PID)."""
    try:
        try:
            os.setpgid(0, request["pgid"])
        except OSError:
            pass
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"], DISTLAB_PARENT_PID=str(server))
        import random
        import tempfile
        random.seed()                   # not the server's state, shared by every child
        tempfile.tempdir = None         # read TMPDIR from this rank's environment
        sys.argv = ["-c"]
        from distlab.runtime.ranks.worker import main
        main()                          # ends with os._exit
    except SystemExit as e:
        sys.stderr.flush()
        os._exit(e.code if isinstance(e.code, int) else 1)
    except BaseException:               # noqa: BLE001 - a child must never return into the server's loop
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(1)
