"""Small input/output helpers shared by the CLI: sizes, YAML, atomic writes."""
from __future__ import annotations

import errno
import math
import os
import re
import secrets
import stat

import yaml

from distlab.sim.errors import ConfigError

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
    except OSError as e:          # /proc/sys answers ENOENT, a read-only mount EROFS: the folder is there
        why = "" if e.errno == errno.ENOENT else f" ({e.strerror})"
        raise ConfigError(f"folder {folder} exists but files cannot be created in it{why}; give a folder you can "
                          "write", flag) from None


# -- writing -----------------------------------------------------------------------------------------------------
def write_atomic(path: str, data: str | bytes) -> None:
    """Write to a temporary file beside ``path`` then rename: a reader never sees half a file. The file gets
    the permissions the umask gives (0666 & ~umask, as open() does; an existing file keeps its mode). Creates
    no folders. A path that is not a regular file (/dev/null, a pipe) is written directly."""
    full = os.path.abspath(path)
    data = data.encode("utf-8") if isinstance(data, str) else data
    if os.path.exists(full) and not os.path.isfile(full):
        with open(full, "wb") as f:
            f.write(data)
        return
    tmp = os.path.join(os.path.dirname(full), f".{os.path.basename(full)}.tmp-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)     # mode & ~umask, like open(path, "w")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if os.path.isfile(full):
            os.chmod(tmp, stat.S_IMODE(os.stat(full).st_mode))
        os.replace(tmp, full)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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
