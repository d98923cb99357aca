"""Small input/output helpers shared by the CLI: sizes, bounded reads of files, JSON and YAML, output paths
(writing: sim/files.py).

Why not a library (issue 44.4): sizes (``parse_size``) are a table of 14 units and one regular expression, in
nccl-tests' words (8B, 64KiB, 1GiB); pint or humanfriendly would add a dependency to parse them and answer a typo
in their own words, where this names the flag and the units allowed. Schemas: scenario, cluster and plan files
are checked by the code that reads them, not by jsonschema or pydantic, because the errors must name the key or
flag the user wrote and what is allowed there, and most rules span keys (a mesh's product is the world size, each
mesh dimension has its section), which a schema cannot say; what a library would do (types, required keys) is
the small part. The bounded readers below are what neither does: a size cap before parsing, and YAML aliases
that expand past MAX_YAML_VALUES refused.
"""
from __future__ import annotations

import errno
import json
import math
import os
import re
import secrets
import stat

import yaml

from distlab.sim.errors import ConfigError

_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1000, "KIB": 1024, "M": 2**20, "MB": 10**6, "MIB": 2**20,
          "G": 2**30, "GB": 10**9, "GIB": 2**30, "T": 2**40, "TB": 10**12, "TIB": 2**40,
          "P": 2**50, "PB": 10**15, "PIB": 2**50}


MAX_BYTES = 2**50          # 1 PiB: larger sizes are typos (1e40GiB), not collectives


def parse_size(text: str, where: str = "size", dtype: str | None = None) -> int:
    """``'256MiB'`` -> 268435456. Units: B, KiB/MiB/GiB/TiB/PiB (powers of 2), KB/MB/GB/TB/PB (powers of 10),
    K/M/G/T/P.
    At most 1 PiB; with ``dtype``, a whole number of its elements (``DTYPE_BYTES``)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise ConfigError(f"{text!r} is not a size; write a number and a unit such as 8B, 64KiB, 256MiB, 1GiB, 2GB "
                          "(up to 1PiB)",
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
# Every file distlab reads is bounded, so a malformed or hostile input ends in one line, fast, within 1 GB
# (tests/test_fuzz_inputs.py runs such inputs under a 1 GB address-space limit). Parsed JSON costs up to ~25x its
# text in Python objects (each [] or {} is an object of 56-64 bytes), so JSON is also capped in containers.
MAX_TEXT_BYTES = 4 << 20             # a hand-written file: scenario, cluster, runs, question, flight record
MAX_JSON_BYTES = 64 << 20            # a plan or a trace (a 64-rank FSDP plan is ~10 MB)
MAX_JSON_CONTAINERS = 2_000_000      # [ and { in one JSON file (an op is one or two)
MAX_YAML_VALUES = 200_000            # values of a YAML file once its aliases are expanded (hand-written: < 10,000)
MAX_YAML_BYTES = 1 << 20             # a hand-written YAML file (the shipped ones are < 10 KB): parsed in < 2 s


def _human(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} B"


def read_bytes(path: str, what: str = "file", limit: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; a missing or unreadable file, a folder,
    a device or pipe (/dev/zero would never end), or a larger file is a ConfigError naming the limit."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"cannot read {what}: {e.strerror}", path) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"this is a folder; a {what} is a file", path)
        raise ConfigError(f"not a regular file (a device or a pipe); a {what} is a file", path)
    with os.fdopen(fd, "rb") as f:
        if st.st_size > limit:
            raise ConfigError(f"{st.st_size} bytes is larger than a {what} may be (at most {_human(limit)})", path)
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise ConfigError(f"cannot read {what}: {e.strerror}", path) from None
    if len(data) > limit:
        raise ConfigError(f"larger than a {what} may be (at most {_human(limit)})", path)
    return data


def read_text(path: str, what: str = "file", limit: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of ``path`` (``read_bytes``); a binary or non-UTF-8 file is a ConfigError."""
    data = read_bytes(path, what, limit)
    if b"\0" in data:
        raise ConfigError(f"this is a binary file, not a {what} (text, UTF-8)", path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"not UTF-8 text (byte {e.start}); a {what} must be UTF-8", path) from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def loads_json(text: str, where: str, what: str = "JSON file", containers: int = MAX_JSON_CONTAINERS):
    """Parse JSON text: not valid JSON, NaN/Infinity, an integer over 4,300 digits (Python's limit), nesting
    deeper than the parser's recursion or more than ``containers`` objects and lists are one ConfigError."""
    n = text.count("[") + text.count("{")          # over-counts brackets inside strings: a safe bound
    if n > containers:
        raise ConfigError(f"{n} JSON objects and lists is more than a {what} may hold (at most {containers})", where)
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ConfigError(f"not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})", where) from None
    except RecursionError:
        raise ConfigError(f"JSON nested too deep for a {what}", where) from None
    except ValueError as e:                        # NaN, Infinity, integers past 4,300 digits
        raise ConfigError(f"not valid JSON: {_value_error(e)}", where) from None


def _value_error(e: ValueError) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    if "integer string conversion" in text:
        return "an integer with more than 4300 digits (Python's limit)"
    return text[:120]


