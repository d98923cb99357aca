"""What every `distlab` subcommand shares: a parser that reports bad flags in one line, tables, JSON."""
from __future__ import annotations

import argparse
import json
import sys

from distlab.sim.errors import ConfigError, OutputError


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr and exit code 2 (no usage dump)."""

    def error(self, message: str):
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


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


def print_table(title: str | None, columns: list[str], rows: list[list], justify_left: int = 1) -> None:
    """A plain table through rich (no colours when stdout is not a terminal)."""
    from rich.console import Console
    from rich.table import Table
    table = Table(title=title, box=None, header_style="bold", title_justify="left", pad_edge=False)
    for i, c in enumerate(columns):
        table.add_column(c, justify="left" if i < justify_left else "right", no_wrap=True)
    for r in rows:
        table.add_row(*[str(x) for x in r])
    Console(width=200, soft_wrap=True).print(table)


def progress(iterable, total: int, description: str, enabled: bool = True, delay_s: float = 2.0):
    """A rich progress bar on stderr for long loops, shown once the loop has run ``delay_s`` seconds (a short
    loop shows nothing); silent when disabled or stderr is not a terminal."""
    if not enabled or not sys.stderr.isatty():
        yield from iterable
        return
    import time
    start, bar, task = time.monotonic(), None, None
    try:
        for done, item in enumerate(iterable):
            if bar is None and time.monotonic() - start > delay_s:
                from rich.console import Console
                from rich.progress import Progress
                bar = Progress(console=Console(stderr=True), transient=True)
                bar.start()
                task = bar.add_task(description, total=total, completed=done)
            yield item
            if bar is not None:
                bar.advance(task)
    finally:
        if bar is not None:
            bar.stop()


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
        self.status = Console(stderr=True).status(self.description)
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
    _running.append(module.NAME)
    try:
        rc = module.run(args)
        return 0 if rc is None else int(rc)
    except ConfigError as e:
        sys.stderr.write(f"distlab {module.NAME}: error: {e}\n")
        return 2
    except OutputError as e:            # a disk fault at the end: one line, and where the result was kept
        sys.stderr.write(f"distlab {module.NAME}: error: {e}\n")
        return 1
    except KeyboardInterrupt as e:      # SIGTERM arrives as KeyboardInterrupt("SIGTERM") (runtime/launch.py)
        if e.args and e.args[0] == "SIGTERM":
            sys.stderr.write(f"distlab {module.NAME}: terminated\n")
            return 143                  # 128 + SIGTERM, as shells report a process SIGTERM ended
        sys.stderr.write(f"distlab {module.NAME}: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    finally:
        _running.pop()


class RowPrinter:
    """A table printed row by row as results arrive, in nccl-tests' layout: '#' header lines (names, then
    units), then right-aligned columns, flushed after each row (so a long sweep shows each size as it ends).
    ``columns``: (name, unit, width) triples."""

    def __init__(self, columns: list[tuple[str, str, int]], out=None):
        self.columns, self.out = columns, out or sys.stdout

    def comment(self, text: str) -> None:
        self.out.write(f"# {text}\n")

    def header(self) -> None:
        for part in (0, 1):
            cells = [f"{c[part]:>{c[2]}}" for c in self.columns]
            self.out.write("#" + "  ".join(cells)[1:] + "\n")
        self.out.flush()

    def row(self, values: list) -> None:
        self.out.write("  ".join(f"{str(v):>{c[2]}}" for v, c in zip(values, self.columns)) + "\n")
        self.out.flush()


NCCL_COLUMNS = [("size", "(B)", 12), ("count", "(elements)", 12), ("type", "", 8), ("redop", "", 6),
                ("root", "", 6)]
BW_COLUMNS = [("time", "(us)", 9), ("algbw", "(GB/s)", 8), ("busbw", "(GB/s)", 8)]


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
    return [row["bytes"], row["count"], row["type"], row["redop"], row["root"], f"{row['time_s'] * 1e6:.2f}",
            f"{row['algbw_GBps']:.2f}", f"{row['busbw_GBps']:.2f}"]
