"""The flight recorder: every rank keeps its last N collectives, so a hung or failed run can be diagnosed.

Each record: the sequence number on its communicator (group and stream; the k-th collective a rank issues on a
communicator meets the k-th of every other member), op, group, stream, bytes, dtype, root, the plan's op index,
and state ``issued`` (called), ``started`` (handed to the backend, the rank now waits in it) or ``completed``,
with the time of each.

Records live in ``flight.R.ring``, a small memory-mapped file (a JSON header, then N fixed 64-byte slots
written in place on every state change: about a microsecond, no system call), so even a rank killed by
SIGKILL leaves its last state on disk. On a timeout, an error, SIGTERM or SIGINT the rank also writes
``flight.R.json`` (atomically): the same records, decoded, with the reason. A thread woken through
signal.set_wakeup_fd writes it at once, even while the main thread is blocked inside a collective.
``distlab diagnose DIR`` (runtime/diagnosis/diagnose.py) reads either, through runtime/diagnosis/flight_read.py.
"""
from __future__ import annotations

import itertools
import json
import mmap
import os
import signal
import stat
import struct
import threading
import time

from distlab.sim.errors import ConfigError, OutputError
from distlab.sim.plan import COLLECTIVES, DTYPE_BYTES

FORMAT = "distlab-flight/1"
STATES = ("empty", "issued", "started", "completed")
DTYPES = tuple(DTYPE_BYTES)
HEADER = 1 << 16
SLOT = struct.Struct("<qqiiqiBBBxddd")    # gen, seq, key, index, bytes, root, op, dtype, state, t x 3
CAPACITY = int(os.environ.get("DISTLAB_FLIGHT_SIZE", "1024"))


MAX_WORLD = 1 << 17                 # ranks a flight record may claim (diagnose builds a row per rank)
MAX_CAPACITY = 1 << 16              # slots a ring's header may claim


