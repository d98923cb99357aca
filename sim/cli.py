"""What every `distlab` subcommand shares: a parser that reports bad flags in one line in distlab's words, JSON
with a schema, progress, nccl-tests' columns; and, from sim/output.py, tables that fit 100 columns and notes
(``print_table``, ``say``, ``note``: --verbose and --wide)."""
from __future__ import annotations

import argparse
import json
import sys
import textwrap

from distlab.sim.errors import ConfigError, OutputError
from distlab.sim.output import (LONG_TABLE, STYLE, WIDTH, EscapingStream, OutputStyle,  # noqa: F401
                                add_output_arguments, elide, note, print_table, raw_stream, say)


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr in distlab's words and exit code 2 (no usage dump), and a
    value that starts with '-' (``--size -1MiB``) reaches the flag's own check instead of being taken for a
    flag."""

    def error(self, message: str):
        sys.stderr.write(f"{self.prog}: error: {argparse_message(message)} (see {self.prog} --help)\n")
        sys.exit(2)

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(attach_dash_values(self, args), namespace)


def attach_dash_values(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """``['--size', '-1MiB']`` -> ``['--size=-1MiB']`` for a flag that takes one value when the next word
    starts with '-' and is not one of the parser's flags (argparse would say "expected one argument")."""
    one_value = {s for a in parser._actions if a.nargs is None for s in a.option_strings}
    known = {s for a in parser._actions for s in a.option_strings}
    out, i = [], 0
    while i < len(args):
        word = args[i]
        if word == "--":
            return out + args[i:]
        nxt = args[i + 1] if i + 1 < len(args) else None
        if word in one_value and nxt is not None and nxt.startswith("-") and nxt != "--" \
                and nxt.split("=")[0] not in known:
            out.append(f"{word}={nxt}")
            i += 2
            continue
        out.append(word)
        i += 1
    return out


def argparse_message(message: str) -> str:
    """argparse's error in distlab's form, ``FLAG: what is wrong; what is allowed``:
    "argument --nodes: invalid int value: 'x'" -> "--nodes: 'x' is not a whole number"."""
    import re
    flag, text = None, message
    m = re.match(r"argument (\S+?): (.*)$", message, re.S)
    if m:
        flag, text = m.group(1).split("/")[-1], m.group(2)
    rules = [(r"invalid int value: (.*)$", r"\1 is not a whole number"),
             (r"invalid float value: (.*)$", r"\1 is not a number"),
             (r"invalid \w+ value: (.*)$", r"\1 is not allowed"),
             (r"invalid choice: (.*?) \(choose from (.*)\)$", lambda m: f"{m.group(1)} is not allowed; allowed: "
              + m.group(2).replace("'", "")),
             (r"expected one argument$", "needs a value"),
             (r"expected at least one argument$", "needs at least one value"),
             (r"unrecognized arguments: (.*)$", r"unknown argument \1"),
             (r"the following arguments are required: (.*)$", r"\1 is required"),
             (r"ambiguous option: (\S+) could match (.*)$", r"\1 is ambiguous: it could be \2")]
    for pattern, repl in rules:
        if re.match(pattern, text, re.S):
            text = re.sub(pattern, repl, text, flags=re.S)
            break
    return f"{flag}: {text}" if flag else text


def check_whole(value, flag: str, low: int, high: int, what: str = "") -> int:
    """``value`` (a flag's whole number) within [low, high], else a ConfigError naming ``flag`` and that range
    with its unit ``what``, short enough that the line fits 100 columns (a value of over 12 digits is shown as
    ``1.0e+13``): ``--world-size: 1.0e+13 is out of range; allowed: 1 to 262,144 ranks``."""
    if value is not None and not low <= value <= high:
        shown = str(value) if len(str(value)) <= 12 else f"{value:.1e}"
        raise ConfigError(f"{shown} is out of range; allowed: {low:,} to {high:,}" + (f" {what}" if what else ""),
                          flag)
    return value


def fail(message: str, code: int = 2):
    """Print one line and exit: for bad input found after parsing."""
    sys.stderr.write(f"distlab: error: {message}\n")
    sys.exit(code)


_running: list[str] = []           # the command run_command is running (print_json's default schema name)
SCHEMA_VERSION = 1


def schema(command: str) -> str:
    """``'distlab.collective/1'``: the first key of every ``--json`` output; the number changes when keys do."""
    return f"distlab.{command}/{SCHEMA_VERSION}"


def with_schema(obj, command: str | None = None) -> dict:
    """``obj`` as the object ``--json`` prints: ``"schema"`` first, then its keys (a list becomes
    ``{"results": [...]}``). ``command`` defaults to the command being run."""
    name = command or (_running[-1] if _running else "distlab")
    body = obj if isinstance(obj, dict) else {"results": list(obj)}
    return {"schema": schema(name), **{k: v for k, v in body.items() if k != "schema"}}


