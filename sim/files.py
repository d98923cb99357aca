"""Writing results safely: atomic, durable, never through a planted link, kept when the disk refuses; output locks.

    write_atomic("out/trace.json", text)          # temp file + fsync + rename + fsync of the folder
    with OutputLock("out/trace.json", "--out"):   # a second run on the same output refuses in one line
        ...

Students share lab machines and folders: a file distlab writes into a user's folder is created with
O_CREAT | O_EXCL | O_NOFOLLOW beside its destination and renamed over it, so a symbolic link someone planted
there is replaced, never written through, and a crash leaves the old file or the new one, never half of each
(fsync of the file, then of the folder, as the POSIX rename idiom needs for durability). A full or read-only disk
does not lose a finished measurement: the bytes go to a private folder in the temporary folder and the error
says where (OutputError: one line, exit 1).
"""
from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat

from distlab.sim.errors import ConfigError, OutputError

KEPT_PREFIX = "distlab-kept-"


def write_atomic(path: str, data: str | bytes, keep_copy: bool = True) -> None:
    """Write to a private temporary file beside ``path`` (O_CREAT | O_EXCL | O_NOFOLLOW), fsync it, rename it
    over ``path``, fsync the folder: a reader never sees half a file, and after a crash the file is the old one
    or the new one. The rename replaces a symbolic link at ``path`` rather than writing where it points (a link
    planted in a shared folder cannot redirect the write), except a link to a device or pipe (/dev/stdout) that
    belongs to this user or root, which is written through, as is a device or pipe given directly (/dev/null).
    The file gets the permissions the umask gives (0666 & ~umask, as open() does; an existing file keeps its
    mode). Creates no folders. When the write fails (a full or read-only disk), the data is kept in a private
    folder ``distlab-kept-*`` in the temporary folder (unless ``keep_copy`` is False) and OutputError names the path,
    the error and that copy."""
    full = os.path.abspath(path)
    data = data.encode("utf-8") if isinstance(data, str) else data
    try:
        _write(full, data)
    except OSError as e:
        kept, kept_error = keep(os.path.basename(full) or "output", data) if keep_copy else (None, None)
        raise OutputError(str(path), e.strerror or str(e), kept, kept_error) from None


def _write(full: str, data: bytes) -> None:
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode) and st.st_uid in (os.getuid(), 0):
        try:
            target = os.stat(full)
        except FileNotFoundError:
            target = None
        if target is not None and (stat.S_ISCHR(target.st_mode) or stat.S_ISFIFO(target.st_mode)):
            return _write_through(full, data)
    elif st is not None and (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
        return _write_through(full, data)
    folder = os.path.dirname(full)
    tmp = os.path.join(folder, f".{os.path.basename(full)}.tmp-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)   # & ~umask
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if st is not None and stat.S_ISREG(st.st_mode):
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
        os.replace(tmp, full)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_folder(folder)


def _write_through(full: str, data: bytes) -> None:
    """A device or pipe: written as it is (no temporary file beside it, no rename)."""
    fd = os.open(full, os.O_WRONLY | os.O_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def fsync_folder(folder: str) -> None:
    """Make a rename or a new file in ``folder`` durable (file systems that cannot fsync a folder are skipped)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EROFS, errno.EBADF):
            raise
    finally:
        os.close(fd)


def keep(name: str, data: bytes) -> tuple[str | None, str | None]:
    """Save ``data`` as ``name`` in a new private folder (0700) in the temporary folder: (its path, None), or
    (None, the error) when that fails too."""
    import tempfile
    try:
        folder = tempfile.mkdtemp(prefix=KEPT_PREFIX)
        path = os.path.join(folder, name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return path, None
    except OSError as e:
        return None, e.strerror or str(e)


class OutputLock:
    """An exclusive lock on an output (a file, or a folder such as --dump-dir), held while a run writes it: a
    second run on the same output refuses in one line instead of clearing or overwriting the first's files.

    The lock is ``flock`` on ``.NAME.lock`` beside a file, or ``.distlab.lock`` inside a folder (opened with
    O_NOFOLLOW; it works across processes and, on NFS, across hosts); it holds the owner's PID and is removed
    on release. A run killed by SIGKILL leaves the file behind, but not the lock: the next run takes it."""

    def __init__(self, path: str, flag: str, folder: bool = False):
        full = os.path.abspath(path)
        self.path, self.flag = path, flag
        self.lock_path = (os.path.join(full, ".distlab.lock") if folder else
                          os.path.join(os.path.dirname(full), f".{os.path.basename(full)}.lock"))
        self.fd: int | None = None

    def acquire(self) -> "OutputLock":
        import fcntl
        for _ in range(5):
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except OSError as e:
                raise ConfigError(f"cannot lock {self.path} ({self.lock_path}): {e.strerror}", self.flag) from None
            st = os.fstat(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                owner = os.pread(fd, 32, 0).decode(errors="replace").strip()
                os.close(fd)
                raise ConfigError(f"another distlab run{f' (pid {owner})' if owner else ''} is writing {self.path}; "
                                  f"wait for it to end, or give another {self.flag}", self.flag) from None
            try:
                now = os.lstat(self.lock_path)
            except FileNotFoundError:
                now = None
            if now is None or now.st_ino != st.st_ino:        # released and removed meanwhile: lock the new one
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            self.fd = fd
            return self
        raise ConfigError(f"cannot lock {self.path}: its lock file keeps changing", self.flag)

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            if os.lstat(self.lock_path).st_ino == os.fstat(self.fd).st_ino:
                os.unlink(self.lock_path)
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def save_figure(fig, path: str) -> None:
    """Save a matplotlib figure atomically (format from the file name) and close it. A figure marked
    ``fig.distlab_fast = True`` laid itself out: it is saved in one draw (no tight bounding box) and, as a
    PNG, with light compression (zlib level 1), which matters for figures of thousands of bars."""
    import io
    import sys
    buf = io.BytesIO()
    fmt = os.path.splitext(path)[1].lstrip(".").lower() or "png"
    fast = getattr(fig, "distlab_fast", False)
    extra = {"bbox_inches": "tight"} if not fast else ({"pil_kwargs": {"compress_level": 1}} if fmt == "png" else {})
    fig.savefig(buf, format=fmt, dpi=120, **extra)
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close(fig)
    write_atomic(path, buf.getvalue())
