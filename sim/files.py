"""Writing results safely: atomic, durable, never through a planted link, kept when the disk refuses; output locks.

    write_atomic("out/trace.json", text)          # temp file + fsync + rename + fsync of the folder
    with OutputLock("out/trace.json", "--out"):   # a second run on the same output refuses in one line
        ...

Students share lab machines and folders (issues 32 and 41). The folder is opened once with O_DIRECTORY |
O_NOFOLLOW and checked (``open_folder``: yours or root's, not writable by others unless sticky, as OpenSSH
checks its key folders), and every step is relative to that descriptor, so a link at the folder itself cannot
redirect the write. A file is created beside its destination with O_CREAT | O_EXCL | O_NOFOLLOW and renamed over
it, so a symbolic link someone planted there is replaced, never written through, and a crash leaves the old file
or the new one, never half of each (fsync of the file, then of the folder, as the POSIX rename idiom needs for
durability); a FIFO, socket or device there is refused. A full or read-only disk does not lose a finished measurement:
the bytes go to a private folder in the temporary folder and the error says where (OutputError: one line, exit
1). Lock files are made exclusively and checked (``OutputLock``); while a command runs, sim/io.py
``check_output`` holds the lock of each output it checks (``hold_lock``) until the command ends.
"""
from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat

from distlab.sim.errors import ConfigError, OutputError

KEPT_PREFIX = "distlab-kept-"


def write_atomic(path: str, data: str | bytes, keep_copy: bool = True, expect: tuple | None = None) -> None:
    """Write to a private temporary file beside ``path`` (O_CREAT | O_EXCL | O_NOFOLLOW), fsync it, rename it
    over ``path``, fsync the folder: a reader never sees half a file, and after a crash the file is the old one
    or the new one. The folder is opened once without following a link at it (``open_folder``: yours or root's,
    not writable by others) and every step is relative to that descriptor, so a link planted at the folder or
    swapped in meanwhile cannot redirect the write. The rename replaces a symbolic link at ``path`` rather than
    writing where it points; a FIFO, socket or device there, or a link to one, is refused (a reader would get
    the bytes; without one the write blocks forever; /dev/null or /dev/full is not a result file). The file gets the permissions
    the umask gives (0666 & ~umask, as open() does; an existing file keeps its mode). Creates no folders. When
    the write fails (a full or read-only disk, an unsafe folder), the data is kept in a private folder
    ``distlab-kept-*`` in the temporary folder (unless ``keep_copy`` is False) and OutputError names the path,
    the error and that copy. ``expect``: the folder's (device, inode) when another process checked it (a rank
    writing into the --dump-dir its launcher checked): a different folder there now is refused."""
    full = os.path.abspath(path)
    data = data.encode("utf-8") if isinstance(data, str) else data
    try:
        folder_fd = open_folder(os.path.dirname(full), expect=expect)
        try:
            _write(folder_fd, os.path.basename(full), data)
        finally:
            os.close(folder_fd)
    except (OSError, ConfigError) as e:
        why = (e.strerror or str(e)) if isinstance(e, OSError) else str(e)
        kept, kept_error = keep(os.path.basename(full) or "output", data) if keep_copy else (None, None)
        raise OutputError(str(path), why, kept, kept_error) from None


def _write(folder_fd: int, name: str, data: bytes) -> None:
    try:
        st = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        try:
            target = os.stat(name, dir_fd=folder_fd)
        except OSError:
            target = None                      # a dangling link: replaced
        if target is not None and not stat.S_ISREG(target.st_mode):
            raise ConfigError(f"{name} is a link to {kind_of(target.st_mode)}, not a regular file; distlab writes "
                              "only regular files")
    elif st is not None and not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{name} is {kind_of(st.st_mode)}, not a regular file; distlab writes only regular files")
    tmp = f".{name}.tmp-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,   # & ~umask
                 dir_fd=folder_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if st is not None and stat.S_ISREG(st.st_mode):
                os.fchmod(f.fileno(), stat.S_IMODE(st.st_mode))
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder_fd)
        raise
    _fsync_fd(folder_fd)


def kind_of(mode: int) -> str:
    """'a FIFO (named pipe)', 'a socket', ... for error lines."""
    for test, what in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return what
    return "not a regular file"


