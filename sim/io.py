"""Small input/output helpers shared by the CLI: sizes, bounded reads of JSON and YAML, atomic writes, output locks."""
from __future__ import annotations

import contextlib
import errno
import math
import os
import re
import secrets
import stat

import yaml

from distlab.sim.errors import ConfigError, OutputError

_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1000, "KIB": 1024, "M": 2**20, "MB": 10**6, "MIB": 2**20,
          "G": 2**30, "GB": 10**9, "GIB": 2**30, "T": 2**40, "TB": 10**12, "TIB": 2**40}


MAX_BYTES = 2**50          # 1 PiB: larger sizes are typos (1e40GiB), not collectives


def parse_size(text: str, where: str = "size", dtype: str | None = None) -> int:
    """``'256MiB'`` -> 268435456. Units: B, KiB/MiB/GiB/TiB (powers of 2), KB/MB/GB/TB (powers of 10), K/M/G.
    At most 1 PiB; with ``dtype``, a whole number of its elements (``DTYPE_BYTES``)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise ConfigError(f"{text!r} is not a size; write a number and a unit such as 8B, 64KiB, 256MiB, 1GiB, 2GB",
                          where)
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if not math.isfinite(value) or value > MAX_BYTES:
        raise ConfigError(f"{text!r} is larger than 1 PiB; allowed: 0 B up to 1 PiB", where)
    if value != int(value):
        raise ConfigError(f"{text!r} is not a whole number of bytes", where)
    if dtype is not None:
        check_elements(int(value), dtype, where)
    return int(value)


def check_elements(nbytes: int, dtype: str, where: str) -> None:
    """A byte count must hold a whole number of ``dtype`` elements (torch sizes buffers in elements)."""
    from distlab.sim.dtypes import DTYPE_BYTES
    e = DTYPE_BYTES[dtype]
    if nbytes % e:
        raise ConfigError(f"{nbytes} B is not a whole number of {dtype} elements ({e} bytes each); allowed: "
                          f"multiples of {e} B", where)


def parse_size_range(text: str, where: str = "--sizes", dtype: str | None = None) -> list[int]:
    """``'8B:8GiB'`` -> [8, 16, ..., 8 GiB] in x2 steps (nccl-tests' -b/-e/-f 2); ``'1MiB,4MiB'`` -> a list.
    With ``dtype``, every size must be a whole number of its elements."""
    if ":" in text:
        lo_text, _, hi_text = text.partition(":")
        factor = 2
        if ":" in hi_text:
            hi_text, _, f = hi_text.partition(":")
            try:
                factor = int(f)
            except ValueError:
                factor = 0
            if factor < 2:
                raise ConfigError(f"step factor {f!r} must be a whole number >= 2", where)
        lo, hi = parse_size(lo_text, where, dtype), parse_size(hi_text, where, dtype)
        if lo <= 0 or hi < lo:
            raise ConfigError(f"range {text!r} must go from a size > 0 up to a larger one", where)
        sizes = []
        s = lo
        while s <= hi:
            sizes.append(s)
            s *= factor
        if dtype is not None:
            for s in sizes:
                check_elements(s, dtype, where)
        return sizes
    sizes = [parse_size(t, where, dtype) for t in text.split(",") if t.strip()]
    if not sizes:
        raise ConfigError("no sizes given", where)
    return sizes



# -- reading ---------------------------------------------------------------------------------------------------
def read_text(path: str, what: str = "file") -> str:
    """The UTF-8 text of ``path``; a missing, unreadable, binary or non-UTF-8 file is a ConfigError."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read {what}: {e.strerror}", path) from None
    if b"\0" in data:
        raise ConfigError(f"this is a binary file, not a {what} (text, UTF-8)", path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"not UTF-8 text (byte {e.start}); a {what} must be UTF-8", path) from None


