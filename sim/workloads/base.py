"""A workload (one parallelism) is one record: its name, the mesh dimensions it uses, an options dataclass and
its hooks. Everything a user sees of it comes from the record: the YAML keys of its scenario section, its
`distlab simulate` flags, its `--sweep` keys, its `--help` text and its validation errors.

Options are a dataclass; each field has a type (int, float, bool, str, ``X | None``, ``bool | int``,
``list[int] | None``), a default, and metadata: ``help`` (one line, required), and optionally ``choices``,
``what`` (words for the value in errors, e.g. "ZeRO stage") and ``flag`` (the CLI flag, default
``--field-name``; ``option`` in sim/parallel/options.py makes such a field). Range checks beyond type and
choices belong in the dataclass's ``validate(where)``.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from distlab.sim.errors import ConfigError
from distlab.sim.parallel.options import option  # noqa: F401 (the field helper, defined below the builders)


@dataclass(frozen=True)
class Workload:
    """One parallelism. ``build(model, mesh, options, cluster) -> (Plan, info)``; ``report(result) -> dict`` with
    optional keys ``rows`` ([label, value] for the summary table), ``tables`` ([{title, columns, rows}]),
    ``warnings`` ([str]) and ``json`` (dict); ``figure(result, title) -> matplotlib figure``;
    ``sweep_row(result) -> dict`` (extra columns of a sweep); ``sweep_figure(rows, key, title)``."""
    name: str
    help: str                                   # one line for --help and the README
    dims: tuple[str, ...]                       # mesh dimensions it uses, outermost first (default layout)
    options: type                               # a dataclass (see the module docstring)
    build: Callable
    required_dims: tuple[str, ...] = ()         # must be in the mesh (a section without them is an error)
    fill_dim: str | None = None                 # absent from the mesh: takes the ranks the other dims leave
    default_dim: str | None = None              # no mesh at all: every rank on this dim (None: a mesh is needed)
    dim_words: dict = field(default_factory=dict)    # dim -> words for errors, e.g. "pipeline stages"
    legacy_keys: dict = field(default_factory=dict)  # old `parallelism:` key -> mesh dim (stages -> pp)
    legacy: Callable | None = None              # (section, mesh, scenario): further old-format defaults
    intra_node_dims: tuple[str, ...] = ()       # dims whose groups should stay inside a node when composed
    report: Callable | None = None
    figure: Callable | None = None
    sweep_row: Callable | None = None
    sweep_figure: Callable | None = None

    # -- what the record gives ---------------------------------------------------------------------------
    def fields(self) -> list[dataclasses.Field]:
        return list(dataclasses.fields(self.options))

    def keys(self) -> tuple[str, ...]:
        """The YAML keys of its scenario section."""
        return tuple(f.name for f in self.fields())

    def flag(self, f: dataclasses.Field) -> str:
        return f.metadata.get("flag") or "--" + f.name.replace("_", "-")

    def help_line(self, f: dataclasses.Field) -> str:
        """``--help`` text of one option: its help, choices and default."""
        text = f.metadata["help"]
        choices = f.metadata.get("choices")
        if choices:
            text += f" ({', '.join(_show(c) for c in choices)})"
        return f"{text}; default {_show(_default(f))}"

    def defaults(self):
        return self.options()

    def placement_warnings(self, mesh, gpus_per_node: int) -> list[str]:
        """Mesh.placement_warnings for tp/cp and, when the mesh composes two or more dims, this workload's
        intra_node_dims (e.g. HSDP's dp_shard: shard inside a node, replicate across nodes). Not ep: experts
        across nodes is a published layout (DeepSeek-V3's ep 64 over 8 nodes; sim/mesh.py)."""
        composed = sum(1 for s in mesh.shape if s > 1) > 1
        return mesh.placement_warnings(gpus_per_node, ("tp", "cp") + (self.intra_node_dims if composed else ()))

    def parse(self, section, where: str):
        """The options dataclass of a scenario section (a mapping): unknown keys, types and choices checked
        here, ranges by the dataclass's own ``validate``."""
        if section is None:
            section = {}
        if not isinstance(section, dict):
            raise ConfigError(f"must be a mapping of options ({', '.join(self.keys())})", where)
        hints = typing.get_type_hints(self.options)
        by_name = {f.name: f for f in self.fields()}
        for k, v in section.items():
            if k not in by_name:
                raise ConfigError(f"unknown key {k!r} for {self.name}; allowed: {', '.join(self.keys())}", where)
            check_value(v, hints[k], by_name[k], f"{where}.{k}")
        opts = self.options(**section)
        if hasattr(opts, "validate"):
            opts = opts.validate(where)
        return opts

    def parse_text(self, f: dataclasses.Field, text: str, where: str):
        """A value of option ``f`` from command-line text (``none`` for None; lists comma-separated)."""
        hint = typing.get_type_hints(self.options)[f.name]
        value = from_text(text, hint, where)
        check_value(value, hint, f, where)
        return value


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _show(v) -> str:
    return "none" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def _allowed(hint) -> set:
    """The base types a type hint allows: {int, float, bool, str, list, NoneType}."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is list:
        return {list}
    if args:
        return set().union(*(_allowed(a) for a in args))
    return {hint}


def describe_type(hint) -> str:
    kinds = _allowed(hint)
    words = []
    if bool in kinds:
        words.append("true or false")
    if int in kinds and float not in kinds:
        words.append("a whole number")
    if float in kinds:
        words.append("a number")
    if str in kinds:
        words.append("a word")
    if list in kinds:
        words.append("a list of whole numbers")
    if type(None) in kinds:
        words.append("none")
    return " or ".join(words)


def check_value(v, hint, f: dataclasses.Field, where: str) -> None:
    """ConfigError unless ``v`` has the field's type and is one of its choices."""
    kinds = _allowed(hint)
    ok = ((v is None and type(None) in kinds) or (isinstance(v, bool) and bool in kinds)
          or (not isinstance(v, bool) and isinstance(v, int) and (int in kinds or float in kinds))
          or (isinstance(v, float) and float in kinds) or (isinstance(v, str) and str in kinds)
          or (isinstance(v, list) and list in kinds and all(isinstance(x, int) and not isinstance(x, bool)
                                                             for x in v)))
    if not ok:
        raise ConfigError(f"{v!r} must be {describe_type(hint)}", where)
    if isinstance(v, float) and not math.isfinite(v):        # .inf / .nan in YAML, inf in --sweep
        raise ConfigError(f"{v!r} must be a finite number", where)
    choices = f.metadata.get("choices")
    if choices is not None and v is not None and v not in choices:
        what = f.metadata.get("what") or f.name
        raise ConfigError(f"unknown {what} {v!r}; allowed: {', '.join(_show(c) for c in choices)}", where)


def from_text(text: str, hint, where: str) -> Any:
    """Command-line text to a value of type ``hint``; the type check follows in check_value."""
    t = text.strip()
    kinds = _allowed(hint)
    if t.lower() in ("none", "null", "default") and type(None) in kinds:
        return None
    if bool in kinds and t.lower() in ("true", "false", "yes", "no"):
        return t.lower() in ("true", "yes")
    if list in kinds:
        try:
            return [int(x) for x in t.split(",")]
        except ValueError:
            raise ConfigError(f"{text!r} must be whole numbers separated by commas", where) from None
    if (int in kinds or float in kinds) and t.lstrip("-").isdigit():
        return int(t)
    if float in kinds:
        try:
            return float(t)
        except ValueError:
            pass
    return t