def print_json(obj, command: str | None = None) -> None:
    """Print ``with_schema(obj, command)`` as indented JSON on stdout."""
    sys.stdout.write(json.dumps(with_schema(obj, command), indent=2, sort_keys=False) + "\n")


def read_sweep(text: str, keys) -> tuple[str, list]:
    """``--sweep KEY=V1,V2,...`` as (key, values): KEY one of ``keys`` (dashes read as underscores), each value a
    whole number, a number, none or default (None), true or false, else the text itself."""
    key, eq, values = text.partition("=")
    key = key.strip().replace("-", "_")
    if not eq or key not in keys:
        raise ConfigError(f"{text!r}: write KEY=V1,V2,... with KEY one of {', '.join(keys)}", "--sweep")
    out = []
    for v in values.split(","):
        v = v.strip()
        try:
            out.append(int(v) if v.lstrip("-").isdigit() else float(v))
        except ValueError:
            out.append({"none": None, "default": None, "true": True, "false": False}.get(v.lower(), v))
    if not out or out == [""]:
        raise ConfigError("no values given", "--sweep")
    return key, out


def add_file_arguments(p, files: str, command: str) -> None:
    """The flags of a command that writes ``files`` and prints results: ``--out`` (their folder, default
    ./distlab-out), ``--no-files`` and ``--json`` (schema ``distlab.COMMAND/N``)."""
    p.add_argument("--out", default="distlab-out", help=f"folder for {files} (default ./distlab-out)")
    p.add_argument("--no-files", action="store_true", help=f"write no files ({files})")
    p.add_argument("--json", action="store_true", help=f"print results as JSON (schema {schema(command)})")


