"""How a rank joins its run: the run's secret, where rank 0 serves the store, and the process group on top.

    store = run_store(rank, world, timeout_s, on_refused)          # runtime/ranks/worker.py's init()
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)

torch.distributed trusts its network: torch's TCPStore serves anyone who reaches its port, on every interface,
and torchrun's c10d rendezvous unpickles the state it reads from its store (torch/distributed/elastic/
rendezvous/dynamic_rendezvous.py), so whoever reaches those ports can join a run or run code in it. distlab's
ranks instead use runtime/ranks/store.py, served by rank 0 to processes that prove they know the run's secret, and
exchange no pickles (runtime/execute/wire.py). docs/security.md has the whole picture.

- **Local runs** (runtime/ranks/launch.py): the launcher draws a new secret per run and gives it to its ranks in
  DISTLAB_RUN_SECRET (a process's environment is readable by its own user only: /proc/PID/environ is 0400).
  Rank 0 serves the store on 127.0.0.1:MASTER_PORT and Gloo listens on the loopback interface
  (GLOO_SOCKET_IFNAME=lo, set by the launcher), so nothing of a local run is reachable from another machine,
  and another local user who connects is refused.
- **Under torchrun** (`distlab run --nnodes`, a bare torchrun, the elastic tool): the user gives every rank the
  same secret, DISTLAB_RUN_SECRET (at least 16 characters) or DISTLAB_RUN_SECRET_FILE (a file only its owner
  can read, e.g. on a shared file system); a rank without one refuses to start. On one node rank 0 serves on
  127.0.0.1; across nodes on every interface at MASTER_ADDR:MASTER_PORT (the other nodes must reach it). When
  torchrun shares its own store with the ranks (TORCHELASTIC_USE_AGENT_STORE=True: MASTER_PORT is that store's
  port), rank 0 takes a free port and announces it in torchrun's store under ``distlab/store/attempt_N``; the
  announcement is not secret, and a forged one leads the ranks to a program that cannot prove it knows the
  secret, which they refuse.

Every rank then checks in (key ``distlab/joined/R``) and rank 0 waits, up to the timeout, until all have: a rank
that never authenticates (a node started by someone else, or without the secret) is named, instead of the run
hanging in Gloo's setup.
"""
from __future__ import annotations

import os
import socket
import time
from datetime import timedelta

import torch.distributed as dist

from distlab.runtime.ranks.secret import run_secret
from distlab.runtime.ranks.store import StoreError, StoreServer, call, connect

ANNOUNCE_KEY = "distlab/store/attempt_{}"
JOINED = "distlab/joined/{}"
_SERVERS: list = []                 # rank 0's store server, alive as long as the process
# Every AuthStore handed to torch, kept alive here: torch holds the C++ side only, and a Python store that is
# garbage-collected leaves torch calling methods that are gone ("fn INTERNAL ASSERT FAILED ... Not implemented").
_STORES: list = []


class AuthStore(dist.Store):
    """torch's Store interface over one authenticated connection to the run's store (runtime/ranks/store.py)."""

    def __init__(self, secret: bytes, host: str, port: int, timeout_s: float):
        super().__init__()
        import threading
        self._lock = threading.Lock()
        self._args = (secret, host, port, timeout_s)
        self._where = f"{host}:{port}"
        self._sock = connect(secret, host, port, time.monotonic() + timeout_s)
        self.set_timeout(timedelta(seconds=timeout_s))
        _STORES.append(self)

    def clone(self) -> "AuthStore":
        """Another connection to the same store (Gloo takes one per process group)."""
        return AuthStore(*self._args)

    def _call(self, *parts) -> list[bytes]:
        with self._lock:
            try:
                reply = call(self._sock, *[_bytes(p) for p in parts])
            except OSError as e:
                raise StoreError(f"lost the run's store at {self._where}: {e}") from None
        if reply[0] == b"timeout":
            raise dist.DistStoreError(f"waited {self.timeout.total_seconds():g} s for {parts[1:3]!r} in the run's "
                                      f"store at {self._where}")
        return reply[1:]

    def _ms(self, timeout=None) -> str:
        return str(int((timeout or self.timeout).total_seconds() * 1000))

    def set(self, key, value) -> None:
        self._call("set", key, value)

    def get(self, key) -> bytes:
        return self._call("get", key, self._ms())[0]

    def add(self, key, value) -> int:
        return int(self._call("add", key, str(int(value)))[0])

    def compare_set(self, key, expected_value, desired_value) -> bytes:
        return self._call("cas", key, expected_value, desired_value)[0]

    def append(self, key, value) -> None:
        self._call("append", key, value)

    def multi_get(self, keys) -> list[bytes]:
        return self._call("mget", self._ms(), *keys)

    def multi_set(self, keys, values) -> None:
        self._call("mset", *[x for kv in zip(keys, values) for x in kv])

    def check(self, keys) -> bool:
        return self._call("check", *keys)[0] == b"1"

    def wait(self, keys, timeout=None) -> None:
        self._call("wait", self._ms(timeout), *keys)

    def delete_key(self, key) -> bool:
        return self._call("del", key)[0] == b"1"

    def num_keys(self) -> int:
        return int(self._call("num")[0])

    def has_extended_api(self) -> bool:
        return True


def _bytes(value) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def run_store(rank: int, world: int, timeout_s: float, on_refused=None) -> AuthStore:
    """This rank's connection to the run's store; rank 0 first starts serving it (the module docstring).
    ``on_refused(address, reason)``: called on rank 0 for a peer that failed the handshake."""
    secret = run_secret()
    local = "DISTLAB_RUN_DIR" in os.environ or os.environ.get("LOCAL_WORLD_SIZE", str(world)) == str(world)
    host = "127.0.0.1" if local else os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "0") or 0)
    shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if rank == 0:
        server = StoreServer(secret, "127.0.0.1" if local else "", 0 if shared else port, on_refused)
        _SERVERS.append(server)
        if shared:
            _agent_store(timeout_s).set(_announce_key(), str(server.port))
        port = server.port
    elif shared:
        try:
            port = int(_agent_store(timeout_s).get(_announce_key()))
        except (RuntimeError, ValueError) as e:
            raise StoreError(f"rank 0 did not announce the run's store in torchrun's store within {timeout_s:g} s: "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    store = AuthStore(secret, host, port, timeout_s)
    store.set(JOINED.format(rank), socket.gethostname())
    if rank == 0:
        _wait_for_ranks(store, world, timeout_s)
    return store


def _wait_for_ranks(store: AuthStore, world: int, timeout_s: float) -> None:
    """Rank 0 waits until every rank has authenticated, and names those that did not."""
    keys = [JOINED.format(r) for r in range(world)]
    try:
        store.wait(keys)
    except dist.DistStoreError:
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        some = ", ".join(map(str, missing[:8])) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise StoreError(f"rank{'s' if len(missing) > 1 else ''} {some} did not join the run's store within "
                         f"{timeout_s:g} s: not started, or started without this run's secret "
                         f"(DISTLAB_RUN_SECRET; a program other than distlab's ranks?)") from None


def _announce_key() -> str:
    return ANNOUNCE_KEY.format(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _agent_store(timeout_s: float):
    """A client of the store torchrun shares with its ranks (MASTER_ADDR:MASTER_PORT): only for the announcement."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                         timedelta(seconds=timeout_s))
