"""Start N local ranks (distlab's own worker, ``WORKER_COMMAND``), watch them, collect their results, never leave one behind.

Ranks are forked from a fork server that has imported torch once (runtime/ranks/forkserver.py: a launch then starts in
a fraction of a second instead of ~1.5 s of CPU per rank); DISTLAB_FORKSERVER=0 starts each as a new process.

Each rank gets torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) plus DISTLAB_RUN_DIR, a temporary folder with task.json (``module:function`` and its payload) that
receives ``result.R.json``, ``partial.R.json`` and ``error.R.json``, and DISTLAB_RUN_SECRET, drawn for this run:
rank 0's store on 127.0.0.1 serves only ranks that present it (runtime/ranks/rendezvous.py); Gloo listens on the
loopback interface (GLOO_SOCKET_IFNAME=lo, macOS lo0, unless set). All ranks share one new process group, so
Ctrl-C reaches only the launcher, which then ends the group (SIGTERM, then SIGKILL) and reaps every child; the
ranks also ask the kernel to kill them if the launcher itself dies (PR_SET_PDEATHSIG; elsewhere they poll it).

A plan (target runtime.execute.executor:plan_task) is checked statically first (sim/check.py): one whose ranks would
call mismatched collectives is refused (PlanMismatch) before any rank starts, unless ``check=False``. Every
rank keeps a flight recorder (runtime/diagnosis/flight.py) in ``dump_dir`` (default: the temporary run folder); after a
failure or an interruption the launcher adds run.json (exit codes, failures, the signal that interrupted it)
there, and RunFailed.flight holds the records read back.

The run folder is ``distlab-run-PID-*`` in the temporary folder (PID: the launcher's); it is removed when the
run ends, however it ends. A launcher killed by SIGKILL cannot remove it: the next launch removes every
``distlab-run-PID-*`` whose launcher PID no longer runs (``remove_stale_run_dirs``).

A rank that raises or dies ends the run: the others get ``grace`` seconds to report, then are killed, and
RunFailed names the first rank that failed and its error. Ranks waiting for a peer that hangs give up after
``timeout`` seconds (the process group's timeout), so every failure ends the run within a bounded time.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from distlab.runtime.ranks import forkserver
from distlab.runtime.ranks.portability import loopback_interface, say_limits_once
from distlab.runtime.ranks.rundir import RUN_DIR_PREFIX, remove_stale_run_dirs
from distlab.runtime.ranks.secret import new_secret
from distlab.sim.errors import ConfigError

BACKENDS = ("auto", "gloo", "nccl")
# The rank process: distlab's worker, imported with the current folder removed from sys.path, so a user's own
# `distlab/`, `runtime/` or `sim/` folder never shadows it (`python -m` would put the current folder first).
WORKER_COMMAND = [sys.executable, "-c",
                  "import sys; del sys.path[0]; from distlab.runtime.ranks.worker import main; main()"]
# What the ranks of a training launch import after the fork, for the fork server to import once before it
# (runtime/ranks/forkserver.py; ``Launch(preload=...)``): torch._dynamo, imported at a rank's first backward or optimizer
# step (torch/_compile.py's _disable_dynamo imports it at the first call of a function it wraps: ~0.6 s of CPU per
# rank), FSDP2 and DTensor (~1 s: the server imports neither until a training launch asks; a launch of collectives
# never needs them), and torch.distributed.pipelining (~0.2 s more) for pipeline stages.
TRAINING = ("torch._dynamo", "torch.distributed.fsdp", "torch.distributed.tensor")
PIPELINING = TRAINING + ("torch.distributed.pipelining",)
# Errors that are usually the echo of another rank's failure, not its cause.
_ECHOES = ("connection closed", "connection reset", "broken pipe", "timed out", "timeout", "sigterm",
           "terminated", "peer")


class RunFailed(RuntimeError):
    """A rank raised or died. ``rank`` is the first that failed; ``partial`` maps rank -> its last partial."""

    def __init__(self, rank: int, message: str, partial: dict, results: dict, logs: dict | None = None,
                 flight: dict | None = None, dump_dir: str | None = None, refused: str | None = None):
        self.rank, self.partial, self.results, self.logs = rank, partial, results, logs or {}
        self.flight, self.dump_dir = flight, dump_dir       # runtime.diagnosis.flight_read.load_dir() of the dumps, their folder
        self.refused = refused          # the address of a stranger that tried to join (the run was stopped)
        super().__init__(message)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_options(nproc: int, backend: str, threads: int, timeout: float) -> None:
    if not isinstance(nproc, int) or nproc < 1:
        raise ConfigError(f"{nproc!r} must be a whole number >= 1", "--nproc")
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}", "--backend")
    from distlab.runtime.ranks.preflight import check_host_bounds
    check_host_bounds(nproc, threads, timeout)     # ranks and threads by the cores, a finite sensible timeout
    if backend == "nccl":                  # in the launcher: one line now, not a timeout inside every rank
        from distlab.runtime.ranks.preflight import check_nccl
        check_nccl(nproc)


def check_plans(payload) -> None:
    """The static check (sim/check.py) of a plan in the payload of plan_task (or of a sweep that runs one)."""
    from distlab.sim.check import assert_consistent
    from distlab.sim.plan import Plan
    d = payload.get("plan") if isinstance(payload, dict) else None
    d = d.get("plan") if isinstance(d, dict) and isinstance(d.get("plan"), dict) else d
    if isinstance(d, dict) and "ranks" in d:
        plan = Plan.from_dict(d)
        assert_consistent(plan, f"plan {plan.name!r}")


class Launch:
    """``Launch(...).start()`` then ``.wait()`` -> list of per-rank results; ``.pids`` while it runs."""

    def __init__(self, target: str, payload, nproc: int, backend: str = "auto", threads: int = 1,
                 timeout: float = 60.0, grace: float = 3.0, verbose: bool = False, dump_dir: str | None = None,
                 check: bool = True, warn_cores: str | None = None, preload: tuple = ()):
        check_options(nproc, backend, threads, timeout)
        say_limits_once()                      # off Linux: what runs differently, once (runtime/ranks/portability.py)
        if warn_cores:                         # the command's name: one warning line if ranks outnumber cores
            from distlab.runtime.ranks.preflight import warn_cores as warn
            warn(nproc, threads, warn_cores)
        if check:
            check_plans(payload)
        self.dump_dir = dump_dir
        self.flight: dict | None = None        # the flight records read back after a failure or abort
        self.target, self.payload, self.nproc = target, payload, nproc
        self.backend, self.threads, self.timeout = backend, threads, timeout
        self.grace, self.verbose = min(grace, timeout), verbose
        self.preload = tuple(preload)          # modules the fork server imports before forking (runtime/ranks/forkserver.py)
        self.procs: list = []                  # subprocess.Popen or forkserver.Forked
        self.pgid: int | None = None
        self.run_dir: str | None = None
        self.kept: dict = {}                   # partial results, after abort()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def start(self) -> "Launch":
        remove_stale_run_dirs()
        self.run_dir = tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-")
        flight_dir = os.path.abspath(self.dump_dir or self.run_dir)
        try:
            flight_id = self._prepare_flight(flight_dir)
        except BaseException:
            self._release()
            shutil.rmtree(self.run_dir, ignore_errors=True)
            raise
        task = {"target": self.target, "payload": self.payload, "backend": self.backend, "threads": self.threads}
        with open(os.path.join(self.run_dir, "task.json"), "w") as f:
            json.dump({**task, "timeout": self.timeout}, f)
        port = free_port()
        loopback = loopback_interface()        # runtime/ranks/portability.py
        secret = new_secret()                  # this run's: rank 0's store serves only who presents it
        for r in range(self.nproc):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(self.nproc), LOCAL_RANK=str(r),
                       LOCAL_WORLD_SIZE=str(self.nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       DISTLAB_RUN_DIR=self.run_dir, DISTLAB_PARENT_PID=str(os.getpid()), DISTLAB_FLIGHT_DIR=flight_dir,
                       DISTLAB_FLIGHT_DIR_ID=flight_id, OMP_NUM_THREADS=str(self.threads), DISTLAB_RUN_SECRET=secret)
            if loopback:                       # Gloo's sockets on loopback too (unless chosen): "lo", macOS "lo0"
                env.setdefault("GLOO_SOCKET_IFNAME", loopback)
            log_path = os.path.join(self.run_dir, f"stderr.{r}")
            log = open(log_path, "wb")
            try:
                if forkserver.enabled():           # torch imported once, each rank forked (runtime/ranks/forkserver.py)
                    p = forkserver.spawn(env, os.getcwd(), log_path, self.pgid or 0, self.preload)
                else:
                    p = subprocess.Popen(WORKER_COMMAND, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         **_group_kwargs(0 if self.pgid is None else self.pgid))
            except BaseException:
                log.close()
                self.stop()
                shutil.rmtree(self.run_dir, ignore_errors=True)
                raise
            log.close()
            self.procs.append(p)
            if self.pgid is None:
                self.pgid = p.pid
            if self.verbose:
                sys.stderr.write(f"distlab: rank {r} pid {p.pid}\n")
                sys.stderr.flush()
        return self

    def _prepare_flight(self, flight_dir: str) -> str:
        """Lock --dump-dir (a second run there refuses instead of clearing this one's records), clear the old
        records, allocate the rings (a full disk or a planted link is one line before any rank starts); returns
        "DEV:INODE" of the folder checked, which each rank's Recorder requires (DISTLAB_FLIGHT_DIR_ID)."""
        from distlab.runtime.diagnosis.flight import clear, create_rings
        from distlab.sim.files import OutputLock, folder_id, make_folder
        if self.dump_dir:
            make_folder(self.dump_dir, "--dump-dir")      # never through a link at the folder (sim/files.py)
            self._dump_lock = OutputLock(self.dump_dir, "--dump-dir", folder=True).acquire()
            clear(self.dump_dir)
        if os.environ.get("DISTLAB_FLIGHT") != "0":
            create_rings(flight_dir, self.nproc)
        return "%d:%d" % folder_id(flight_dir, "--dump-dir")

    def _release(self) -> None:
        lock = getattr(self, "_dump_lock", None)
        if lock is not None:
            lock.release()

    def ready(self, what: str = "ready") -> int:
        """How many ranks have joined the process group (``running``: have begun their timed work)."""
        return sum(os.path.exists(os.path.join(self.run_dir, f"{what}.{r}")) for r in range(self.nproc))

    def _read(self, kind: str, r: int):
        path = os.path.join(self.run_dir, f"{kind}.{r}.json")
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def partial(self, r: int = 0):
        return self._read("partial", r)

    def _tail(self, r: int, lines: int = 30) -> str:
        """The end of rank r's stdout and stderr (its traceback, when it raised)."""
        try:
            with open(os.path.join(self.run_dir, f"stderr.{r}"), "rb") as f:
                return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _describe(self, r: int, rc: int) -> tuple[int, str]:
        """(priority, message): a death by signal or a first-hand error sorts before an echo of another's."""
        err = self._read("error", r)
        if err and (err.get("refused") or str(err.get("error", "")).startswith("watchdog: ")):
            return -1, err["error"]             # a stranger tried to join, or an op outran --timeout: said as it is
        if err:
            text = err["error"]
            return (1 if any(e in text.lower() for e in _ECHOES) else 0), f"rank {r} failed: {text}"
        server = forkserver.died(self.procs[r])
        if server:                              # the fork server died, and every rank it started with it
            return -1, server
        if rc < 0:
            return 0, f"rank {r} died: killed by {_signal(-rc)}"
        lines = [ln for ln in self._tail(r).splitlines() if ln.strip()]
        tail = f": {lines[-1][:300]}" if lines else ""
        return 0, f"rank {r} exited with code {rc}{tail}"

    def polls(self, poll_s: float = 0.05):
        """Watch the ranks, yielding after each look, until all ended (or failed and the grace ran out)."""
        self._failures: list[tuple] = []      # (poll number, priority, time of the error, rank, message)
        exited: dict[int, int] = {}
        deadline, n, announced = None, 0, 0
        old = _sigterm_as_interrupt()
        try:
            while len(exited) < self.nproc:
                n += 1
                for r, p in enumerate(self.procs):
                    if r not in exited and (rc := p.poll()) is not None:
                        exited[r] = rc
                        if rc != 0:
                            priority, message = self._describe(r, rc)
                            err = self._read("error", r) or {}
                            self._failures.append((n, priority, err.get("time", time.time()), r, message))
                if self._failures and deadline is None:
                    deadline = time.monotonic() + self.grace
                if deadline is not None and time.monotonic() > deadline:
                    break
                if self.verbose and announced < 2 and self.ready(("ready", "running")[announced]) == self.nproc:
                    sys.stderr.write(f"distlab: all {self.nproc} ranks {('joined', 'running')[announced]}\n")
                    sys.stderr.flush()
                    announced += 1
                yield
                if len(exited) < self.nproc:
                    time.sleep(poll_s)
        finally:
            _restore_sigterm(old)
            self.stop()

    def finish(self) -> list:
        """After polls(): results by rank, or RunFailed naming the first rank that failed."""
        self.stop()
        results = {r: self._read("result", r) for r in range(self.nproc)}
        partial = {r: self._read("partial", r) for r in range(self.nproc)}
        failures = sorted(getattr(self, "_failures", []))
        logs = {f[3]: self._tail(f[3]) for f in failures}
        refused = (self._read("error", failures[0][3]) or {}).get("refused") if failures else None
        if failures:
            self._keep_flight(failures)
        self._release()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if failures:
            first = failures[0]
            others = "; ".join(dict.fromkeys(f[4] for f in failures[1:4] if f[4] != first[4]))
            message = first[4] + (f" (then {others})" if others and not refused else "")
            raise RunFailed(first[3], message, partial, results, logs, self.flight, self.dump_dir, refused)
        return [results[r] for r in range(self.nproc)]

    def wait(self, on_poll=None) -> list:
        """Block until every rank ends; results by rank. Raises RunFailed naming the first failed rank."""
        try:
            for _ in self.polls():
                if on_poll is not None:
                    on_poll(self)
        except BaseException as e:
            self.abort(_signal_name(e))
            raise
        return self.finish()

    def wait_progress(self, total: int, description: str, count, enabled: bool = True) -> list:
        """wait() with a progress bar (sim.cli.progress) of ``count(self)`` out of ``total`` steps."""
        from distlab.sim.cli import progress

        def ticks():
            done = 0
            for _ in self.polls():
                c = min(total, count(self))
                while done < c:
                    done += 1
                    yield
        try:
            for _ in progress(ticks(), total, description, enabled):
                pass
        except BaseException as e:
            self.abort(_signal_name(e))
            raise
        return self.finish()

    def abort(self, interrupted: str | None = None) -> dict:
        """Interrupted (``interrupted``: the signal, e.g. 'SIGINT'): end every rank, keep their partial results
        in ``self.kept`` (rank -> partial) and the signal in run.json."""
        self.stop()
        if self.run_dir and os.path.isdir(self.run_dir):
            self.kept = {r: self._read("partial", r) for r in range(self.nproc)}
            self._keep_flight(sorted(getattr(self, "_failures", [])), interrupted)
            shutil.rmtree(self.run_dir, ignore_errors=True)
        self._release()
        return self.kept

    def _keep_flight(self, failures, interrupted: str | None = None) -> None:
        """Write run.json beside the flight records (exit codes, failures, interruption); read them back."""
        from distlab.runtime.diagnosis.flight_read import keep
        self.flight = keep(self.dump_dir or self.run_dir, [p.returncode for p in self.procs],
                           [{"rank": f[3], "message": f[4]} for f in failures], interrupted)

    def stop(self) -> None:
        """End every rank still running (SIGTERM to the group, SIGKILL after 2 s) and reap them all."""
        if not self.procs:
            return
        alive = [p for p in self.procs if p.poll() is None]
        if alive:
            _signal_all(self.pgid, alive, signal.SIGTERM)
            end = time.monotonic() + 2.0
            while time.monotonic() < end and any(p.poll() is None for p in alive):
                time.sleep(0.02)
            _signal_all(self.pgid, [p for p in alive if p.poll() is None], signal.SIGKILL)
        for p in self.procs:
            p.wait()


def _signal(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _group_kwargs(pgid: int) -> dict:
    """Popen arguments that put the child in process group ``pgid`` (0: a new group led by the child)."""
    if sys.version_info >= (3, 11):
        return {"process_group": pgid}
    return {"preexec_fn": lambda: os.setpgid(0, pgid)}          # Python 3.10


def _signal_all(pgid, procs, sig) -> None:
    if not procs:
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for p in procs:                       # in case one left the group
        try:
            p.send_signal(sig)
        except ProcessLookupError:
            pass


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


def _signal_name(e: BaseException) -> str | None:
    """'SIGINT' for Ctrl-C, 'SIGTERM' for a SIGTERM to the launcher, None for any other exception."""
    if not isinstance(e, KeyboardInterrupt):
        return None
    return e.args[0] if e.args and isinstance(e.args[0], str) else "SIGINT"


def _sigterm_as_interrupt():
    try:
        return signal.signal(signal.SIGTERM, _raise_interrupt)
    except ValueError:                     # not the main thread
        return None


def _restore_sigterm(old) -> None:
    if old is not None:
        signal.signal(signal.SIGTERM, old)


def launch(target: str, payload, nproc: int, on_poll=None, **kwargs) -> list:
    """Run ``target(ctx, payload)`` on ``nproc`` local ranks; the list of their return values."""
    return Launch(target, payload, nproc, **kwargs).start().wait(on_poll=on_poll)
