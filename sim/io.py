"""Small input/output helpers shared by the CLI: sizes, YAML, atomic writes."""
from __future__ import annotations

import os
import re
import tempfile

import yaml

from distlab.sim.errors import ConfigError

_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1000, "KIB": 1024, "M": 2**20, "MB": 10**6, "MIB": 2**20,
          "G": 2**30, "GB": 10**9, "GIB": 2**30, "T": 2**40, "TB": 10**12, "TIB": 2**40}


def parse_size(text: str, where: str = "size") -> int:
    """``'256MiB'`` -> 268435456. Units: B, KiB/MiB/GiB/TiB (powers of 2), KB/MB/GB/TB (powers of 10), K/M/G."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise ConfigError(f"{text!r} is not a size; write a number and a unit such as 8B, 64KiB, 256MiB, 1GiB, 2GB",
                          where)
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if value != int(value):
        raise ConfigError(f"{text!r} is not a whole number of bytes", where)
    return int(value)


def parse_size_range(text: str, where: str = "--sizes") -> list[int]:
    """``'8B:8GiB'`` -> [8, 16, ..., 8 GiB] in x2 steps (nccl-tests' -b/-e/-f 2); ``'1MiB,4MiB'`` -> a list."""
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
        lo, hi = parse_size(lo_text, where), parse_size(hi_text, where)
        if lo <= 0 or hi < lo:
            raise ConfigError(f"range {text!r} must go from a size > 0 up to a larger one", where)
        sizes = []
        s = lo
        while s <= hi:
            sizes.append(s)
            s *= factor
        return sizes
    sizes = [parse_size(t, where) for t in text.split(",") if t.strip()]
    if not sizes:
        raise ConfigError("no sizes given", where)
    return sizes


def load_yaml(path: str):
    try:
        with open(path) as f:
            return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))   # libyaml when built
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", path) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"not valid YAML{at}", path) from None


def write_atomic(path: str, data: str | bytes) -> None:
    """Write to a temporary file beside ``path`` then rename: a reader never sees half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, mode) as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_figure(fig, path: str) -> None:
    """Save a matplotlib figure atomically (format from the file name)."""
    import io
    buf = io.BytesIO()
    fmt = os.path.splitext(path)[1].lstrip(".") or "png"
    fig.savefig(buf, format=fmt, dpi=120, bbox_inches="tight")
    write_atomic(path, buf.getvalue())