def _whole(x, lo: int, hi: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and lo <= x < hi


def open_ring(path: str, size: int, dir_fd: int | None = None) -> int:
    """A ring file's descriptor, ``size`` bytes allocated on disk (posix_fallocate): a full disk is an error here,
    before the run, not a SIGBUS in the middle of it (a sparse file written through mmap gets its blocks on the
    first write). Never through a symbolic link (O_NOFOLLOW), and only a regular file of this user: a link planted
    in a shared --dump-dir cannot make a rank overwrite another file."""
    try:
        fd = os.open(path if dir_fd is None else os.path.basename(path),
                     os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    except OSError as e:
        raise ConfigError(f"{path} cannot be opened ({e.strerror}); distlab writes flight records only into files "
                          f"it creates, never through a symbolic link: remove it or choose another folder",
                          "--dump-dir") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_nlink > 1:
        os.close(fd)
        raise ConfigError(f"{path} is not a file of yours that distlab created; it is left as it is: remove it or "
                          f"choose another folder", "--dump-dir")
    try:
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        os.close(fd)
        raise OutputError(path, f"cannot allocate the {size // 1024} KiB flight ring ({e.strerror})",
                          kept_error="nothing was measured yet") from None
    return fd


def checked_folder_id() -> tuple[int, int] | None:
    """(device, inode) of the flight folder the launcher checked (DISTLAB_FLIGHT_DIR_ID="DEV:INO"), or None
    (under torchrun): a rank opens the folder again by its path and refuses any other folder found there."""
    text = os.environ.get("DISTLAB_FLIGHT_DIR_ID", "")
    dev, _, ino = text.partition(":")
    return (int(dev), int(ino)) if dev.isdigit() and ino.isdigit() else None


def create_rings(directory: str, world_size: int) -> None:
    """Allocate every rank's ring before any rank starts (the launcher): a full disk or a planted link is one line
    now; each rank then opens its own (``Recorder``)."""
    for r in range(world_size):
        os.close(open_ring(os.path.join(directory, f"flight.{r}.ring"), HEADER + CAPACITY * SLOT.size))


def _ranges(ranks) -> list:
    out: list = []
    for r in ranks:
        if out and out[-1][1] == r - 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return out


def _unranges(ranges) -> list[int]:
    return [r for a, b in ranges for r in range(a, b + 1)]


class Recorder:
    """One rank's ring of the last ``capacity`` collectives in ``directory``/flight.RANK.ring."""

    def __init__(self, directory: str, rank: int, world_size: int, capacity: int = CAPACITY):
        from distlab.sim.files import make_folder, open_folder
        self.directory, self.rank, self.world_size, self.capacity = directory, rank, world_size, capacity
        self.path = os.path.join(directory, f"flight.{rank}.ring")
        self.expect = checked_folder_id()
        if self.expect is None:
            make_folder(directory, "--dump-dir")          # under torchrun: no launcher made it
        folder_fd = open_folder(directory, "--dump-dir", expect=self.expect)
        try:
            fd = open_ring(self.path, HEADER + capacity * SLOT.size, dir_fd=folder_fd)
        finally:
            os.close(folder_fd)
        try:
            self.mm = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        self.keys: list[tuple] = []
        self.key_ids: dict[tuple, int] = {}
        self.next_seq: list[int] = []
        self.gen = itertools.count()
        self.wall0, self.mono0 = time.time(), time.perf_counter()
        self.reason: str | None = None
        self._lock = threading.Lock()
        self._pack = SLOT.pack_into
        self.enqueued: list = []                # GPU: started (on a CUDA stream), completed at the next sync
        self._write_header()

    def _write_header(self) -> None:
        head = json.dumps({"format": FORMAT, "rank": self.rank, "world_size": self.world_size, "pid": os.getpid(),
                           "capacity": self.capacity, "slot_bytes": SLOT.size, "wall0": self.wall0,
                           "mono0": self.mono0, "keys": [[_ranges(g), s] for g, s in self.keys]}).encode()
        if len(head) >= HEADER:
            raise ConfigError(f"too many process groups for the flight recorder ({len(self.keys)})", "flight")
        self.mm[:HEADER] = head.ljust(HEADER, b" ")

    def key(self, group, stream: str = "") -> int:
        """The id of communicator (group ranks, stream), registered on first use (not on the hot path)."""
        k = (tuple(group), stream)
        if k not in self.key_ids:
            with self._lock:
                if k not in self.key_ids:
                    self.keys.append(k)
                    self.next_seq.append(0)
                    self._write_header()
                    self.key_ids[k] = len(self.keys) - 1
        return self.key_ids[k]

    # -- the hot path: three slot writes per collective ------------------------------------------------------
    def issued(self, key: int, op: int, nbytes: int, dtype: int, root: int, index: int = -1) -> list:
        seq = self.next_seq[key]
        self.next_seq[key] = seq + 1
        gen = next(self.gen)
        rec = [gen, seq, key, index, nbytes, root, op, dtype, 1, time.perf_counter(), 0.0, 0.0,
               HEADER + (gen % self.capacity) * SLOT.size]
        self._pack(self.mm, rec[12], *rec[:12])
        return rec

    def started(self, rec: list) -> None:
        rec[8], rec[10] = 2, time.perf_counter()
        self._pack(self.mm, rec[12], *rec[:12])

    def completed(self, rec: list) -> None:
        rec[8], rec[11] = 3, time.perf_counter()
        self._pack(self.mm, rec[12], *rec[:12])

    def wrap(self, start, key: int, op: str, nbytes: int, dtype: str, root: int, index: int, block: bool = True):
        """``start()`` issues a collective and returns its work handle; the returned callable records it and
        (``block``) waits for it, or (GPU streams) returns the handle once enqueued."""
        codes = (key, COLLECTIVES.index(op), nbytes, DTYPES.index(dtype), root, index)
        issued, started, completed, enqueued = self.issued, self.started, self.completed, self.enqueued

        def run():
            rec = issued(*codes)
            work = start()
            started(rec)
            if not block:
                enqueued.append(rec)
                return work
            work.wait()
            completed(rec)
        return run

    def synchronized(self) -> None:
        """The GPU streams were synchronized: every enqueued collective has completed."""
        while self.enqueued:
            self.completed(self.enqueued.pop(0))

    # -- dumps -----------------------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        return decode(bytes(self.mm))

    def dump(self, reason: str) -> str | None:
        """Write flight.RANK.json (atomically) with the records and ``reason``; the first reason is kept. None when
        it cannot be written (a full disk): the ring on disk still holds the records."""
        from distlab.sim.io import write_atomic
        with self._lock:
            self.reason = self.reason or reason
            d = self.snapshot()
            d.update(reason=self.reason, dumped_at=time.time())
            path = os.path.join(self.directory, f"flight.{self.rank}.json")
            try:
                write_atomic(path, json.dumps(d, indent=1), keep_copy=False, expect=self.expect)
            except OutputError:
                return None
        return path

    def watch_signals(self) -> None:
        """Dump at once on SIGTERM or SIGINT, even while the main thread is blocked in a collective (main
        thread only; the Python handlers still run afterwards)."""
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            signal.set_wakeup_fd(w)
        except ValueError:                  # not the main thread
            os.close(r), os.close(w)
            return
        names = {int(signal.SIGTERM): "SIGTERM", int(signal.SIGINT): "SIGINT"}

        def watch():
            while True:
                for b in os.read(r, 64):
                    if b in names:
                        self.dump(f"signal {names[b]}")
        threading.Thread(target=watch, daemon=True, name="flight-signals").start()

    def watch_dist(self) -> None:
        """Record plain torch.distributed calls of this process too (a task's own code, not a plan)."""
        from distlab.runtime.diagnosis.flight_dist import patch
        patch(self)


def decode(data: bytes) -> dict:
    """A ring file's bytes -> {"rank", "world_size", "pid", "records": [oldest first]} (times: Unix seconds)."""
    try:
        head = json.loads(data[:HEADER].decode().strip())
        if head.get("format") != FORMAT:
            raise ValueError
    except (ValueError, UnicodeDecodeError):
        raise ConfigError("not a flight record (distlab-flight/1)", "flight") from None
    if not (_whole(head.get("capacity"), 1, MAX_CAPACITY + 1) and _whole(head.get("world_size"), 1, MAX_WORLD + 1)
            and isinstance(head.get("keys"), list) and len(head["keys"]) < 4096):
        raise ConfigError("a flight ring whose header is out of range", "flight")
    n = head["world_size"]
    for key in head["keys"]:
        if not (isinstance(key, list) and len(key) == 2 and isinstance(key[0], list) and isinstance(key[1], str)
                and all(isinstance(ab, list) and len(ab) == 2 and _whole(ab[0], 0, n) and _whole(ab[1], ab[0], n)
                        for ab in key[0])):
            raise ConfigError("a flight ring whose groups are malformed or name ranks outside the world", "flight")
    keys = [(_unranges(g), s) for g, s in head["keys"]]
    records = []
    end = min(len(data), HEADER + head["capacity"] * SLOT.size)
    for off in range(HEADER, end - SLOT.size + 1, SLOT.size):
        gen, seq, key, index, nbytes, root, op, dtype, state, t0, t1, t2 = SLOT.unpack_from(data, off)
        if state == 0 or not 0 <= key < len(keys) or op >= len(COLLECTIVES) or state >= len(STATES):
            continue                          # empty, or torn by a kill in the middle of a write
        group, stream = keys[key]
        wall = head["wall0"] - head["mono0"]
        records.append({"gen": gen, "seq": seq, "op": COLLECTIVES[op], "group": group, "stream": stream,
                        "bytes": nbytes, "dtype": DTYPES[dtype] if dtype < len(DTYPES) else "other", "root": root,
                        "index": index, "state": STATES[state], "t_issued": wall + t0,
                        "t_started": wall + t1 if t1 else None, "t_completed": wall + t2 if t2 else None})
    records.sort(key=lambda x: x["gen"])
    return {"format": FORMAT, "rank": head["rank"], "world_size": head["world_size"], "pid": head["pid"],
            "capacity": head["capacity"], "records": records}


def clear(directory: str) -> None:
    """Remove old flight records and run.json from ``directory`` (before a new run writes there). The folder is
    opened without following a link at it (sim/files.py open_folder) and every step is relative to it; only
    regular files of this user: a symbolic link or another user's file there is refused (ConfigError), not
    followed."""
    from distlab.sim.files import open_folder
    if not os.path.lexists(directory):
        return
    fd = open_folder(directory, "--dump-dir")
    try:
        names = [n for n in os.listdir(fd)
                 if (n.startswith("flight.") and n.endswith((".json", ".ring"))) or n == "run.json"]
        for name in names:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file of yours"
                raise ConfigError(f"{os.path.join(directory, name)} is {what}; distlab never writes through it "
                                  f"nor removes it: remove it yourself or choose another folder", "--dump-dir")
        for name in names:
            os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)