def load_json(path: str, what: str = "JSON file", limit: int = MAX_JSON_BYTES):
    """A bounded JSON file (``read_text`` then ``loads_json``)."""
    return loads_json(read_text(path, what, limit), path, what)


def load_yaml(path: str, what: str = "YAML file", limit: int = MAX_YAML_BYTES):
    """A bounded YAML file (safe loader): at most ``limit`` bytes and ``MAX_YAML_VALUES`` values once its aliases
    are expanded (the "billion laughs" file is a few hundred bytes of aliases that expand to 10^9 values: later
    code that walks or prints it would run for minutes and exhaust memory); an alias cycle is refused too."""
    text = read_text(path, what, limit)
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))   # libyaml when built
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"not valid YAML{at}", path) from None
    except RecursionError:
        raise ConfigError(f"YAML nested too deep for a {what}", path) from None
    except ValueError as e:                        # e.g. an integer past 4,300 digits
        raise ConfigError(f"not valid YAML: {_value_error(e)}", path) from None
    _check_expansion(data, path)
    return data


def _check_expansion(data, where: str, limit: int = MAX_YAML_VALUES) -> None:
    """Values ``data`` holds with shared (aliased) parts counted every time they appear: at most ``limit``."""
    sizes: dict[int, int] = {}
    open_ids: set[int] = set()

    def size(obj) -> int:
        if not isinstance(obj, (list, dict)):
            return 1
        key = id(obj)
        if key in sizes:
            return sizes[key]
        if key in open_ids:
            raise ConfigError("a YAML alias refers to a value that contains it (a cycle)", where)
        open_ids.add(key)
        items = list(obj.items()) if isinstance(obj, dict) else obj
        n = 1
        for item in items:
            n += sum(size(x) for x in item) if isinstance(obj, dict) else size(item)
            if n > limit:
                raise ConfigError(f"holds more than {limit} values (lists, mappings and scalars, each YAML alias "
                                  f"counted as expanded; at most {limit}: MAX_YAML_VALUES in sim/io.py)", where)
        open_ids.discard(key)
        sizes[key] = n
        return n
    try:
        size(data)
    except RecursionError:
        raise ConfigError("YAML nested too deep", where) from None


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
        if os.path.islink(full):
            raise ConfigError(f"{text} is a symbolic link; distlab writes only into a real folder, never through "
                              "a link at it (give the folder it points to, or remove the link)", flag)
        if os.path.exists(full) and not os.path.isdir(full):
            raise ConfigError(f"{text} is a file; give a folder", flag)
        if os.path.isdir(full):
            _check_folder(full, flag, text)
            _lock(full, flag)
            return path
    else:
        if text.endswith(os.sep) or os.path.isdir(full):
            raise ConfigError(f"{text} is a folder; give a file name inside it", flag)
        _check_extension(text, flag, kind)
        st = _lstat(full)
        target = _stat(full) if st is not None and stat.S_ISLNK(st.st_mode) else st
        if target is not None and not stat.S_ISREG(target.st_mode):
            from distlab.sim.files import kind_of
            what = kind_of(target.st_mode) if target is st else f"a link to {kind_of(target.st_mode)}"
            raise ConfigError(f"{text} is {what}; distlab writes only regular files (a reader there would get "
                              "the result, or the write would block)", flag)
        if os.path.exists(full) and not os.access(full, os.W_OK):
            raise ConfigError(f"cannot overwrite {text}: permission denied", flag)
    _check_folder(os.path.dirname(full), flag, text)
    _lock(full, flag)
    return path


def _lstat(full: str):
    try:
        return os.lstat(full)
    except OSError:
        return None


def _stat(full: str):
    try:
        return os.stat(full)
    except OSError:
        return None


def _lock(full: str, flag: str) -> None:
    """Hold the output's lock while the command runs (sim/files.py hold_lock). Under torchrun (TORCHELASTIC_RUN_ID
    set) only global rank 0 writes results (runtime/ranks/torchrun_rank.py): the other ranks of the job take no
    lock, or the second rank of a node would be refused the output its own job's rank 0 holds."""
    from distlab.sim.files import hold_lock
    if "TORCHELASTIC_RUN_ID" in os.environ and os.environ.get("RANK", "0") != "0":
        return
    st = _lstat(full)
    if st is None or stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        hold_lock(full, flag)


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
    from distlab.sim.files import open_folder
    os.close(open_folder(folder, flag))          # not a link at the folder, yours or root's, not others' to write
    probe = os.path.join(folder, f".distlab-probe-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        os.unlink(probe)
    except OSError as e:          # /proc/sys answers ENOENT, a read-only mount EROFS: the folder is there
        why = "" if e.errno == errno.ENOENT else f" ({e.strerror})"
        raise ConfigError(f"folder {folder} exists but files cannot be created in it{why}; give a folder you can "
                          "write", flag) from None


# writing lives in sim/files.py; these names stay importable from here (most of distlab imports them from sim.io)
from distlab.sim.files import OutputLock, fsync_folder, keep, save_figure, write_atomic  # noqa: E402,F401