def load_yaml(path: str):
    text = read_text(path, "YAML file")
    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))   # libyaml when built
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"not valid YAML{at}", path) from None


# -- output paths ------------------------------------------------------------------------------------------------
TRACE_EXTENSIONS = (".json", ".trace")


def figure_formats() -> list[str]:
    """The file extensions matplotlib can save a figure as (its registered backends)."""
    from matplotlib.backend_bases import FigureCanvasBase
    return sorted(FigureCanvasBase.get_supported_filetypes())


def check_output(path, flag: str, kind: str = "file") -> str:
    """Check that ``path`` can be written, before anything is computed; return it. ``kind``: "file",
    "figure" (an extension matplotlib saves), "trace" (.json Chrome/Perfetto, .trace native) or "dir" (a
    folder this command may create; its parent must exist). Never creates folders. A ConfigError names what
    is wrong: a missing parent, a file where a folder should be, a folder where a file should be, no
    permission, a wrong extension."""
    if path is None:
        return path
    text = str(path)
    if not text.strip():
        raise ConfigError("an empty path; give a file name", flag)
    full = os.path.abspath(text)
    if kind == "dir":
        if os.path.exists(full) and not os.path.isdir(full):
            raise ConfigError(f"{text} is a file; give a folder", flag)
        if os.path.isdir(full):
            _check_folder(full, flag, text)
            return path
    else:
        if text.endswith(os.sep) or os.path.isdir(full):
            raise ConfigError(f"{text} is a folder; give a file name inside it", flag)
        _check_extension(text, flag, kind)
        if os.path.exists(full) and not os.access(full, os.W_OK):
            raise ConfigError(f"cannot overwrite {text}: permission denied", flag)
    _check_folder(os.path.dirname(full), flag, text)
    return path


def check_outputs(*outputs: tuple) -> None:
    """``check_output`` for each (path, flag, kind) given (None paths skipped), and no two the same file."""
    seen = {}
    for path, flag, kind in outputs:
        if path is None:
            continue
        check_output(path, flag, kind)
        full = os.path.realpath(str(path))
        if full in seen:
            raise ConfigError(f"{path} is also the file of {seen[full]}; give each output its own file", flag)
        seen[full] = flag


def _check_extension(text: str, flag: str, kind: str) -> None:
    ext = os.path.splitext(text)[1].lower()
    if kind == "figure" and ext == ".png":
        return                     # always a format; checked without importing matplotlib (~0.4 s)
    if kind == "figure":
        formats = figure_formats()
        if ext.lstrip(".") not in formats:
            got = f"extension {ext!r}" if ext else "no extension"
            raise ConfigError(f"{text}: {got} is not a figure format; allowed: .{', .'.join(formats)}", flag)
    elif kind == "trace" and ext not in TRACE_EXTENSIONS:
        raise ConfigError(f"{text}: a trace is .json (Chrome trace, opens in Perfetto) or .trace (distlab's own); "
                          f"allowed: {', '.join(TRACE_EXTENSIONS)}", flag)


def _check_folder(folder: str, flag: str, text: str) -> None:
    """``folder`` must exist, be a folder, and let us create files in it (tried: a probe file, removed)."""
    probe_up = folder
    while not os.path.exists(probe_up):
        parent = os.path.dirname(probe_up)
        if parent == probe_up:
            break
        probe_up = parent
    if probe_up != folder:
        if not os.path.isdir(probe_up):
            raise ConfigError(f"{probe_up} is a file, not a folder, so {text} cannot be written", flag)
        raise ConfigError(f"folder {folder} does not exist; create it first (distlab creates no parent folders)",
                          flag)
    if not os.path.isdir(folder):
        raise ConfigError(f"{folder} is a file, not a folder, so {text} cannot be written", flag)
    probe = os.path.join(folder, f".distlab-probe-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"cannot write in folder {folder}: {e.strerror}", flag) from None


# -- writing -----------------------------------------------------------------------------------------------------
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
