"""Many independent simulations at once: on local processes by default, or on a Dask distributed cluster given
its scheduler's address.

    results = run_many(simulate_case, cases)                               # local processes, in case order
    results = run_many(simulate_case, cases, scheduler="tcp://host:8786")  # an existing Dask cluster

``fn`` is a module-level function (the workers import it by name) and every case is picklable (a dict, a
scenario); with ``shared`` every call is ``fn(shared, case)`` and ``shared`` goes to each worker once (forked
processes inherit it; Dask scatters it to every worker). The simulator is deterministic, so the results are
the same on one process, on local processes or on a cluster (tests/test_jobs_many.py compares them).

- Local: ``workers`` processes (default: the CPUs, at most 2: a laptop stays usable), forked on Linux (nothing
  is pickled on the way in), else spawned (macOS lists fork but its system libraries start threads that a forked
  child can crash on: CPython's multiprocessing docs, "Contexts and start methods", bpo-33725, which made spawn
  macOS's default); one process when there is one worker or one case.
- Dask distributed (``pip install 'distlab[dask]'``): the cases are submitted to the scheduler at ``scheduler``
  (a cluster you started: ``dask scheduler`` and ``dask worker`` on each machine, or any Dask deployment) and
  gathered in order. Dask, not Ray: pure Python (a small pip install, no binary runtime), a LocalCluster starts
  in seconds for a test, and its client maps a function over picklable cases, which is all this needs.

Trust (docs/security.md): Dask moves the function, the cases and the results as pickles in both directions, so
whoever runs the scheduler or a worker runs code in this process (a result is unpickled here), and this process's
cases run as code there. Give ``--scheduler`` only a cluster you trust as yourself. An address off this machine
without TLS (``tls://``) is refused unless ``--insecure-scheduler`` is given: on an open network anyone on the
path could read or replace those pickles.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys

from distlab.sim.errors import ConfigError

CONNECT_S = 10.0       # how long to wait for a Dask scheduler before giving up

_SHARED: dict = {}     # what forked workers read (set by the parent before the fork)


def can_fork() -> bool:
    """Local workers are forked here (they inherit ``shared`` without pickling it): Linux only (module docstring)."""
    return sys.platform.startswith("linux") and "fork" in mp.get_all_start_methods()


def worker_count(workers: int | None) -> int:
    """Local processes: ``workers`` if given, else the CPUs, at most 2."""
    return max(1, workers if workers is not None else min(2, os.cpu_count() or 1))


def run_many(fn, cases: list, *, workers: int | None = None, scheduler: str | None = None, shared=None,
             progress=None) -> list:
    """``[fn(case) for case in cases]`` (or ``fn(shared, case)``), run at once (module docstring);
    ``progress(done, total)`` is called as results arrive."""
    cases = list(cases)
    if scheduler:
        return _dask(fn, cases, scheduler, shared, progress)
    n = min(worker_count(workers), len(cases))
    if n <= 1:
        out = []
        for i, case in enumerate(cases):
            out.append(fn(case) if shared is None else fn(shared, case))
            if progress:
                progress(i + 1, len(cases))
        return out
    method = "fork" if can_fork() else "spawn"
    out: list = [None] * len(cases)
    _SHARED["value"] = shared
    try:
        with mp.get_context(method).Pool(n, initializer=_receive, initargs=(shared if method == "spawn" else None,
                                                                          method)) as pool:
            for done, (i, result) in enumerate(pool.imap_unordered(_local, [(fn, i, c) for i, c in
                                                                             enumerate(cases)])):
                out[i] = result
                if progress:
                    progress(done + 1, len(cases))
    finally:
        _SHARED.clear()
    return out


def _receive(shared, method: str) -> None:
    """A pool worker leaves Ctrl-C to the parent (the terminal sends SIGINT to the whole process group): the
    parent ends the pool and exits 130 in one line, instead of every worker printing a KeyboardInterrupt
    traceback."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if method == "spawn":
        _SHARED["value"] = shared


def _local(task):
    fn, i, case = task
    shared = _SHARED.get("value")
    return i, (fn(case) if shared is None else fn(shared, case))


def _call(fn, shared, case):
    return fn(case) if shared is None else fn(shared, case)


def _dask(fn, cases: list, scheduler: str, shared, progress) -> list:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise ConfigError("running on a Dask cluster needs Dask distributed: pip install 'distlab[dask]'",
                          "--scheduler") from None
    try:
        client = Client(scheduler, timeout=CONNECT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as e:
        raise ConfigError(f"cannot reach a Dask scheduler at {scheduler!r} ({type(e).__name__}: {e}); allowed: "
                          "the address `dask scheduler` prints, e.g. tcp://10.0.0.1:8786", "--scheduler") from None
    with client:
        held = client.scatter(shared, broadcast=True) if shared is not None else None
        futures = client.map(_call, [fn] * len(cases), [held] * len(cases), cases, pure=False)
        if progress:
            for done, _ in enumerate(as_completed(futures)):
                progress(done + 1, len(cases))
        return client.gather(futures)


LOOPBACK = ("localhost", "127.0.0.1", "::1", "[::1]")


def add_insecure_flag(p) -> None:
    """``--insecure-scheduler``, beside a command's ``--scheduler``."""
    p.add_argument("--insecure-scheduler", action="store_true", help="allow a --scheduler off this machine without "
                   "TLS (tcp://): Dask moves pickles both ways, so anyone on the path could run code here")


def check_scheduler(address: str | None, insecure: bool = False) -> None:
    """A scheduler address is loopback, or TLS (``tls://``), or ``insecure`` was asked for; else ConfigError."""
    if address is None:
        return
    scheme, sep, rest = str(address).partition("://")
    scheme, rest = (scheme.lower(), rest) if sep else ("tcp", str(address))
    if scheme in ("tls", "inproc"):
        return
    host = rest.rsplit(":", 1)[0] if rest.count(":") == 1 or rest.startswith("[") else rest
    if host in LOOPBACK or host.startswith("127."):
        return
    if not insecure:
        raise ConfigError(f"{address!r} is off this machine and not TLS: Dask moves the cases and results as pickles "
                          "both ways, so anyone on the path could run code here; use tls://HOST:PORT, or add "
                          "--insecure-scheduler on a network you trust", "--scheduler")