def folder_problem(st, uid: int | None = None, gid: int | None = None) -> str | None:
    """Why a folder with this ``os.stat`` result must not be written into, or None: owned by a user other than
    this one or root, writable by other users (unless sticky, as /tmp: then no one may replace another's
    file), or writable by a group other than this user's own. OpenSSH refuses its key folders alike
    (StrictModes, auth.c ``secure_filename``)."""
    uid = os.getuid() if uid is None else uid
    gid = os.getgid() if gid is None else gid
    sticky = st.st_mode & stat.S_ISVTX
    if st.st_uid not in (uid, 0):
        return f"owned by another user (uid {st.st_uid})"
    if st.st_mode & 0o002 and not sticky:
        return f"writable by every user (mode {stat.S_IMODE(st.st_mode):o})"
    if st.st_mode & 0o020 and not sticky and st.st_gid != gid:
        return f"writable by group {st.st_gid} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def open_folder(path: str, flag: str | None = None, expect: tuple | None = None) -> int:
    """A descriptor of the folder ``path``, opened with O_DIRECTORY | O_NOFOLLOW (a symbolic link at the folder
    itself is refused, not followed) and checked by ``folder_problem``, and the way to it by ``path_problem``
    (every parent up to /, every link on the way); with ``expect``, it must be the folder of that (device,
    inode), the one another process checked; ConfigError naming what is wrong."""
    try:
        fd = os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP or (e.errno == errno.ENOTDIR and os.path.islink(path)):
            raise ConfigError(f"{path} is a symbolic link; distlab writes only into a real folder, never through "
                              f"a link at it (give the folder it points to)", flag or path) from None
        if e.errno == errno.ENOTDIR:
            raise ConfigError(f"{path} is not a folder", flag or path) from None
        raise ConfigError(f"cannot open folder {path}: {e.strerror}", flag or path) from None
    st = os.fstat(fd)
    problem = folder_problem(st)
    if problem:
        os.close(fd)
        raise ConfigError(f"folder {path} is {problem}: others could replace what distlab writes there; use a "
                          f"folder of yours that only you can write", flag or path)
    problem = path_problem(path or ".", st)
    if not problem and expect is not None and (st.st_dev, st.st_ino) != tuple(expect):
        problem = (f"it is not the folder the launcher checked (device {expect[0]}, inode {expect[1]}; now "
                   f"{st.st_dev}, {st.st_ino}): it was replaced meanwhile")
    if problem:
        os.close(fd)
        raise ConfigError(f"folder {path}: {problem}: others could redirect what distlab writes there; use a "
                          f"folder whose every parent is yours or root's and only you can write", flag or path)
    return fd


def path_problem(path: str, opened=None) -> str | None:
    """Why the way to the folder ``path`` is unsafe, or None, as OpenSSH's StrictModes checks every folder above
    a key file up to / (auth.c ``safe_path``): each symbolic link on the way must be yours or root's and sit in
    a folder ``folder_problem`` accepts (another user's link, or one in a folder others can write, could be
    pointed elsewhere), and each folder above the real one, up to /, must pass ``folder_problem`` (another
    user's parent could be renamed or replaced). Links are resolved one at a time, as the kernel does; ``opened``
    (an ``os.stat`` of the descriptor opened) must be the folder reached, else it was swapped meanwhile."""
    parts = os.path.join(os.getcwd(), path).split(os.sep)
    real, hops = os.sep, 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            real = os.path.dirname(real)
            continue
        step = os.path.join(real, part)
        try:
            st = os.lstat(step)
        except OSError:
            return None                              # opening it fails and says why
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if st.st_uid not in (os.getuid(), 0):
                return f"{step} on the way is a symbolic link of another user (uid {st.st_uid})"
            holder = folder_problem(os.stat(real))
            if holder:
                return f"{step} on the way is a symbolic link in folder {real}, which is {holder}"
            if hops > 40:
                return f"too many symbolic links on the way ({step})"
            target = os.readlink(step)
            parts = target.split(os.sep) + parts
            real = os.sep if target.startswith(os.sep) else real
            continue
        real = step
    here = os.stat(real)
    if opened is not None and (here.st_dev, here.st_ino) != (opened.st_dev, opened.st_ino):
        return "it was replaced while it was opened"
    while real != os.sep:
        real = os.path.dirname(real)
        problem = folder_problem(os.stat(real))
        if problem:
            return f"its parent {real} is {problem}"
    return None


def folder_id(path: str, flag: str) -> tuple[int, int]:
    """(device, inode) of the folder ``path``, checked by ``open_folder``: what a rank compares (``expect``)."""
    fd = open_folder(path, flag)
    st, _ = os.fstat(fd), os.close(fd)
    return st.st_dev, st.st_ino


def make_folder(path: str, flag: str) -> None:
    """Create the folder ``path`` if missing (its parent must exist), then check it as ``open_folder`` does."""
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    except OSError as e:
        raise ConfigError(f"cannot create folder {path}: {e.strerror}", flag) from None
    os.close(open_folder(path, flag))


def _fsync_fd(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EROFS, errno.EBADF):
            raise


