"""Quantities with units for lesson answers: parse "3.2 ms", "400 Gb/s", "24 MiB", "20 %", and name units.

Every unit belongs to a dimension (time, bandwidth, bytes, ratio) and has a factor to the dimension's base
unit (s, B/s, B, fraction). Bits are told apart from bytes by case, as networking writes them: ``Gb/s`` and
``Gbps`` are gigabits per second (400 Gb/s = 50 GB/s), ``GB/s`` gigabytes. ``KiB``/``MiB``/``GiB`` are powers
of 2, ``KB``/``MB``/``GB`` powers of 10 (sim/io.py's parse_size uses the same words).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# unit -> (dimension, factor to the base unit). Case matters (b = bit, B = byte); see _normalise for aliases.
UNITS: dict[str, tuple[str, float]] = {
    "s": ("time", 1.0), "ms": ("time", 1e-3), "us": ("time", 1e-6), "ns": ("time", 1e-9),
    "min": ("time", 60.0),
    "B/s": ("bandwidth", 1.0), "KB/s": ("bandwidth", 1e3), "MB/s": ("bandwidth", 1e6), "GB/s": ("bandwidth", 1e9),
    "TB/s": ("bandwidth", 1e12), "KiB/s": ("bandwidth", 2**10), "MiB/s": ("bandwidth", 2**20),
    "GiB/s": ("bandwidth", 2**30), "Mb/s": ("bandwidth", 1e6 / 8), "Gb/s": ("bandwidth", 1e9 / 8),
    "Tb/s": ("bandwidth", 1e12 / 8),
    "B": ("bytes", 1.0), "KB": ("bytes", 1e3), "MB": ("bytes", 1e6), "GB": ("bytes", 1e9), "TB": ("bytes", 1e12),
    "KiB": ("bytes", 2**10), "MiB": ("bytes", 2**20), "GiB": ("bytes", 2**30), "TiB": ("bytes", 2**40),
    "%": ("ratio", 0.01), "x": ("ratio", 1.0),
}
ALIASES = {"sec": "s", "secs": "s", "second": "s", "seconds": "s", "msec": "ms", "millisecond": "ms",
           "milliseconds": "ms", "µs": "us", "μs": "us", "usec": "us", "microsecond": "us", "microseconds": "us",
           "nanoseconds": "ns", "minutes": "min", "percent": "%", "bytes": "B", "byte": "B",
           "Gbps": "Gb/s", "Mbps": "Mb/s", "Tbps": "Tb/s", "GBps": "GB/s", "MBps": "MB/s", "TBps": "TB/s",
           "GiBps": "GiB/s", "MiBps": "MiB/s", "times": "x", "×": "x"}
DIMENSION_WORDS = {"time": "a time", "bandwidth": "a bandwidth", "bytes": "an amount of data",
                   "ratio": "a ratio", "count": "a plain number", "choice": "one of the choices"}
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


class UnitError(ValueError):
    """An answer that is not a number with a known unit."""


@dataclass(frozen=True)
class Quantity:
    value: float          # in ``unit``
    unit: str | None      # None: a bare number

    @property
    def dimension(self) -> str | None:
        return UNITS[self.unit][0] if self.unit else None

    def to(self, unit: str) -> float:
        """The value in ``unit`` (same dimension)."""
        dim, factor = UNITS[unit]
        if self.unit is None:
            return self.value
        if self.dimension != dim:
            raise UnitError(f"{self} is {DIMENSION_WORDS[self.dimension]}, not {DIMENSION_WORDS[dim]}")
        return self.value * UNITS[self.unit][1] / factor

    def __str__(self) -> str:
        return fmt(self.value, self.unit)


def _normalise(unit: str) -> str:
    u = unit.strip().replace(" ", "").replace("per", "/")
    if u in UNITS:
        return u
    if u in ALIASES:
        return ALIASES[u]
    low = u.lower()
    for table in (UNITS, ALIASES):            # case-insensitive, but only where that cannot confuse bit and byte
        for k, v in table.items():
            if k.lower() == low and "b" not in low:
                return v if table is ALIASES else k
    same = [k for k in UNITS if k.lower() == low]
    if same:
        raise UnitError(f"unit {unit!r}: write {' or '.join(same)} (B = bytes, b = bits: case matters)")
    raise UnitError(f"unknown unit {unit!r}; known: {', '.join(k for k in UNITS if k != 'x')}")


def parse(answer) -> Quantity:
    """A number (int, float, numpy scalar) or a string like ``"3.2 ms"``, ``"400 Gb/s"``, ``"1e-3"``."""
    if isinstance(answer, bool):
        raise UnitError(f"{answer!r} is not a number")
    if isinstance(answer, (int, float)) or type(answer).__name__.startswith(("float", "int")):
        return Quantity(float(answer), None)
    if not isinstance(answer, str):
        raise UnitError(f"{answer!r} is not a number or a string such as '3.2 ms'")
    text = _drop_thousands_commas(answer.strip().replace("_", ""))
    m = re.fullmatch(rf"({_NUMBER})\s*(.*)", text)
    if not m:
        raise UnitError(f"{answer!r} does not start with a number; write e.g. '3.2 ms' or '50 GB/s'")
    value, unit = float(m.group(1)), m.group(2).strip()
    return Quantity(value, _normalise(unit) if unit else None)


def _drop_thousands_commas(text: str) -> str:
    """``"1,048,576 B"`` -> ``"1048576 B"``; a comma that may be a decimal comma is refused (UnitError).

    Commas are read only as thousands separators, and only where no other reading exists: groups of exactly
    three digits, and either more than one group (``1,000,000``) or a decimal point after them (``1,024.5``).
    ``"1,5 ms"`` is a decimal comma; ``"1,024"`` could be 1024 or 1.024 (a decimal comma in much of Europe)."""
    m = re.match(r"\s*([-+]?[\d,]*\d(?:\.\d*)?)", text)
    if not m or "," not in m.group(1):
        return text
    number = m.group(1)
    head = number.lstrip("+-").split(".")[0]
    groups = head.split(",")
    thousands = (1 <= len(groups[0]) <= 3 and all(len(g) == 3 for g in groups[1:])
                 and (len(groups) > 2 or "." in number))
    if not thousands:
        point = number.replace(",", ".", 1) if number.count(",") == 1 else None
        if point and len(groups) == 2 and len(groups[1]) == 3:
            raise UnitError(f"{text!r}: the comma is ambiguous ({number.replace(',', '')} or {point}?); write the "
                            f"number with a decimal point and no commas, e.g. {point!r} or "
                            f"{number.replace(',', '')!r}")
        raise UnitError(f"{text!r}: a decimal comma is not read; write the number with a decimal point"
                        + (f", e.g. {point!r}" if point else ""))
    return number.replace(",", "") + text[m.end():]


def units_of(dimension: str) -> list[str]:
    return [u for u, (d, _) in UNITS.items() if d == dimension]


def fmt(value: float, unit: str | None) -> str:
    """``fmt(0.0032, 's')`` -> ``'0.0032 s'``: 4 significant digits (``fmt(14159, None)`` -> ``'14160'``, not
    ``'1.416e+04'``)."""
    text = f"{value:.4g}"
    if "e+" in text and abs(value) < 1e15:
        text = f"{float(text):.0f}"
    if unit is None:
        return text
    return f"{text}{unit}" if unit in ("%", "x") else f"{text} {unit}"


def best_unit(value: float, unit: str) -> str:
    """The unit of ``unit``'s dimension that reads best for ``value`` given in ``unit`` (for hints)."""
    dim = UNITS[unit][0]
    base = value * UNITS[unit][1]
    choices = {"time": ["s", "ms", "us", "ns"], "bytes": ["GiB", "MiB", "KiB", "B"],
               "bandwidth": ["TB/s", "GB/s", "MB/s", "B/s"]}.get(dim, [unit])
    for u in choices:
        if abs(base) >= UNITS[u][1]:
            return u
    return choices[-1]
