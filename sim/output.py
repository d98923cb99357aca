"""How distlab prints: every line within WIDTH = 100 columns, a summary first and detail on request.

    print_table("buckets", ["bucket", "MiB"], rows, max_rows=LONG_TABLE)   # 20 of 400 rows; --verbose: all
    note("ready: the bucket's last gradient is computed")                   # '  (ready: ...)', wrapped

Output reads at a glance (issue 33): tables wrap their text columns and never their numbers, leave out the
columns that still do not fit and name them (``--wide``: as wide as they need); a table that grows with the
model or the world shows its first and last rows and says how many it left out (``--verbose``: all); notes and
long lines wrap at words. The flags are each command's (``add_output_arguments``); sim/cli.py's
``run_command`` puts them in ``STYLE`` for these printers.
"""
from __future__ import annotations

import re
import sys
import textwrap
from dataclasses import dataclass

WIDTH = 100             # columns of every printed line unless --wide
LONG_TABLE = 20         # rows a growing table shows without --verbose: the first 16 and the last 4


@dataclass
class OutputStyle:
    """What the command's --verbose and --wide asked for (set by run_command)."""
    verbose: bool = False
    wide: bool = False


STYLE = OutputStyle()

# Names come from files (a plan's, a cluster's, a job's): printed raw, "\x1b[2J" would clear the terminal and an
# OSC sequence retitle it. While a command runs, its stdout and stderr escape every control character but newline
# and tab (C0, DEL, C1) and the bidirectional overrides that reorder what a line shows (CVE-2021-42574), as
# Python's repr writes them: "\x1b[2J". distlab's own progress bars (rich) write to the raw stream.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\x1b``, ``\u202e``); newline and tab kept."""
    return _CONTROLS.sub(lambda m: repr(m.group())[1:-1], text)


class EscapingStream:
    """A text stream that writes ``printable(text)`` to ``raw`` (its other attributes are raw's)."""

    def __init__(self, raw):
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(printable(text))
        return len(text)

    def __getattr__(self, name):
        return getattr(self.raw, name)


def raw_stream(stream):
    """The stream under an EscapingStream (for rich's progress bars), else ``stream``."""
    return stream.raw if isinstance(stream, EscapingStream) else stream


def add_output_arguments(p, verbose: bool = True) -> None:
    """``--verbose`` (every row of long tables; skip it where the command already has one) and ``--wide``."""
    if verbose:
        p.add_argument("-v", "--verbose", action="store_true",
                       help=f"print every row of long tables (default: the first and last of {LONG_TABLE})")
    p.add_argument("--wide", action="store_true", help=f"let tables be as wide as they need (default: wrap to "
                                                       f"{WIDTH} columns)")


def say(text: str = "", indent: str = "", first: str = "") -> None:
    """Print ``text`` wrapped at words to WIDTH columns (unless --wide): ``first`` before its first line,
    ``indent`` before the others."""
    if STYLE.wide or len(first) + len(text) <= WIDTH:
        print(first + text)
        return
    print("\n".join(textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=indent,
                                   break_on_hyphens=False, break_long_words=False)))


def wrapped(text: str, indent: str = "  ") -> str:
    """``text`` wrapped at words to WIDTH columns, later lines indented, ending in a newline: for warnings on
    stderr (errors stay one line)."""
    return "\n".join(textwrap.wrap(text, WIDTH, subsequent_indent=indent, break_on_hyphens=False,
                                    break_long_words=False)) + "\n"


def note(text: str) -> None:
    """An explanation under a table: ``  (text)``, wrapped."""
    say(f"({text})", indent="   ", first="  ")


def elide(rows: list, max_rows: int | None) -> tuple[list, int]:
    """(rows to show, how many were left out): without --verbose, a table of more than ``max_rows`` rows keeps
    its first ``max_rows - 4`` and last 4, with a row of '...' between them."""
    if max_rows is None or STYLE.verbose or len(rows) <= max_rows:
        return list(rows), 0
    head, tail = max_rows - 4, 4
    width = len(rows[0]) if rows else 1
    return list(rows[:head]) + [["..."] * width] + list(rows[-tail:]), len(rows) - head - tail


MIN_WRAPPED = 16        # a wrapped text column keeps at least this many columns