def fsync_folder(folder: str) -> None:
    """Make a rename or a new file in ``folder`` durable (file systems that cannot fsync a folder are skipped)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        _fsync_fd(fd)
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

    The lock is ``flock`` on ``.NAME.lock`` beside a file, or ``.distlab.lock`` inside a folder (it works across
    processes and, on NFS, across hosts); it holds the owner's PID and is removed on release. A run killed by
    SIGKILL leaves the file behind, but not the lock: the next run takes it. The lock file is made in its folder
    (``open_folder``) with O_CREAT | O_EXCL | O_NOFOLLOW; one that is already there is used only if it is a
    regular file of this user with one link (a hard link planted there would have the run truncate its target;
    a FIFO would block or fail), else refused in one line; a failure to write the PID (a full disk) is one line
    and leaves no lock file behind."""

    def __init__(self, path: str, flag: str, folder: bool = False):
        full = os.path.abspath(path)
        self.path, self.flag = path, flag
        self.lock_path = (os.path.join(full, ".distlab.lock") if folder else
                          os.path.join(os.path.dirname(full), f".{os.path.basename(full)}.lock"))
        self.fd: int | None = None
        self.folder_fd: int | None = None

    def acquire(self) -> "OutputLock":
        folder, name = os.path.split(self.lock_path)
        self.folder_fd = open_folder(folder, self.flag)
        try:
            for _ in range(5):
                fd = self._open(name)
                if fd is not None and self._lock(fd, name):
                    return self
            raise ConfigError(f"cannot lock {self.path}: its lock file keeps changing", self.flag)
        except BaseException:
            os.close(self.folder_fd)
            self.folder_fd = None
            raise

    def _open(self, name: str) -> int | None:
        """The lock file's descriptor (None: it vanished meanwhile, try again)."""
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            return os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=self.folder_fd)
        except FileExistsError:
            pass
        except OSError as e:
            raise ConfigError(f"cannot lock {self.path} ({self.lock_path}): {e.strerror}", self.flag) from None
        try:
            fd = os.open(name, flags, dir_fd=self.folder_fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            what = "a symbolic link" if e.errno == errno.ELOOP else e.strerror
            raise ConfigError(f"cannot lock {self.path}: {self.lock_path} is {what}; distlab never uses it as a "
                              "lock: remove it yourself", self.flag) from None
        st = os.fstat(fd)
        problem = (kind_of(st.st_mode) if not stat.S_ISREG(st.st_mode) else
                   f"a file with {st.st_nlink} links (a hard link)" if st.st_nlink != 1 else
                   f"another user's file (uid {st.st_uid})" if st.st_uid != os.getuid() else None)
        if problem:
            os.close(fd)
            raise ConfigError(f"cannot lock {self.path}: {self.lock_path} is {problem}; distlab never uses it as "
                              "a lock: remove it yourself", self.flag)
        return fd

    def _lock(self, fd: int, name: str) -> bool:
        import fcntl
        st = os.fstat(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            owner = owner if owner.isdigit() else ""
            raise ConfigError(f"another distlab run{f' (pid {owner})' if owner else ''} is writing {self.path}; "
                              f"wait for it to end, or give another {self.flag}", self.flag) from None
        try:
            now = os.stat(name, dir_fd=self.folder_fd, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        if now is None or now.st_ino != st.st_ino:        # released and removed meanwhile: lock the new one
            os.close(fd)
            return False
        try:
            os.ftruncate(fd, 0)
            pid = str(os.getpid()).encode()
            if os.pwrite(fd, pid, 0) != len(pid):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as e:
            with contextlib.suppress(OSError):
                if os.stat(name, dir_fd=self.folder_fd, follow_symlinks=False).st_ino == st.st_ino:
                    os.unlink(name, dir_fd=self.folder_fd)
            os.close(fd)
            raise ConfigError(f"cannot lock {self.path} ({self.lock_path}): {e.strerror}", self.flag) from None
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is None:
            return
        name = os.path.basename(self.lock_path)
        with contextlib.suppress(OSError):
            if os.stat(name, dir_fd=self.folder_fd, follow_symlinks=False).st_ino == os.fstat(self.fd).st_ino:
                os.unlink(name, dir_fd=self.folder_fd)
        os.close(self.fd)
        os.close(self.folder_fd)
        self.fd = self.folder_fd = None

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


# The outputs of the command now running (sim/cli.py run_command): sim/io.py check_output locks each output it
# checks, so every command that writes results holds its lock from the check to its end.
_HELD: dict[str, OutputLock] = {}
LOCKING = [0]                       # > 0 while a command runs (nested commands count)


def hold_lock(path: str, flag: str) -> None:
    """Lock ``path`` until ``release_held`` (once per path), while a command runs; nothing outside commands."""
    full = os.path.abspath(path)
    if LOCKING[0] > 0 and full not in _HELD:
        _HELD[full] = OutputLock(path, flag).acquire()


def release_held() -> None:
    while _HELD:
        _HELD.popitem()[1].release()


def save_figure(fig, path: str) -> None:
    """Save a matplotlib figure atomically (format from the file name) and close it. A figure marked
    ``fig.distlab_fast = True`` laid itself out: it is saved in one draw (no tight bounding box) and, as a
    PNG, with light compression (zlib level 1), which matters for figures of thousands of bars."""
    import io
    import sys
    buf = io.BytesIO()
    fmt = os.path.splitext(path)[1].lstrip(".").lower() or "png"
    from matplotlib.text import Text

    from distlab.sim.output import printable
    for text in fig.findobj(Text):              # names from files: control characters escaped (sim/output.py)
        label = text.get_text()
        if label and printable(label) != label:
            text.set_text(printable(label))
    fast = getattr(fig, "distlab_fast", False)
    extra = {"bbox_inches": "tight"} if not fast else ({"pil_kwargs": {"compress_level": 1}} if fmt == "png" else {})
    fig.savefig(buf, format=fmt, dpi=120, **extra)
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close(fig)
    write_atomic(path, buf.getvalue())