class Progress:
    """Long work's progress on stderr, once it has run ``delay_s`` seconds (a short task says nothing): on a
    terminal a rich bar; elsewhere (a log, a pipe, CI) a line per unit of work with the time elapsed,
    ``cluster --sweep: 3 of 8 done, 12.4 s elapsed`` (a line per twentieth when there are over 40 units).

        bar = Progress(len(cases), "cluster --sweep")
        for i, case in enumerate(cases):
            run(case)
            bar.update(i + 1)
        bar.close()

    ``progress(iterable, total, label)`` wraps a loop the same way; ``bar.update`` is the ``progress(done,
    total)`` callback sim/workers.py run_many takes. Nothing when ``enabled`` is false (--json)."""

    def __init__(self, total: int, label: str, enabled: bool = True, delay_s: float = 2.0):
        import time
        self.total, self.label, self.enabled, self.delay_s = total, label, enabled, delay_s
        self.start, self.bar, self.task, self.last_line = time.monotonic(), None, None, -1
        self.tty = sys.stderr.isatty()

    def elapsed(self) -> float:
        import time
        return time.monotonic() - self.start

    def update(self, done: int, total: int | None = None) -> None:
        if total is not None:
            self.total = total
        if not self.enabled or self.elapsed() < self.delay_s:
            return
        if self.tty:
            if self.bar is None:
                from rich.console import Console
                from rich.progress import Progress as Bar
                self.bar = Bar(console=Console(file=raw_stream(sys.stderr)), transient=True)   # not escaped
                self.bar.start()
                self.task = self.bar.add_task(self.label, total=self.total)
            self.bar.update(self.task, completed=done)
            return
        step = 1 if self.total <= 40 else max(1, self.total // 20)
        if done // step > self.last_line // step or done == self.total and self.last_line != done:
            self.last_line = done
            sys.stderr.write(f"{self.label}: {done} of {self.total} done, {self.elapsed():.1f} s elapsed\n")
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def progress(iterable, total: int, description: str, enabled: bool = True, delay_s: float = 2.0):
    """``iterable``'s items, reporting each one done through Progress (a bar on a terminal, else a line per unit
    with the time elapsed), once the loop has run ``delay_s`` seconds."""
    bar = Progress(total, description, enabled, delay_s)
    try:
        for done, item in enumerate(iterable):
            yield item
            bar.update(done + 1)
    finally:
        bar.close()


class working:
    """``with working("drawing 4096 transfers"):`` a spinner on stderr if the step lasts over ``delay_s``
    seconds (nothing for a quick step, or when stderr is not a terminal)."""

    def __init__(self, description: str, delay_s: float = 2.0):
        self.description, self.delay_s, self.status, self.timer = description, delay_s, None, None
        self.done = False

    def _show(self):
        if self.done:
            return
        from rich.console import Console
        self.status = Console(file=raw_stream(sys.stderr)).status(self.description)
        self.status.start()

    def __enter__(self):
        if sys.stderr.isatty():
            import threading
            self.timer = threading.Timer(self.delay_s, self._show)
            self.timer.daemon = True
            self.timer.start()
        return self

    def __exit__(self, *exc):
        self.done = True
        if self.timer is not None:
            self.timer.cancel()
        if self.status is not None:
            self.status.stop()
        return False


def run_command(module, args) -> int:
    from distlab.sim import files
    _running.append(module.NAME)
    files.LOCKING[0] += 1               # check_output locks each output until this command ends (sim/files.py)
    streams = sys.stdout, sys.stderr
    if files.LOCKING[0] == 1:           # names from files print escaped (sim/output.py printable)
        sys.stdout, sys.stderr = EscapingStream(sys.stdout), EscapingStream(sys.stderr)
    saved = OutputStyle(STYLE.verbose, STYLE.wide)
    STYLE.verbose, STYLE.wide = bool(getattr(args, "verbose", False)), bool(getattr(args, "wide", False))
    try:
        rc = module.run(args)
        return 0 if rc is None else int(rc)
    except ConfigError as e:
        sys.stderr.write(f"distlab {module.NAME}: error: {e}\n")
        return 2
    except OutputError as e:            # a disk fault at the end: one line, and where the result was kept
        sys.stderr.write(f"distlab {module.NAME}: error: {e}\n")
        return 1
    except KeyboardInterrupt as e:      # SIGTERM arrives as KeyboardInterrupt("SIGTERM") (runtime/ranks/launch.py)
        if e.args and e.args[0] == "SIGTERM":
            sys.stderr.write(f"distlab {module.NAME}: terminated\n")
            return 143                  # 128 + SIGTERM, as shells report a process SIGTERM ended
        sys.stderr.write(f"distlab {module.NAME}: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    finally:
        _running.pop()
        files.LOCKING[0] -= 1
        if not files.LOCKING[0]:
            files.release_held()
            sys.stdout, sys.stderr = streams
        STYLE.verbose, STYLE.wide = saved.verbose, saved.wide


class RowPrinter:
    """A table printed row by row as results arrive, in nccl-tests' layout: '#' header lines (names, then
    units), then right-aligned columns, flushed after each row (so a long sweep shows each size as it ends).
    ``columns``: (name, unit, width) triples."""

    def __init__(self, columns: list[tuple[str, str, int]], out=None):
        self.columns, self.out = columns, out or sys.stdout

    def comment(self, text: str) -> None:
        """'# text', wrapped at words to WIDTH columns (each line a '#' comment, as nccl-tests')."""
        lines = [f"# {text}"] if STYLE.wide else textwrap.wrap(text, WIDTH, initial_indent="# ",
                                                               subsequent_indent="#   ", break_on_hyphens=False)
        self.out.write("".join(line + "\n" for line in lines))

    def header(self) -> None:
        for part in (0, 1):
            cells = [f"{c[part]:>{c[2]}}" for c in self.columns]
            self.out.write("#" + "  ".join(cells)[1:] + "\n")
        self.out.flush()

    def row(self, values: list) -> None:
        self.out.write("  ".join(f"{str(v):>{c[2]}}" for v, c in zip(values, self.columns)) + "\n")
        self.out.flush()


# nccl-tests' columns (src/util.cu), a little narrower than its own so that a row with the algorithm and protocol
# (`collective`) or the op and spread (`bench`) fits 100 columns
NCCL_COLUMNS = [("size", "(B)", 11), ("count", "(elements)", 11), ("type", "", 8), ("redop", "", 5),
                ("root", "", 4)]
BW_COLUMNS = [("time", "(us)", 9), ("algbw", "(GB/s)", 7), ("busbw", "(GB/s)", 7)]


def nccl_fields(op: str, nbytes: int, dtype: str, root: int | None = None) -> dict:
    """nccl-tests' first columns for one case: size (B), count (elements of ``dtype`` in it), type, redop
    (sum for reductions, none otherwise) and root (-1 when the collective has none), as in nccl-tests'
    writeBenchmarkLinePreamble (src/util.cu)."""
    from distlab.sim.plan import DTYPE_BYTES
    rooted = op in ("broadcast", "reduce")
    return {"bytes": nbytes, "count": nbytes // DTYPE_BYTES[dtype], "type": dtype,
            "redop": "sum" if op in ("all_reduce", "reduce_scatter", "reduce") else "none",
            "root": (root or 0) if rooted else -1}


def nccl_cells(row: dict) -> list:
    """The NCCL_COLUMNS + BW_COLUMNS cells of a result row (bytes, count, type, redop, root, time_s, ...)."""
    widths = [c[2] for c in BW_COLUMNS]
    return [row["bytes"], row["count"], row["type"], row["redop"], row["root"],
            number(row["time_s"] * 1e6, widths[0]), number(row["algbw_GBps"], widths[1]),
            number(row["busbw_GBps"], widths[2])]


def number(x: float, width: int, digits: int = 2) -> str:
    """``x`` with ``digits`` decimals, fewer when that is wider than ``width`` (a 1.5 s collective is 1500000.0
    us, not 1500000.00: its row keeps 100 columns)."""
    for d in range(digits, -1, -1):
        text = f"{x:.{d}f}"
        if len(text) <= width:
            return text
    return text