def fit_columns(columns: list[str], rows: list[list], wrappable: list[bool], width: int | None = WIDTH,
                constant: list[bool] | None = None) -> tuple[list[int | None], list[int]]:
    """(each column's width cap, None = its natural width; the indices of the columns left out) so that the
    table fits ``width`` columns (two spaces between columns): columns whose every row is the same
    (``constant``; the caller says their value once) are left out first, from the right; then the widest
    wrappable column is narrowed (water-filling, none below MIN_WRAPPED); if that is not enough, columns are
    left out from the right (never the first). ``width`` None: no limit."""
    natural = [max([len(c)] + [len(str(r[i])) for r in rows]) for i, c in enumerate(columns)]
    caps: list[int | None] = [None] * len(columns)
    if width is None:
        return caps, []
    kept = list(range(len(columns)))

    def total():
        return sum(caps[i] or natural[i] for i in kept) + 2 * (len(kept) - 1)
    for i in reversed(range(1, len(columns))):
        if total() > width and constant and constant[i]:
            kept.remove(i)
    while total() > width:
        shrink = [i for i in kept if wrappable[i] and (caps[i] or natural[i]) > MIN_WRAPPED]
        if shrink:
            widest = max(shrink, key=lambda i: caps[i] or natural[i])
            caps[widest] = max(MIN_WRAPPED, (caps[widest] or natural[widest]) - (total() - width))
            continue
        if len(kept) == 1:
            break
        kept.pop()
    return caps, [i for i in range(len(columns)) if i not in kept]


BOUNDARY = "-_./,:"     # where a name may be cut: between its words (llama3-8b-tp-fsdp-a, node lists 0-15,16-31)


def shorten(token: str, width: int) -> str:
    """``token`` in at most ``width`` columns: whole if it fits, else its first and last words (split after
    each of BOUNDARY) around an ellipsis, never cutting a word: 'llama3-8b-tp-fsdp-a' in 16 -> 'llama3-…fsdp-a'
    (the end kept first: it tells similar names apart). A first word wider than ``width`` is cut (nothing else
    would fit)."""
    import re
    if len(token) <= width:
        return token
    words = re.findall(rf"[^{re.escape(BOUNDARY)}]*[{re.escape(BOUNDARY)}]?", token)[:-1] or [token]
    head, tail, i, j = "", "", 0, len(words) - 1
    while i <= j:
        if len(head) + len(tail) + len(words[j]) + 1 <= width:
            tail, j = words[j] + tail, j - 1
        else:
            break
        if i <= j and len(head) + len(tail) + len(words[i]) + 1 <= width:
            head, i = head + words[i], i + 1
    if not head and not tail:
        return token[:width - 1] + "…"
    return head + "…" + tail


def shorten_cell(text: str, width: int | None) -> str:
    """Every space-separated word of a cell shortened to ``width`` (``shorten``), so that wrapping never splits
    one."""
    if width is None or len(text) <= width:
        return text
    return " ".join(shorten(word, width) for word in text.split(" "))


def print_table(title: str | None, columns: list[str], rows: list[list], justify_left: int = 1,
                max_rows: int | None = None) -> None:
    """A plain table through rich (no colours when stdout is not a terminal): the first ``justify_left``
    columns left-aligned, the others right-aligned. It fits WIDTH columns unless --wide (``fit_columns``: a
    column the same in every row is said once above the table and left out first;
    columns of text wrap, numbers never; what still does not fit is left out and named). ``max_rows``: a table
    that grows with the model or the world shows that many rows without --verbose (``elide``), and says how
    many it left out."""
    from rich.console import Console
    from rich.table import Table
    if title:
        say(title)
    shown, left_out = elide([[str(x) for x in r] for r in rows], max_rows)
    wrappable = [i < justify_left or any(" " in r[i] for r in shown) for i in range(len(columns))]
    full = [[str(x) for x in r] for r in rows]
    constant = [len(full) > 1 and len({r[i] for r in full}) == 1 for i in range(len(columns))]
    caps, dropped = fit_columns(columns, shown, wrappable, None if STYLE.wide else WIDTH, constant)
    kept = [i for i in range(len(columns)) if i not in dropped]
    shown = [[shorten_cell(r[i], caps[i]) if i < len(r) else "" for i in range(len(columns))] for r in shown]
    table = Table(box=None, header_style="bold", pad_edge=False)
    for i in kept:
        table.add_column(columns[i], justify="left" if i < justify_left else "right", no_wrap=caps[i] is None,
                         overflow="fold", max_width=caps[i])
    for r in shown:
        table.add_row(*[r[i] for i in kept])
    same = [i for i in dropped if constant[i]]
    if same:                            # a header line: what every row shares, said once above them
        values = [f"{columns[i] or '(unnamed)'} {full[0][i]}" for i in same]
        note(f"the same in every row: {', '.join(values)}")
    import io
    buffer = io.StringIO()
    Console(file=buffer, width=100_000 if STYLE.wide else WIDTH, soft_wrap=False, force_terminal=False,
            color_system=None).print(table)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines()))
    if left_out:
        note(f"{left_out} of {len(rows)} rows left out; --verbose prints them all")
    other = [i for i in dropped if not constant[i]]
    if other:
        note(f"left out to fit {WIDTH} columns: {', '.join(columns[i] or '(unnamed)' for i in other)}; --wide "
             "shows them")
