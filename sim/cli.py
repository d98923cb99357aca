"""What every `distlab` subcommand shares: a parser that reports bad flags in one line, tables, JSON."""
from __future__ import annotations

import argparse
import json
import sys

from distlab.sim.errors import ConfigError


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr and exit code 2 (no usage dump)."""

    def error(self, message: str):
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def fail(message: str, code: int = 2):
    """Print one line and exit: for bad input found after parsing."""
    sys.stderr.write(f"distlab: error: {message}\n")
    sys.exit(code)


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")


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


def progress(iterable, total: int, description: str, enabled: bool = True):
    """A rich progress bar on stderr for long loops; silent when disabled or stderr is not a terminal."""
    if not enabled or not sys.stderr.isatty():
        yield from iterable
        return
    from rich.console import Console
    from rich.progress import Progress
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        for item in iterable:
            yield item
            bar.advance(task)


def run_command(module, args) -> int:
    try:
        rc = module.run(args)
        return 0 if rc is None else int(rc)
    except ConfigError as e:
        sys.stderr.write(f"distlab {module.NAME}: error: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"distlab {module.NAME}: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
